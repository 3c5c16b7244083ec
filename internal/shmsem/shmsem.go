// Package shmsem finds the POSIX named semaphores a set of processes has
// mapped, so that whoever kills them can unlink the names their Python
// resource tracker would have (see Mapped).
package shmsem

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// Mapped is the POSIX named semaphores (/dev/shm/sem.*) that pids
// have mapped and that still have a name. Python's multiprocessing names
// one for each lock and queue it makes under spawn and forkserver (torch
// 1.13's error queues among them) and leaves their unlinking to its
// resource tracker: a pod killed together with its tracker would leave
// them in the machine's /dev/shm for good. A Kubernetes pod's /dev/shm
// goes with the pod; the local engine's pods share the machine's, so the
// engine unlinks them (unlinkSemaphores) once the pod's processes are gone.
//
// glibc's sem_open maps a temporary file and links it under the name, so
// a process's maps show the temporary name, deleted: the names are found
// by the mapped files' device and inode.
func Mapped(pids []int) []string {
	type file struct{ dev, ino uint64 }
	mapped := map[file]bool{}
	for _, pid := range pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
		if err != nil {
			continue
		}
		for line := range strings.SplitSeq(string(b), "\n") {
			// address perms offset major:minor inode path
			f := strings.Fields(line)
			if len(f) < 6 || !strings.HasPrefix(f[5], "/dev/shm/sem.") {
				continue
			}
			major, minor, ok := strings.Cut(f[3], ":")
			ma, err1 := strconv.ParseUint(major, 16, 32)
			mi, err2 := strconv.ParseUint(minor, 16, 32)
			ino, err3 := strconv.ParseUint(f[4], 10, 64)
			if ok && err1 == nil && err2 == nil && err3 == nil {
				mapped[file{unix.Mkdev(uint32(ma), uint32(mi)), ino}] = true
			}
		}
	}
	if len(mapped) == 0 {
		return nil
	}
	entries, err := os.ReadDir("/dev/shm")
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), "sem.") {
			continue
		}
		path := filepath.Join("/dev/shm", e.Name())
		var st syscall.Stat_t
		if syscall.Lstat(path, &st) == nil && mapped[file{st.Dev, st.Ino}] {
			out = append(out, path)
		}
	}
	return out
}

// Unlink removes the named semaphores Mapped found, once
// nothing of the pod that mapped them runs (a name already gone is fine:
// the tracker got there first).
func Unlink(paths []string) {
	for _, p := range paths {
		_ = os.Remove(p)
	}
}

// Group is the processes of process group pgid, found in /proc.
func Group(pgid int) []int {
	var out []int
	for _, p := range procs() {
		if p.pgrp == pgid {
			out = append(out, p.pid)
		}
	}
	return out
}

// Tree is pid and every process below it, found in /proc (a process may
// start its children in process groups of their own, which Group misses).
func Tree(pid int) []int {
	children := map[int][]int{}
	for _, p := range procs() {
		children[p.ppid] = append(children[p.ppid], p.pid)
	}
	out := []int{pid}
	for i := 0; i < len(out); i++ {
		out = append(out, children[out[i]]...)
	}
	return out
}

// proc is a process's ids as /proc/PID/stat gives them.
type proc struct{ pid, ppid, pgrp int }

// procs is every process now: the fields after the parenthesised command
// (which may itself hold spaces and parentheses) are state, ppid, pgrp.
func procs() []proc {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []proc
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) < 3 {
			continue
		}
		ppid, err1 := strconv.Atoi(f[1])
		pgrp, err2 := strconv.Atoi(f[2])
		if err1 == nil && err2 == nil {
			out = append(out, proc{pid, ppid, pgrp})
		}
	}
	return out
}

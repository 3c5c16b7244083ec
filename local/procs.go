package local

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kfelastic/kfelastic/internal/shmsem"
)

// Processes of a pod are found the way a node agent would: the pod's
// cgroup lists them where there is one; otherwise, and in addition, the
// agent's descendants in /proc (the agent's workers and checks run in
// process groups of their own, so the agent's group alone misses them).

// descendants returns pid and every process below it.
func descendants(pid int) []int { return shmsem.Tree(pid) }

// environ is a process's initial environment (what it was exec'd with).
func environ(pid int) map[string]string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	if err != nil {
		return nil
	}
	env := map[string]string{}
	for kv := range bytes.SplitSeq(b, []byte{0}) {
		if k, v, ok := strings.Cut(string(kv), "="); ok {
			env[k] = v
		}
	}
	return env
}

// killAll sends sig to every pid, ignoring those already gone.
func killAll(pids []int, sig syscall.Signal) {
	for _, p := range pids {
		_ = syscall.Kill(p, sig)
	}
}

// readPids reads a cgroup.procs file.
func readPids(path string) []int {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	var out []int
	for f := range strings.FieldsSeq(string(b)) {
		if p, err := strconv.Atoi(f); err == nil {
			out = append(out, p)
		}
	}
	return out
}

// Limits is how this machine enforces a pod's memory and CPU.
type Limits struct {
	// Mode is "cgroup v2", "cgroup v1" or "rlimit" (RLIMIT_AS per process:
	// no pod-wide memory, no OOM kill, no CPU throttling).
	Mode string
	// root is the job's cgroup folder per hierarchy (v2: one; v1: memory
	// and cpu).
	mem, cpu string
}

// NewLimits finds the best way to limit pods here and makes the job's
// cgroup under name: cgroup v2 with the memory and cpu controllers, else
// the v1 memory and cpu hierarchies, else RLIMIT_AS.
func NewLimits(name string) *Limits {
	for _, root := range []string{"/sys/fs/cgroup", "/sys/fs/cgroup/memory", "/sys/fs/cgroup/cpu"} {
		sweep(root)
	}
	if ctrl, err := os.ReadFile("/sys/fs/cgroup/cgroup.controllers"); err == nil && strings.Contains(string(ctrl), "memory") {
		dir := filepath.Join("/sys/fs/cgroup", name)
		if os.Mkdir(dir, 0o755) == nil {
			// Children get memory and cpu; a cgroup with controllers for its
			// children must hold no process itself (it holds none).
			_ = os.WriteFile(filepath.Join(dir, "cgroup.subtree_control"), []byte("+memory +cpu"), 0o644)
			return &Limits{Mode: "cgroup v2", mem: dir, cpu: dir}
		}
	}
	mem, cpu := filepath.Join("/sys/fs/cgroup/memory", name), filepath.Join("/sys/fs/cgroup/cpu", name)
	if os.Mkdir(mem, 0o755) == nil {
		l := &Limits{Mode: "cgroup v1", mem: mem}
		if os.Mkdir(cpu, 0o755) == nil {
			l.cpu = cpu
		}
		return l
	}
	return &Limits{Mode: "rlimit"}
}

// sweep removes what earlier jobs left under root: a job's cgroups can
// outlive it while a killed pod's last zombie waits for init to reap it
// (Remove gives up after 5 s). Only cgroups without a process, of jobs
// older than a minute, are removed; rmdir refuses any other.
func sweep(root string) {
	jobs, _ := os.ReadDir(root)
	for _, j := range jobs {
		info, err := j.Info()
		if !j.IsDir() || !strings.HasPrefix(j.Name(), "kfelastic-") || err != nil || time.Since(info.ModTime()) < time.Minute {
			continue
		}
		dir := filepath.Join(root, j.Name())
		pods, _ := os.ReadDir(dir)
		for _, p := range pods {
			if p.IsDir() && len(readPids(filepath.Join(dir, p.Name(), "cgroup.procs"))) == 0 {
				_ = os.Remove(filepath.Join(dir, p.Name()))
			}
		}
		_ = os.Remove(dir)
	}
}

// Cgroup is one pod's cgroup(s); the zero value (rlimit mode) has none.
type Cgroup struct {
	v2       bool
	mem, cpu string
}

// Pod makes a pod's cgroup with its memory limit (0: none).
func (l *Limits) Pod(pod string, memory int64) (*Cgroup, error) {
	c := &Cgroup{v2: l.Mode == "cgroup v2"}
	if l.mem == "" {
		return c, nil
	}
	c.mem = filepath.Join(l.mem, pod)
	if err := os.Mkdir(c.mem, 0o755); err != nil && !os.IsExist(err) {
		return nil, err
	}
	if l.cpu != "" && l.cpu != l.mem {
		c.cpu = filepath.Join(l.cpu, pod)
		if err := os.Mkdir(c.cpu, 0o755); err != nil && !os.IsExist(err) {
			return nil, err
		}
	} else if c.v2 {
		c.cpu = c.mem
	}
	if memory > 0 {
		if c.v2 {
			if err := write(c.mem, "memory.max", memory); err != nil {
				return nil, err
			}
			_ = write(c.mem, "memory.swap.max", 0)
			// The whole pod dies of an OOM kill, as a Kubernetes container
			// does (kubelet sets memory.oom.group since 1.28).
			_ = write(c.mem, "memory.oom.group", 1)
		} else {
			if err := write(c.mem, "memory.limit_in_bytes", memory); err != nil {
				return nil, err
			}
			_ = write(c.mem, "memory.memsw.limit_in_bytes", memory)
		}
	}
	return c, nil
}

func write(dir, file string, v int64) error {
	return os.WriteFile(filepath.Join(dir, file), []byte(strconv.FormatInt(v, 10)), 0o644)
}

// ProcsFiles are the files a process writes its pid to to join the pod.
func (c *Cgroup) ProcsFiles() []string {
	var out []string
	if c.mem != "" {
		out = append(out, filepath.Join(c.mem, "cgroup.procs"))
	}
	if c.cpu != "" && c.cpu != c.mem {
		out = append(out, filepath.Join(c.cpu, "cgroup.procs"))
	}
	return out
}

// Procs lists the pod's processes by its cgroup (nil without one).
func (c *Cgroup) Procs() []int {
	if c.mem == "" {
		return nil
	}
	return readPids(filepath.Join(c.mem, "cgroup.procs"))
}

// OOMKills is the kernel's count of OOM kills in the pod's cgroup.
func (c *Cgroup) OOMKills() int64 {
	if c.mem == "" {
		return 0
	}
	file, key := "memory.events", "oom_kill"
	if !c.v2 {
		file = "memory.oom_control"
	}
	b, err := os.ReadFile(filepath.Join(c.mem, file))
	if err != nil {
		return 0
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if k, v, ok := strings.Cut(line, " "); ok && k == key {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	return 0
}

// Throttle limits the pod to share of one CPU; false without a cpu cgroup.
func (c *Cgroup) Throttle(share float64) bool {
	if c.cpu == "" {
		return false
	}
	const period = 100000
	quota := int64(share * period)
	if c.v2 {
		return os.WriteFile(filepath.Join(c.cpu, "cpu.max"), fmt.Appendf(nil, "%d %d", quota, period), 0o644) == nil
	}
	return write(c.cpu, "cpu.cfs_period_us", period) == nil && write(c.cpu, "cpu.cfs_quota_us", quota) == nil
}

// Remove deletes the pod's cgroups once its processes are gone (retried:
// the kernel frees a cgroup a moment after its last process).
func (c *Cgroup) Remove() {
	for _, d := range []string{c.mem, c.cpu} {
		if d != "" {
			_ = os.Remove(d)
		}
	}
}

// Remove deletes the job's cgroups and what is left of its pods' (the
// kernel frees a cgroup a moment after its last process: retried for 5 s).
func (l *Limits) Remove() {
	for range 50 {
		left := 0
		for _, d := range []string{l.mem, l.cpu} {
			if d == "" {
				continue
			}
			pods, _ := os.ReadDir(d)
			for _, p := range pods {
				if p.IsDir() {
					_ = os.Remove(filepath.Join(d, p.Name()))
				}
			}
			if err := os.Remove(d); err != nil && !os.IsNotExist(err) {
				left++
			}
		}
		if left == 0 {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// splitTrackers parts pids into Python multiprocessing's resource trackers
// and the rest. A tracker outlives the process it serves by the time it
// takes to unlink that process's semaphores (it ignores SIGTERM and
// SIGINT, and ends when its pipe closes): killed with it, it leaves them
// in /dev/shm, where nothing of the pod maps them any more.
func splitTrackers(pids []int) (trackers, others []int) {
	for _, pid := range pids {
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); err == nil && bytes.Contains(b, []byte("multiprocessing.resource_tracker")) {
			trackers = append(trackers, pid)
		} else {
			others = append(others, pid)
		}
	}
	return trackers, others
}

// awaitTrackers waits, up to limit, for the trackers to exit (or be
// zombies).
func awaitTrackers(trackers []int, limit time.Duration) {
	for end := time.Now().Add(limit); len(trackers) > 0 && time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		trackers = slices.DeleteFunc(trackers, func(pid int) bool {
			st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
			return err != nil || bytes.Contains(st, []byte(") Z "))
		})
	}
}

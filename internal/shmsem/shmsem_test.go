package shmsem

import (
	"bufio"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A pod killed together with its Python resource tracker leaves the named
// semaphores of its spawn-context locks in /dev/shm (torch 1.13's error
// queues are such): the engine finds them in the pod's memory maps before
// the kill and unlinks them after. Real Python multiprocessing; the
// "pod" is a process group (Group finds it), killed as a whole.
func TestKilledGroupsSemaphoresAreUnlinked(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("no python3 on PATH")
	}
	cmd := exec.Command(py, "-c", `
import multiprocessing as mp, sys, time
ctx = mp.get_context("spawn")
locks = [ctx.Lock() for _ in range(2)]
print(" ".join(l._semlock.name for l in locks), flush=True)
time.sleep(60)
`)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); _ = cmd.Wait() }()
	line := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		sc.Scan()
		line <- sc.Text()
	}()
	var names []string
	select {
	case l := <-line:
		names = strings.Fields(l)
	case <-time.After(30 * time.Second):
		t.Fatal("python printed no semaphore names")
	}
	var want []string
	for _, n := range names {
		want = append(want, "/dev/shm/sem."+strings.TrimPrefix(n, "/"))
	}
	got := Mapped(Group(cmd.Process.Pid))
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) || len(want) != 2 {
		t.Fatalf("semaphores %v, want %v", got, want)
	}
	// The group, tracker included, dies at once: nobody unlinks them.
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	_ = cmd.Wait()
	for _, p := range want {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("%s gone with the kill (%v): the leak this guards against did not happen", p, err)
		}
	}
	Unlink(got)
	for _, p := range want {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s still there after Unlink (%v)", p, err)
		}
	}
}

package local

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
// "pod" is a process group killed as killPod kills one.
func TestKilledPodsSemaphoresAreUnlinked(t *testing.T) {
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
	got := semaphores(descendants(cmd.Process.Pid))
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
	unlinkSemaphores(got)
	for _, p := range want {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s still there after unlinkSemaphores (%v)", p, err)
		}
	}
}

// A pod whose main process ends leaves its resource tracker unlinking the
// semaphores: the engine finds the tracker, kills the rest first, and
// gives the tracker its moment, after which nothing is left in /dev/shm.
func TestResourceTrackerFinishesBeforeTheKill(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("no python3 on PATH")
	}
	cmd := exec.Command(py, "-c", `
import multiprocessing as mp, time
lock = mp.get_context("spawn").Lock()
print(lock._semlock.name, flush=True)
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
	sc := bufio.NewScanner(out)
	if !sc.Scan() {
		t.Fatal("python printed no semaphore name")
	}
	path := "/dev/shm/sem." + strings.TrimPrefix(sc.Text(), "/")
	trackers, others := splitTrackers(descendants(cmd.Process.Pid))
	if len(trackers) != 1 || len(others) != 1 || others[0] != cmd.Process.Pid {
		t.Fatalf("trackers %v, others %v, want one tracker and python %d", trackers, others, cmd.Process.Pid)
	}
	killAll(others, syscall.SIGKILL)
	_ = cmd.Wait()
	start := time.Now()
	awaitTrackers(trackers, 5*time.Second)
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("%s still there %v after the tracker's process died (%v)", path, time.Since(start), err)
	}
	t.Logf("the tracker unlinked it and exited %v after its process died", time.Since(start).Round(time.Millisecond))
}

package local

import (
	"bufio"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

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

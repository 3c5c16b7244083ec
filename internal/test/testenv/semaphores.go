package testenv

import (
	"bufio"
	"fmt"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// PythonHoldingSemaphores starts python3 in a process group of its own
// holding n locks of multiprocessing's spawn context: n POSIX named
// semaphores whose unlinking is left to its resource tracker (a child in
// the same group). It returns the process and the semaphores' paths
// (/dev/shm/sem.*); the group is killed when the test ends. Skips without
// python3.
func PythonHoldingSemaphores(t testing.TB, n int) (*exec.Cmd, []string) {
	t.Helper()
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("no python3 on PATH")
	}
	cmd := exec.Command(py, "-c", fmt.Sprintf(`
import multiprocessing as mp, time
locks = [mp.get_context("spawn").Lock() for _ in range(%d)]
print(" ".join(l._semlock.name for l in locks), flush=True)
time.sleep(60)
`, n))
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); _ = cmd.Wait() })
	line := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		sc.Scan()
		line <- sc.Text()
	}()
	var paths []string
	select {
	case l := <-line:
		for _, name := range strings.Fields(l) {
			paths = append(paths, "/dev/shm/sem."+strings.TrimPrefix(name, "/"))
		}
	case <-time.After(30 * time.Second):
	}
	if len(paths) != n {
		t.Fatalf("python printed %d semaphore names, want %d", len(paths), n)
	}
	return cmd, paths
}

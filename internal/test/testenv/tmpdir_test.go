package testenv

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// A killed test process's temp folder is removed by the next one, with the
// servers still running from it; a live one's is left alone.
func TestRemoveOrphanTmps(t *testing.T) {
	base := t.TempDir()
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Skip("no true(1):", err)
	}
	orphan := filepath.Join(base, tmpPrefix+strconv.Itoa(gone.Process.Pid))
	live := filepath.Join(base, tmpPrefix+strconv.Itoa(os.Getpid()))
	for _, d := range []string{orphan, live} {
		if err := os.MkdirAll(filepath.Join(d, "data"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// A server of the killed process (its data in the folder), and one of
	// the live process's.
	start := func(dir string) *exec.Cmd {
		f := filepath.Join(dir, "data", "log")
		if err := os.WriteFile(f, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		c := exec.Command("tail", "-f", f)
		c.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Process.Kill(); _ = c.Wait() })
		return c
	}
	left, ours := start(orphan), start(live)
	removeOrphanTmps(base)
	done := make(chan error, 1)
	go func() { done <- left.Wait() }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the orphan folder's server still runs")
	}
	if _, err := os.Stat(orphan); !os.IsNotExist(err) {
		t.Errorf("orphan folder: %v, want it removed", err)
	}
	if _, err := os.Stat(live); err != nil || !Alive(ours.Process.Pid) {
		t.Errorf("the live process's folder (%v) or server (alive %v) was touched", err, Alive(ours.Process.Pid))
	}
}

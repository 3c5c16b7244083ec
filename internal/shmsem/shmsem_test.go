package shmsem

import (
	"os"
	"slices"
	"syscall"
	"testing"

	"github.com/kfelastic/kfelastic/internal/test/testenv"
)

// A pod killed together with its Python resource tracker leaves the named
// semaphores of its spawn-context locks in /dev/shm (torch 1.13's error
// queues are such): the engine finds them in the pod's memory maps before
// the kill and unlinks them after. Real Python multiprocessing; the
// "pod" is a process group (Group finds it), killed as a whole.
func TestKilledGroupsSemaphoresAreUnlinked(t *testing.T) {
	cmd, want := testenv.PythonHoldingSemaphores(t, 2)
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

package local

import (
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/kfelastic/kfelastic/internal/test/testenv"
)

// A pod whose main process ends leaves its resource tracker unlinking the
// semaphores: the engine finds the tracker, kills the rest first, and
// gives the tracker its moment, after which nothing is left in /dev/shm.
func TestResourceTrackerFinishesBeforeTheKill(t *testing.T) {
	cmd, paths := testenv.PythonHoldingSemaphores(t, 1)
	path := paths[0]
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

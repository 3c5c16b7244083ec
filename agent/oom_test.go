package agent

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// The clock dates each rise of the count when it first reads it, and
// answers for the first rise above a group's baseline. The file stands in
// for the cgroup's memory.oom_control (only root can make a memory cgroup
// and drive it into the OOM killer; the cluster's E6 does that for real).
func TestOOMClockDatesTheFirstRise(t *testing.T) {
	path := filepath.Join(t.TempDir(), "memory.oom_control")
	write := func(n string) {
		if err := os.WriteFile(path+".tmp", []byte("oom_kill_disable 0\nunder_oom 0\noom_kill "+n+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(path+".tmp", path); err != nil {
			t.Fatal(err)
		}
	}
	write("2")
	c := startOOMClock(t.Context(), path, time.Millisecond)
	if _, ok := c.firstAbove(2); ok {
		t.Fatal("a rise before any")
	}
	before := time.Now()
	write("3")
	var at time.Time
	for deadline := time.Now().Add(5 * time.Second); ; {
		var ok bool
		if at, ok = c.firstAbove(2); ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the rise was not seen")
		}
		time.Sleep(time.Millisecond)
	}
	if at.Before(before) {
		t.Errorf("dated %v, before the rise at %v", at, before)
	}
	write("4")
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		if at4, ok := c.firstAbove(3); ok {
			if !at4.After(at) {
				t.Errorf("second rise dated %v, not after the first %v", at4, at)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the second rise was not seen")
		}
	}
	if again, _ := c.firstAbove(2); !again.Equal(at) {
		t.Errorf("the first rise moved: %v, was %v", again, at)
	}
	if startOOMClock(context.Background(), "", time.Millisecond) != nil {
		t.Error("a clock without a file")
	}
}

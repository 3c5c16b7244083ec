package agent

import (
	"bufio"
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// oomKills reads the kernel's count of OOM kills in the agent's memory
// cgroup: memory.events "oom_kill" on cgroup v2, memory.oom_control
// "oom_kill" on v1. ok is false when neither is readable (then a SIGKILL is
// reported as a signal, not as OOM). A rise between a group's start and a
// worker's SIGKILL is the evidence that the OOM killer did it.
func oomKills() (n int64, ok bool) {
	path := oomCounterPath()
	if path == "" {
		return 0, false
	}
	return readCounter(path, "oom_kill")
}

// oomCounterPath is the first readable file among the cgroup files that
// count OOM kills, "" if none is.
func oomCounterPath() string {
	v1, v2 := cgroupPaths()
	candidates := []string{
		filepath.Join("/sys/fs/cgroup", v2, "memory.events"),
		"/sys/fs/cgroup/memory.events",
		filepath.Join("/sys/fs/cgroup/memory", v1, "memory.oom_control"),
		"/sys/fs/cgroup/memory/memory.oom_control",
	}
	for _, path := range candidates {
		if _, ok := readCounter(path, "oom_kill"); ok {
			return path
		}
	}
	return ""
}

// oomClockInterval is how often the OOM clock reads the count: one read of
// a small cgroup file, ≈ 10 µs, 40 times a second.
const oomClockInterval = 25 * time.Millisecond

// oomClock dates OOM kills. A worker the OOM killer ends is reaped late
// when its pod is short of memory (the fork server and the agent fault
// their own pages back in first: 0.6 s on the one-node cluster), while a
// peer in another pod sees its sockets close at once and dates its
// "Connection closed by peer" earlier, so the secondary failure would win
// the root cause. The first sight of the count's rise is the kill's time,
// at most one interval late.
type oomClock struct {
	mu    sync.Mutex
	rises []oomRise // ascending in count and time
}

type oomRise struct {
	count int64
	at    time.Time
}

// startOOMClock reads path every interval until ctx ends; nil if path is "".
func startOOMClock(ctx context.Context, path string, interval time.Duration) *oomClock {
	if path == "" {
		return nil
	}
	c := &oomClock{}
	last, _ := readCounter(path, "oom_kill")
	go func() {
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if n, ok := readCounter(path, "oom_kill"); ok && n > last {
				c.saw(n, time.Now())
				last = n
			}
		}
	}()
	return c
}

func (c *oomClock) saw(n int64, at time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.rises = append(c.rises, oomRise{n, at})
}

// firstAbove is when the count was first seen above baseline; false if it
// has not been (yet: the clock may not have read it since the kill).
func (c *oomClock) firstAbove(baseline int64) (time.Time, bool) {
	if c == nil {
		return time.Time{}, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, r := range c.rises {
		if r.count > baseline {
			return r.at, true
		}
	}
	return time.Time{}, false
}

// cgroupPaths returns this process's v1 memory cgroup and v2 cgroup paths
// from /proc/self/cgroup.
func cgroupPaths() (v1, v2 string) {
	data, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return "", ""
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		switch {
		case parts[0] == "0" && parts[1] == "":
			v2 = parts[2]
		case strings.Contains(","+parts[1]+",", ",memory,"):
			v1 = parts[2]
		}
	}
	return v1, v2
}

func readCounter(path, key string) (int64, bool) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), " ")
		if ok && k == key {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return n, err == nil
		}
	}
	return 0, false
}

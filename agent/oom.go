package agent

import (
	"bufio"
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// oomKills reads the kernel's count of OOM kills in the agent's memory
// cgroup: memory.events "oom_kill" on cgroup v2, memory.oom_control
// "oom_kill" on v1. ok is false when neither is readable (then a SIGKILL is
// reported as a signal, not as OOM). A rise between a group's start and a
// worker's SIGKILL is the evidence that the OOM killer did it.
func oomKills() (n int64, ok bool) {
	v1, v2 := cgroupPaths()
	candidates := []string{
		filepath.Join("/sys/fs/cgroup", v2, "memory.events"),
		"/sys/fs/cgroup/memory.events",
		filepath.Join("/sys/fs/cgroup/memory", v1, "memory.oom_control"),
		"/sys/fs/cgroup/memory/memory.oom_control",
	}
	for _, path := range candidates {
		if n, ok := readCounter(path, "oom_kill"); ok {
			return n, true
		}
	}
	return 0, false
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

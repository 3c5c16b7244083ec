// Package procmem reads a process's memory as the kernel accounts it.
package procmem

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Rollup is a process's resident set and proportional set size in KiB,
// from /proc/PID/smaps_rollup; ok is false if it cannot be read. PSS counts
// each page shared with n processes as 1/n: for a fork server, whose pages
// its forked workers share, it is the server's fair share, where RSS counts
// the shared pages whole.
func Rollup(pid int) (rss, pss int64, ok bool) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return 0, 0, false
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		k, v, found := strings.Cut(line, ":")
		if !found {
			continue
		}
		n, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		if err != nil {
			continue
		}
		switch k {
		case "Rss":
			rss = n
		case "Pss":
			pss = n
		}
	}
	return rss, pss, true
}

package agent

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// minPreloadCPUs is the CPU limit below which the torch hook's forkserver
// stays off. The forkserver imports torch (and on 2.x torch._dynamo)
// beside the command's own start: with a core or more that runs in
// parallel and each worker then forks ready in milliseconds; under a
// smaller quota it competes for the same fraction of a CPU as the command
// and its first workers, so the whole start only gets longer (measured in
// bench/README.md: the torch hook's preload).
const minPreloadCPUs = 1.0

// containerCPUs is the CPU limit of the cgroup this process runs in (the
// container's, as the kubelet sets it from limits.cpu), in CPUs: the
// smallest CFS quota on the way from its cgroup to the root, v1
// (cpu.cfs_quota_us / cpu.cfs_period_us) or v2 (cpu.max). 0: no limit, or
// none that can be read.
func containerCPUs() float64 {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return 0
	}
	return cgroupCPUs("/sys/fs/cgroup", string(b))
}

// cgroupCPUs is containerCPUs over a cgroup file system mounted at root
// and a /proc/self/cgroup text (pure but for the files read).
func cgroupCPUs(root, self string) float64 {
	limit := 0.0
	take := func(cpus float64) {
		if cpus > 0 && (limit == 0 || cpus < limit) {
			limit = cpus
		}
	}
	for line := range strings.Lines(self) {
		// hierarchy-ID:controllers:path
		parts := strings.SplitN(strings.TrimSpace(line), ":", 3)
		if len(parts) != 3 {
			continue
		}
		controllers, path := parts[1], parts[2]
		switch {
		case parts[0] == "0" && controllers == "":
			for dir := range ancestors(filepath.Join(root, path), root) {
				take(cpuMax(filepath.Join(dir, "cpu.max")))
			}
			// A hybrid host mounts v2 at unified/.
			for dir := range ancestors(filepath.Join(root, "unified", path), filepath.Join(root, "unified")) {
				take(cpuMax(filepath.Join(dir, "cpu.max")))
			}
		case hasController(controllers, "cpu"):
			for _, mount := range []string{controllers, "cpu", "cpu,cpuacct", "cpuacct,cpu"} {
				base := filepath.Join(root, mount)
				for dir := range ancestors(filepath.Join(base, path), base) {
					quota, period := readInt(filepath.Join(dir, "cpu.cfs_quota_us")), readInt(filepath.Join(dir, "cpu.cfs_period_us"))
					if quota > 0 && period > 0 {
						take(float64(quota) / float64(period))
					}
				}
			}
		}
	}
	return limit
}

// ancestors yields dir and each parent up to and including root.
func ancestors(dir, root string) func(func(string) bool) {
	return func(yield func(string) bool) {
		for {
			if !yield(dir) || dir == root || !strings.HasPrefix(dir, root) {
				return
			}
			dir = filepath.Dir(dir)
		}
	}
}

func hasController(list, name string) bool {
	for c := range strings.SplitSeq(list, ",") {
		if c == name {
			return true
		}
	}
	return false
}

// cpuMax reads a cgroup v2 cpu.max ("QUOTA PERIOD" or "max PERIOD").
func cpuMax(path string) float64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) != 2 || f[0] == "max" {
		return 0
	}
	quota, err1 := strconv.ParseFloat(f[0], 64)
	period, err2 := strconv.ParseFloat(f[1], 64)
	if err1 != nil || err2 != nil || quota <= 0 || period <= 0 {
		return 0
	}
	return quota / period
}

func readInt(path string) int64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0
	}
	return n
}

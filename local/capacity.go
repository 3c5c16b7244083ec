package local

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"runtime"
	"strconv"
)

// Each worker of a local job is an interpreter with torch imported
// (≈150–250 MiB on torch 1.13) beside its agent; a machine holds a few per
// CPU before the job only thrashes: a thousand pods on 2 cores ran at a
// load average of 3,000 for 20 minutes and could not be stopped within a
// grace.
const (
	workersPerCPU  = 4
	minWorkers     = 8
	bytesPerWorker = 256 << 20
)

// MachineWorkers is how many workers this machine holds, and why: 4 per
// CPU (at least 8), fewer when the available memory cannot hold them at
// 256 MiB each.
func MachineWorkers() (int, string) {
	cpus := runtime.NumCPU()
	n := max(minWorkers, workersPerCPU*cpus)
	why := fmt.Sprintf("%d per CPU on %d CPUs", workersPerCPU, cpus)
	if avail, ok := memAvailable(); ok {
		if m := int(avail / bytesPerWorker); m < n {
			n = max(1, m)
			why = fmt.Sprintf("%d MiB available at 256 MiB a worker", avail>>20)
		}
	}
	return n, why
}

// checkWorkers refuses a job of more workers than bound allows (0: what
// this machine holds, < 0: no bound), saying why and how to override.
func checkWorkers(workers, bound int) error {
	if bound < 0 {
		return nil
	}
	why := "--max-workers"
	if bound == 0 {
		bound, why = MachineWorkers()
	}
	if workers <= bound {
		return nil
	}
	return fmt.Errorf("%d workers (MAX pods × workers per pod) is more than this machine holds: at most %d (%s); lower --nnodes or --nproc-per-node, or set --max-workers %d to run it anyway",
		workers, bound, why, workers)
}

// memAvailable is /proc/meminfo's MemAvailable, in bytes.
func memAvailable() (uint64, bool) {
	data, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, false
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		f := bytes.Fields(sc.Bytes())
		if len(f) >= 2 && string(f[0]) == "MemAvailable:" {
			kb, err := strconv.ParseUint(string(f[1]), 10, 64)
			return kb << 10, err == nil
		}
	}
	return 0, false
}

// checkExecutable fails unless path is a regular file someone may execute:
// a --binary that is missing or not a program would otherwise start every
// pod into exit 127 with no document.
func checkExecutable(path string) error {
	st, err := os.Stat(path)
	switch {
	case err != nil:
		return err
	case !st.Mode().IsRegular():
		return fmt.Errorf("%s: not a regular file", path)
	case st.Mode().Perm()&0o111 == 0:
		return fmt.Errorf("%s: not executable", path)
	}
	return nil
}

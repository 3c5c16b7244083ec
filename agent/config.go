package agent

import (
	"fmt"
	"syscall"
	"time"
)

// Ranges of the agent's numbers, as `kfelastic agent --help` states them.
const (
	// MaxNProcPerNode bounds the local workers: more GPUs or cores than any
	// node has, while a typo (100000) is refused before it starts that
	// many processes (1.4 GB and a minute of the agent's time).
	MaxNProcPerNode = 1024
	// maxSignal is SIGRTMAX on Linux.
	maxSignal = 64
)

// CheckRanges refuses numbers the agent cannot honour, naming the flag they
// come from: a negative duration, a port beyond 65535, a dump signal no
// worker can catch. Run checks them first; the command too, as soon as its
// flags are parsed. The zero durations of StopGrace and StorageTimeout are
// their defaults; the command refuses 0 for them itself.
func (c *Config) CheckRanges() error {
	for _, d := range []struct {
		flag string
		v    time.Duration
	}{{"hang-timeout", c.HangTimeout}, {"dump-timeout", c.DumpTimeout}, {"stop-grace", c.StopGrace}, {"storage-timeout", c.StorageTimeout}} {
		if d.v < 0 {
			return fmt.Errorf("--%s %v: want ≥ 0", d.flag, d.v)
		}
	}
	switch {
	case c.NProcPerNode < 1 || c.NProcPerNode > MaxNProcPerNode:
		return fmt.Errorf("--nproc-per-node %d: want 1 to %d", c.NProcPerNode, MaxNProcPerNode)
	case c.MinNodes < 1 || c.MaxNodes < c.MinNodes:
		return fmt.Errorf("--nnodes %d:%d: want 1 ≤ MIN ≤ MAX", c.MinNodes, c.MaxNodes)
	case c.MaxRestarts < 0:
		return fmt.Errorf("--max-restarts %d: want ≥ 0", c.MaxRestarts)
	case c.NodeRank < -1:
		return fmt.Errorf("--node-rank %d: want ≥ 0, or -1 for the rendezvous to assign it", c.NodeRank)
	case c.MasterPort < 0 || c.MasterPort > 65535:
		return fmt.Errorf("--master-port %d: want 1 to 65535 (0: none)", c.MasterPort)
	case c.DumpSignal < 0 || c.DumpSignal > maxSignal:
		return fmt.Errorf("--dump-signal %d: want a signal 1 to %d", int(c.DumpSignal), maxSignal)
	case c.DumpSignal == syscall.SIGKILL || c.DumpSignal == syscall.SIGSTOP:
		return fmt.Errorf("--dump-signal %s: a worker cannot catch it to checkpoint; use one it can (SIGUSR1)", c.DumpSignal)
	}
	return nil
}

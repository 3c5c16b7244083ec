package local

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Action is what a chaos spec does to the job (docs/DESIGN.md §6.2).
type Action string

// The chaos actions. Each is carried out for real by the engine.
const (
	// DeletePod: SIGTERM to the pod's agent, grace, SIGKILL (a preemption).
	DeletePod Action = "delete-pod"
	// KillWorker: kill -9 of one training process.
	KillWorker Action = "kill-worker"
	// Straggler: the pod is slowed by CPU throttling from the start.
	Straggler Action = "straggler"
	// BreakCheck: the pod's health-check process is killed, every round.
	BreakCheck Action = "break-check"
	// CutNetwork: the pod loses its network.
	CutNetwork Action = "cut-network"
	// OOM: the pod is driven past its memory limit.
	OOM Action = "oom"
	// FailPod: the pod fails for good (its relaunches fail too).
	FailPod Action = "fail-pod"
	// AddSlot: one more slot frees (scale up).
	AddSlot Action = "add-slot"
	// KillMaster: the master stops and restarts with its state reloaded.
	KillMaster Action = "kill-master"
)

// actions lists every action with what its TARGET may be.
var actions = map[Action]targetKind{
	DeletePod: nodeTarget, KillWorker: workerTarget, Straggler: nodeTarget, BreakCheck: nodeTarget,
	CutNetwork: nodeTarget, OOM: nodeTarget, FailPod: nodeTarget, AddSlot: noTarget, KillMaster: noTarget,
}

// ActionNames is the list of actions, for messages and help.
const ActionNames = "delete-pod, kill-worker, straggler, break-check, cut-network, oom, fail-pod, add-slot, kill-master"

type targetKind int

const (
	noTarget     targetKind = iota // add-slot, kill-master: the job as a whole
	nodeTarget                     // a pod, by node rank
	workerTarget                   // a worker: node/local rank, or a node (its local rank 0)
)

// Chaos is one parsed --chaos ACTION:TARGET@WHEN.
type Chaos struct {
	Action Action
	// Node is the target's node rank (-1: no target); Worker its local rank
	// (kill-worker only).
	Node, Worker int
	// Step > 0: fire once a worker printed step Step or later. Otherwise
	// After: fire this long after the job started (0: at once; straggler
	// and break-check act from the pod's start).
	Step  int64
	After time.Duration
}

// String is the spec in its canonical form; ParseChaos(c.String()) == c.
func (c Chaos) String() string {
	var b strings.Builder
	b.WriteString(string(c.Action))
	if c.Node >= 0 {
		fmt.Fprintf(&b, ":%d", c.Node)
		if actions[c.Action] == workerTarget {
			fmt.Fprintf(&b, "/%d", c.Worker)
		}
	}
	if c.Step > 0 {
		fmt.Fprintf(&b, "@step=%d", c.Step)
	} else {
		fmt.Fprintf(&b, "@after=%s", c.After)
	}
	return b.String()
}

// maxChaosStep and maxChaosAfter bound WHEN so that a typo does not read as
// "never".
const (
	maxChaosStep  = 1 << 40
	maxChaosAfter = 7 * 24 * time.Hour
)

// ParseChaos parses ACTION:TARGET@WHEN: TARGET is a node rank (1) or, for
// kill-worker, a worker (1/0: node 1, local rank 0); add-slot and
// kill-master take none (add-slot@step=20). WHEN is step=N (once any worker
// printed step N or later) or after=DURATION (since the job started);
// without @WHEN the action is at once. Errors quote the spec and name the
// part that is wrong.
func ParseChaos(spec string) (Chaos, error) {
	c := Chaos{Node: -1, Worker: -1}
	bad := func(format string, args ...any) (Chaos, error) {
		return Chaos{}, fmt.Errorf("--chaos %q: %s", spec, fmt.Sprintf(format, args...))
	}
	head, when, hasWhen := strings.Cut(spec, "@")
	name, target, hasTarget := strings.Cut(head, ":")
	c.Action = Action(name)
	kind, ok := actions[c.Action]
	if !ok {
		return bad("unknown action %q: want one of %s", name, ActionNames)
	}
	switch {
	case kind == noTarget && hasTarget:
		return bad("%s acts on the job, not on a pod: drop %q (write %s@WHEN)", name, ":"+target, name)
	case kind != noTarget && (!hasTarget || target == ""):
		return bad("%s needs a TARGET: a node rank, as in %s:1@step=10", name, name)
	case kind != noTarget:
		node, worker, isWorker := strings.Cut(target, "/")
		n, err := rank(node)
		if err != nil {
			return bad("target %q: node rank %v", target, err)
		}
		c.Node = n
		if isWorker && kind != workerTarget {
			return bad("target %q: %s acts on a whole pod: give a node rank (%d), not a worker", target, name, n)
		}
		if kind == workerTarget {
			c.Worker = 0
			if isWorker {
				w, err := rank(worker)
				if err != nil {
					return bad("target %q: local rank %v", target, err)
				}
				c.Worker = w
			}
		}
	}
	if !hasWhen {
		return c, nil
	}
	key, val, ok := strings.Cut(when, "=")
	switch {
	case !ok:
		return bad("WHEN %q: want step=N or after=DURATION", when)
	case key == "step":
		n, err := strconv.ParseInt(val, 10, 64)
		if err != nil || n < 1 || n > maxChaosStep {
			return bad("WHEN %q: step wants a whole number from 1 to %d", when, int64(maxChaosStep))
		}
		c.Step = n
	case key == "after":
		d, err := time.ParseDuration(val)
		if err != nil || d < 0 || d > maxChaosAfter {
			return bad("WHEN %q: after wants a duration from 0s to %s, like 30s or 1m30s", when, maxChaosAfter)
		}
		c.After = d
	default:
		return bad("WHEN %q: unknown %q: want step=N or after=DURATION", when, key)
	}
	return c, nil
}

// rank parses a non-negative rank.
func rank(s string) (int, error) {
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 || n > 1<<20 || strings.TrimSpace(s) != s || strings.HasPrefix(s, "+") {
		return 0, fmt.Errorf("%q: want a whole number ≥ 0", s)
	}
	return n, nil
}

// Check refuses a spec that cannot apply to a job of maxNodes pods of
// nproc workers: a node or worker that does not exist.
func (c Chaos) Check(maxNodes, nproc int) error {
	if c.Node >= maxNodes {
		return fmt.Errorf("--chaos %q: node rank %d does not exist: the job has ranks 0 to %d (--nnodes MAX)", c.String(), c.Node, maxNodes-1)
	}
	if c.Worker >= nproc {
		return fmt.Errorf("--chaos %q: local rank %d does not exist: pods have local ranks 0 to %d (--nproc-per-node)", c.String(), c.Worker, nproc-1)
	}
	return nil
}

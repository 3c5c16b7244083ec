package agent

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
	"time"
)

// NodeInfo is what an agent tells the rendezvous about itself when it joins.
type NodeInfo struct {
	// ID is unique per pod incarnation (the pod name); a replacement pod gets
	// a new ID.
	ID string
	// Rank is the stable node rank (PET_NODE_RANK); a replacement keeps it.
	// -1 lets the rendezvous choose (in order of arrival).
	Rank int
	// LocalWorldSize is the number of workers this node starts.
	LocalWorldSize int
	// Addr and Port are where this node's rank-0 worker would host the
	// torch.distributed store if this node becomes group rank 0; every agent
	// proposes a free port of its own, the round picks group rank 0's.
	Addr string
	Port int
}

// Round is a completed rendezvous round (DESIGN.md §5): its number, this
// node's place in it, and where the workers meet.
type Round struct {
	Number         int
	RunID          string
	GroupRank      int
	GroupWorldSize int
	// LocalWorldSizes are the members' local world sizes by group rank, from
	// which global ranks and the world size follow.
	LocalWorldSizes []int
	MasterAddr      string
	MasterPort      int
}

// WorldSize is the number of workers of the round.
func (r Round) WorldSize() int {
	n := 0
	for _, s := range r.LocalWorldSizes {
		n += s
	}
	return n
}

// FirstGlobalRank is the global rank of this node's local rank 0.
func (r Round) FirstGlobalRank() int {
	n := 0
	for _, s := range r.LocalWorldSizes[:r.GroupRank] {
		n += s
	}
	return n
}

// Rendezvous is how agents agree on rounds. The master (DESIGN.md §5)
// implements it over gRPC; Single, Fixed and InProcess implement it here.
type Rendezvous interface {
	// Next joins the round after the ones this node has seen and blocks until
	// it completes (or ctx ends).
	Next(ctx context.Context, node NodeInfo) (Round, error)
	// Changed blocks until round number is outdated — a node waits to join
	// (scale up) or a newer round completed without us — and returns nil;
	// the agent then restarts into the next round without spending budget.
	Changed(ctx context.Context, number int) error
}

// Single is the rendezvous of a one-node job (--standalone, --nnodes 1):
// every round completes at once with this node as group rank 0.
type Single struct {
	RunID  string
	number int
}

// Next returns the next round with this node alone.
func (s *Single) Next(ctx context.Context, node NodeInfo) (Round, error) {
	if err := ctx.Err(); err != nil {
		return Round{}, err
	}
	s.number++
	return Round{Number: s.number, RunID: s.RunID, GroupRank: 0, GroupWorldSize: 1,
		LocalWorldSizes: []int{node.LocalWorldSize}, MasterAddr: node.Addr, MasterPort: node.Port}, nil
}

// Changed never reports a change: nobody else can join.
func (s *Single) Changed(ctx context.Context, _ int) error {
	<-ctx.Done()
	return ctx.Err()
}

// Fixed is torchrun's "static" rendezvous for a fixed set of nodes without a
// master: node rank = group rank, every node starts the same number of
// workers, and the workers meet at MasterAddr:MasterPort (the training
// operator's PET_MASTER_ADDR/PET_MASTER_PORT), where the global rank-0
// worker hosts the store. It cannot learn of membership changes.
type Fixed struct {
	RunID      string
	Nodes      int
	MasterAddr string
	MasterPort int
	number     int
}

// Next returns the next fixed round.
func (f *Fixed) Next(ctx context.Context, node NodeInfo) (Round, error) {
	if err := ctx.Err(); err != nil {
		return Round{}, err
	}
	if node.Rank < 0 || node.Rank >= f.Nodes {
		return Round{}, fmt.Errorf("node rank %d outside [0, %d)", node.Rank, f.Nodes)
	}
	f.number++
	sizes := make([]int, f.Nodes)
	for i := range sizes {
		sizes[i] = node.LocalWorldSize
	}
	return Round{Number: f.number, RunID: f.RunID, GroupRank: node.Rank, GroupWorldSize: f.Nodes,
		LocalWorldSizes: sizes, MasterAddr: f.MasterAddr, MasterPort: f.MasterPort}, nil
}

// Changed never reports a change.
func (f *Fixed) Changed(ctx context.Context, _ int) error {
	<-ctx.Done()
	return ctx.Err()
}

// InProcess is an elastic rendezvous shared by agents in one process (tests,
// and the local engine until the master serves it): rounds complete with
// MaxNodes nodes at once, or with at least MinNodes after LastCall.
type InProcess struct {
	RunID              string
	MinNodes, MaxNodes int
	LastCall           time.Duration

	mu      sync.Mutex
	number  int                 // last completed round
	pending map[string]NodeInfo // nodes waiting for the next round, by ID
	results map[string]Round    // completed rounds not yet picked up, by ID
	timer   *time.Timer
	changed chan struct{} // closed and replaced on every change
}

// NewInProcess returns an InProcess rendezvous for min..max nodes.
func NewInProcess(runID string, minNodes, maxNodes int, lastCall time.Duration) *InProcess {
	return &InProcess{RunID: runID, MinNodes: minNodes, MaxNodes: maxNodes, LastCall: lastCall,
		pending: map[string]NodeInfo{}, results: map[string]Round{}, changed: make(chan struct{})}
}

func (r *InProcess) notifyLocked() {
	close(r.changed)
	r.changed = make(chan struct{})
}

// Next joins the pending round and waits for it to complete.
func (r *InProcess) Next(ctx context.Context, node NodeInfo) (Round, error) {
	r.mu.Lock()
	delete(r.results, node.ID)
	r.pending[node.ID] = node
	r.notifyLocked()
	r.maybeCompleteLocked()
	for {
		if round, ok := r.results[node.ID]; ok {
			delete(r.results, node.ID)
			r.mu.Unlock()
			return round, nil
		}
		ch := r.changed
		r.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			r.mu.Lock()
			delete(r.pending, node.ID)
			r.notifyLocked()
			r.mu.Unlock()
			return Round{}, ctx.Err()
		}
		r.mu.Lock()
	}
}

func (r *InProcess) maybeCompleteLocked() {
	n := len(r.pending)
	switch {
	case n >= r.MaxNodes:
		r.completeLocked()
	case n >= r.MinNodes && r.timer == nil:
		r.timer = time.AfterFunc(r.LastCall, func() {
			r.mu.Lock()
			defer r.mu.Unlock()
			r.timer = nil
			if len(r.pending) >= r.MinNodes {
				r.completeLocked()
			}
		})
	}
}

func (r *InProcess) completeLocked() {
	if r.timer != nil {
		r.timer.Stop()
		r.timer = nil
	}
	nodes := make([]NodeInfo, 0, len(r.pending))
	for _, n := range r.pending {
		nodes = append(nodes, n)
	}
	// Stable node ranks first, in rank order; then the others by ID.
	slices.SortFunc(nodes, func(a, b NodeInfo) int {
		if (a.Rank < 0) != (b.Rank < 0) {
			if a.Rank < 0 {
				return 1
			}
			return -1
		}
		return cmp.Or(cmp.Compare(a.Rank, b.Rank), cmp.Compare(a.ID, b.ID))
	})
	if len(nodes) > r.MaxNodes {
		nodes = nodes[:r.MaxNodes] // the rest stay pending for the next round
	}
	r.number++
	sizes := make([]int, len(nodes))
	for i, n := range nodes {
		sizes[i] = n.LocalWorldSize
	}
	for i, n := range nodes {
		r.results[n.ID] = Round{Number: r.number, RunID: r.RunID, GroupRank: i, GroupWorldSize: len(nodes),
			LocalWorldSizes: sizes, MasterAddr: nodes[0].Addr, MasterPort: nodes[0].Port}
		delete(r.pending, n.ID)
	}
	r.notifyLocked()
}

// Changed returns when a node is waiting for a round after number, or a
// round after number has completed.
func (r *InProcess) Changed(ctx context.Context, number int) error {
	r.mu.Lock()
	for len(r.pending) == 0 && r.number <= number {
		ch := r.changed
		r.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
		r.mu.Lock()
	}
	r.mu.Unlock()
	return nil
}

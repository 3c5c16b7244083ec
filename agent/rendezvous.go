package agent

import (
	"context"
	"fmt"
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

// Round is a completed rendezvous round (docs/DESIGN.md §5.2): its number, this
// node's place in it, and where the workers meet.
type Round struct {
	Number         int
	RunID          string
	GroupRank      int
	GroupWorldSize int
	// WorldSize is the number of workers of the round; FirstGlobalRank is
	// the global rank of this node's local rank 0 (the local world sizes
	// of the members before it).
	WorldSize       int
	FirstGlobalRank int
	MasterAddr      string
	MasterPort      int
	// Departed is how many members of the master's round before this one
	// are not in it (0 also when the master does not know): under
	// --launcher command, torch's c10d nodes of that round that are dead
	// (forgetLost).
	Departed int
	// DepartedKnown: Departed is the master's count, 0 meaning no member
	// of the round before left (a scale-up: there is nothing to forget).
	// False from a master that restarted since, or one before the field.
	DepartedKnown bool
	// DepartedSince is the earliest failure time those departed reported
	// (a preemption's: its SIGTERM); zero when unknown.
	DepartedSince time.Time
}

// Rendezvous is how agents agree on rounds (docs/DESIGN.md §4.2). The master
// (§5) implements it over gRPC (Master); Single and Fixed implement it here.
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
		WorldSize: node.LocalWorldSize, MasterAddr: node.Addr, MasterPort: node.Port}, nil
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
	return Round{Number: f.number, RunID: f.RunID, GroupRank: node.Rank, GroupWorldSize: f.Nodes,
		WorldSize: f.Nodes * node.LocalWorldSize, FirstGlobalRank: node.Rank * node.LocalWorldSize,
		MasterAddr: f.MasterAddr, MasterPort: f.MasterPort}, nil
}

// Changed never reports a change.
func (f *Fixed) Changed(ctx context.Context, _ int) error {
	<-ctx.Done()
	return ctx.Err()
}

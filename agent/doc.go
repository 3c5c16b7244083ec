// Package agent is kfelastic's per-pod supervisor, a drop-in for torchrun
// (DESIGN.md §4): it starts the local workers with torchrun's environment,
// observes their exits as events, restarts the group within a budget, and
// writes the pod's error document when it gives up or is preempted.
//
// It is a pure core inside a thin I/O loop. Policy is the core: a
// deterministic state machine fed events with their time, answering with
// actions (testdata/policy/*.txt replays its scenarios). Run is the loop:
//
//	p := NewPolicy(cfg)
//	actions := p.Start()                    // [JoinRound]
//	for !p.Done() {
//		carry out actions                   // Rendezvous.Next, start/signal workers, write document
//		ev := next of: worker exit, round ready, membership change, SIGTERM, p.Deadline()
//		actions = p.Step(ev, now)
//	}
//
// Rendezvous is how agents agree on rounds; Single (one node), Fixed
// (torchrun's static backend) and InProcess (several agents in one process,
// for tests and the local engine) implement it here, the master's gRPC
// client will too.
package agent

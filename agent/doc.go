// Package agent is kfelastic's per-pod supervisor, a drop-in for torchrun
// (docs/DESIGN.md §4): it starts the local workers with torchrun's environment,
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
// Rendezvous is how agents agree on rounds: Single (one node), Fixed
// (torchrun's static backend) and Master (the kfelastic master, over gRPC:
// masterclient.go) implement it; Config.validate checks the settings, and
// Run makes the rendezvous they name.
//
// A group starter starts each attempt's group (workergroups.go): the
// agent's own workers as torchrun starts them (--launcher agent), each
// exec'd, forked from the fork server or released from a warm spare, chosen
// once per group (launch.go); or, with --launcher command, one command that
// starts its own workers through torch elastic (command.go).
//
// Events: with an error prefix, the agent appends its pod's events next to
// the documents (package events: group started, worker exited, restart,
// pod failed or succeeded), in the background so that storage never delays
// a restart (eventlog.go). The failure report draws them in the pod's lane.
//
// The leaves are packages of their own, each with its tests:
//
//	agent/forkserver   one interpreter per pod with torch imported, which
//	                   forks the workers (default for `python SCRIPT` and
//	                   `python -m MODULE`; --fork-server=false turns it off)
//	agent/storeproxy   group rank 0's agent listens on the round's
//	                   MASTER_PORT and forwards to rank 0's store once it is
//	                   up, so no worker meets torch's 1 s connect retry
//	                   (default; --store-proxy=false turns it off); the one
//	                   visible difference from torchrun: global rank 0's
//	                   MASTER_PORT is a private port
//	agent/storerelay   --launcher command's TCPStore on loopback, relayed
//	                   to the master's store (agent/tcpstore: the frames)
//	agent/nodecheck    this node's part of the master's health check
//	agent/masterconn   the gRPC channel to the master and the retry of its
//	                   calls while it is away
//	agent/guardian     no process of a pod outlives its agent: marks,
//	                   sweeps, and the guardian process
package agent

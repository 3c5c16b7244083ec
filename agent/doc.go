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
// Rendezvous is how agents agree on rounds; Single (one node), Fixed
// (torchrun's static backend) and InProcess (several agents in one process,
// for tests and the local engine) implement it here, the master's gRPC
// client will too.
//
// Events: with an error prefix, the agent appends its pod's events next to
// the documents (package events: group started, worker exited, restart,
// pod failed or succeeded), in the background so that storage never delays
// a restart (eventlog.go). The failure report draws them in the pod's lane.
//
// Store proxy (default; Config.NoStoreProxy, --store-proxy=false, turns it
// off): torchrun's workers meet at a TCPStore that the global rank-0 worker
// hosts on MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE=False), and it binds the
// port only after importing torch. torch 1.13's store client answers a
// refused connect() by sleeping a whole second before it tries again, so a
// rank that is ready first makes the group's first step ~1 s late; after a
// kill -9 that is most of a restart. The agent of group rank 0 therefore
// listens on the round's MASTER_PORT itself, accepts at once, and forwards
// each connection, once rank 0's store accepts, to that store on a private
// port (package storeproxy). The one visible difference from torchrun: global rank
// 0's MASTER_PORT is the private port; torchrun gives every rank the same.
// With the static backend on several nodes the proxy listens on the
// operator's PET_MASTER_PORT on the node of group rank 0.
//
// Fork server (default; Config.NoForkServer, --fork-server=false, turns it
// off): for a `python SCRIPT` or `python -m MODULE` command, the interpreter
// start and `import torch` are most of a restart, so the agent keeps one
// interpreter per pod with the preloads imported and forks each worker from
// it (forkserver.go, forkserver.py). The workers are the server's children;
// it reports their pids and wait statuses, so signals, the watchdog, OOM and
// exit classification see them as exec'd ones.
package agent

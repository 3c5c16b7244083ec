// Package master is the per-job master of an elastic job: the agents (one
// per pod) join its rounds, send it heartbeats and the results of health
// checks, and keep torch's store in it; it decides who trains in each
// round, who is lost or slow, and which pods to relaunch
// (docs/DESIGN.md §5).
//
// What it holds:
//
//   - Job (job.go, with check.go for the health check): the state
//     machine, pure: fed events with their time (Join, Heartbeat,
//     ReportCheck, Leave, PodGone, Tick), it answers them and records its
//     decisions; it starts no goroutine and reads no clock.
//   - Server (server.go): the one loop around the Job and the store
//     (master/store) that orders every call, persists each batch of
//     changes before it answers (group commit), wakes the calls held as
//     long polls, and hands decisions to the PodOwner.
//   - The durable layer (durable.go, segment.go): the state under --state,
//     a log of batches (a segment file per master on file://, a file per
//     batch on other stores) and snapshots, the fencing of an older
//     master, RestoreJob after a restart (§5.8).
//   - The gRPC service (grpc.go) and its transports (transport.go): the
//     lean one, package master/h2, the default, or grpc-go's server
//     (--transport grpc); undecodable.go has both answer a request that
//     does not decode alike. metrics.go: Prometheus metrics.
//   - PodOwner (server.go): the interface that carries out relaunch
//     decisions, master/kube on Kubernetes, the local engine otherwise;
//     the relaunch policy itself is master/relaunch's.
//
// Where to start reading: Config and Job in job.go, then Server.Run in
// server.go, then the service in grpc.go; api/master.proto is the
// protocol.
//
// How it is tested: the scenario scripts in testdata/scenarios replay the
// Job step by step (cockroachdb/datadriven, TestScenarios; -rewrite
// accepts a deliberate change); TestSim runs seeded random histories
// against the Job's invariants and shrinks a failing one into a script
// (-sim.seed, -sim.n; -sim.write keeps it); FuzzJob and FuzzStateDecode
// fuzz the core and the state's decoding; the server's tests run real
// masters on loopback, in this process or as processes killed and
// restarted (server_test.go, state_test.go, groupcommit_test.go). The
// transports' tests (transport_test.go) run their cases on both
// transports, and the rest of the suite runs on the default one, or on
// grpc-go's with KFELASTIC_MASTER_TRANSPORT=grpc; package h2 has its own
// (attacks, fuzzing, h2spec), and TestH2spec here holds grpc-go's server
// to h2spec.
package master

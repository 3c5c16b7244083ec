// Package store is the master's key-value store with the semantics of torch's
// TCPStore (docs/DESIGN.md §5.7; TORCH-STORE.md in the project's shared
// notes): SET, GET, ADD, COMPARE_SET, CHECK, DELETE, NUM_KEYS, APPEND,
// MULTI_GET and MULTI_SET, with torch's answers in every branch (a missing
// key is 0 for ADD, COMPARE_SET on a missing key with a non-empty expected
// value returns expected and stores nothing, and so on).
//
// The store is pure: no goroutines, no clock, no network, no locks. The
// master's single event loop owns it, so the gRPC layer and the durability
// log wrap it without the store knowing about either, and tests drive it step
// by step. WAIT is not an operation here: the loop parks a waiter, and after
// each Apply re-checks the waiters of the keys it touched with Ready.
//
// Mutations are applied exactly once. Agents relay torch's connections over
// gRPC and retry a call whose reply was lost; a retried ADD applied twice
// would skew a barrier counter and a retried COMPARE_SET applied twice would
// report a lost race as won. So every mutation carries its client's session
// id and a sequence number: the store records each session's last sequence
// number and result, answers a retry from that record, and refuses anything
// older. Session records are durable like keys, so a restarted master still
// recognises retries.
//
// The loop around it:
//
//	res, touched, err := st.Apply(req.Client, req.Seq, op)
//	// reply once durable; then wake waiters whose keys are all Ready
//	for _, k := range touched { wakeWaitersOn(k, st.Ready) }
//	kvs, sessions := st.TakeChanges() // one log batch (group commit)
//
// and on start, st.Restore(records of the newest snapshot and the logs after
// it, in order).
package store

package main

// A run is one execution of one package's test binary: the package's own
// run, or a leg (the same binary again with other settings, such as the
// master's suite on grpc-go).
type run struct {
	// Label is what the result line names: the package's import path,
	// and the leg's settings for a leg.
	Label string
	// Dir is the package's folder, the binary's working folder as under
	// go test.
	Dir string
	// Binary is the linked test binary.
	Binary string
	// Big marks the packages that each keep a core busy for minutes
	// (real torch jobs, the cluster): at most bigLanes of them run at once.
	Big bool
	// Env is added to the binary's environment, Args to its flags.
	Env, Args []string
}

// next is the index of the first run in runs, in their order, that may
// start now: not started yet, and, when it is big, fewer than bigLanes big
// runs are running. It is -1 when none may (every lane taken, or only big
// runs left while bigLanes of them run). A run never waits behind one
// that may not start: with the big lanes full, a small run further down
// starts in the free lane, which is what the third lane is for.
func next(runs []run, started []bool, running, runningBig, lanes, bigLanes int) int {
	if running >= lanes {
		return -1
	}
	for i, r := range runs {
		if started[i] {
			continue
		}
		if r.Big && runningBig >= bigLanes {
			continue
		}
		return i
	}
	return -1
}

// lanesNow is how many runs may run at once: lanes while a big run is
// running or waiting, tailLanes (when above 0) once every big run has
// ended. The short packages that finish a suite leave a core idle at
// times (waiting on servers, timers); torch-heavy packages three at a time
// cost more CPU than two (contention: a warm make test's Python took 11 %
// more, 2026-12-07) and miss their load-timing bounds.
func lanesNow(runs []run, started []bool, runningBig, lanes, tailLanes int) int {
	if tailLanes <= 0 || runningBig > 0 {
		return lanes
	}
	for i, r := range runs {
		if r.Big && !started[i] {
			return lanes
		}
	}
	return tailLanes
}

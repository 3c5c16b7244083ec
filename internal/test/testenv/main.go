package testenv

import (
	"os"
	"strings"
	"sync"
	"testing"
)

// Main runs the tests in a temp folder of their own (privateTmp) and then
// stops every server started for them (this package's MinIO, and what
// another registered with StopAtExit: kubeenv's API server and cluster)
// and removes the folder. Call it from TestMain:
//
//	func TestMain(m *testing.M) { testenv.Main(m) }
func Main(m *testing.M) {
	childrenExitAtOnce()
	removeTmp := privateTmp()
	atExit.Lock()
	atExit.inMain = true
	atExit.Unlock()
	code := m.Run()
	atExit.Lock()
	stops := atExit.stops
	atExit.stops = nil
	atExit.Unlock()
	for i := len(stops) - 1; i >= 0; i-- {
		stops[i]()
	}
	if shared.p != nil {
		shared.p.Stop()
	}
	removeTmp()
	os.Exit(code)
}

// atExit is what Main stops when the tests have ended.
var atExit struct {
	sync.Mutex
	inMain bool
	stops  []func()
}

// InMain says whether the tests run under Main, which stops at their end
// what StopAtExit registered: a helper that starts a server for the whole
// test binary fails the test without it.
func InMain() bool {
	atExit.Lock()
	defer atExit.Unlock()
	return atExit.inMain
}

// StopAtExit has Main call stop when the tests have ended, the last
// registered first.
func StopAtExit(stop func()) {
	atExit.Lock()
	defer atExit.Unlock()
	atExit.stops = append(atExit.stops, stop)
}

// childrenExitAtOnce makes the processes a test starts from a binary built
// with -race (the test binary re-executed as a worker, an agent, a master)
// exit when they return, as the binaries they stand for do. The race
// runtime otherwise sleeps a second at exit (GORACE atexit_sleep_ms,
// default 1000): a worker silent for that second before its exit was
// killed as hung by a 1 s hang watchdog (TestUnreadOutputDoesNotStallWorkers).
// Without -race GORACE is read by nobody.
func childrenExitAtOnce() {
	g := os.Getenv("GORACE")
	if strings.Contains(g, "atexit_sleep_ms") {
		return
	}
	os.Setenv("GORACE", strings.TrimSpace(g+" atexit_sleep_ms=0"))
}

package testenv

import (
	"testing"
)

// FreePort is a loopback TCP port that was free a moment ago: for a server
// a test starts later, or one it wants nothing to listen on.
func FreePort(t testing.TB) int {
	t.Helper()
	p, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// FreePortNumber is FreePort outside a test (a benchmark's command).
func FreePortNumber() (int, error) { return freePort() }

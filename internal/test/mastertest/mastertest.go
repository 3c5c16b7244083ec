// Package mastertest runs a real kfelastic master on loopback for tests of
// the packages around it (the agent's client, the local engine): gRPC, the
// loop, durable state in a temporary folder; nothing faked.
package mastertest

import (
	"context"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kfelastic/kfelastic/master"
)

// Token is the job token of the masters this package starts.
const Token = "master-test-token"

// Master is a master serving on loopback.
type Master struct {
	// Addr is host:port; TokenFile holds Token.
	Addr, TokenFile string
	Server          *master.Server
}

// Start serves a master for cfg until the test ends. state "" means a
// file:// state in a temporary folder; heartbeats are held 500 ms.
func Start(t testing.TB, cfg master.Config, state string) *Master {
	t.Helper()
	return StartWith(t, master.Options{Job: cfg, StateURL: state})
}

// StartWith is Start with the rest of the options (a pod owner, a logger).
// Token is always Token; StateURL "" means a file:// state in a temporary
// folder, HeartbeatInterval 0 means 500 ms, a nil Logger the test's log.
func StartWith(t testing.TB, opts master.Options) *Master {
	t.Helper()
	if opts.StateURL == "" {
		opts.StateURL = "file://" + t.TempDir()
	}
	s, ctx, cancel, tl := newServer(t, opts)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, lis) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("master: %v", err)
		}
		tl.stop()
	})
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte(Token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return &Master{Addr: lis.Addr().String(), TokenFile: tokenFile, Server: s}
}

// newServer is a master on opts with the test token, a 500 ms heartbeat
// interval unless opts has one, and the test's log unless opts has a
// logger; cancel stops it.
func newServer(t testing.TB, opts master.Options) (*master.Server, context.Context, context.CancelFunc, *testLog) {
	t.Helper()
	opts.Token = Token
	if opts.HeartbeatInterval == 0 {
		opts.HeartbeatInterval = 500 * time.Millisecond
	}
	tl := &testLog{t: t}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(tl, nil))
	}
	ctx, cancel := context.WithCancel(context.Background())
	s, err := master.NewServer(ctx, opts)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	return s, ctx, cancel, tl
}

// testLog writes the master's log lines to the test's log while it runs.
type testLog struct {
	t    testing.TB
	mu   sync.Mutex
	done bool
}

func (l *testLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.done {
		l.t.Log("master: " + strings.TrimRight(string(p), "\n"))
	}
	return len(p), nil
}

func (l *testLog) stop() {
	l.mu.Lock()
	l.done = true
	l.mu.Unlock()
}

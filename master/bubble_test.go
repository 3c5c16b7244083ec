package master_test

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kfelastic/kfelastic/api/masterpb"
	"github.com/kfelastic/kfelastic/internal/test/mastertest"
	"github.com/kfelastic/kfelastic/master"
)

// The tests of the master's loop whose subject is time (waiting and
// heartbeat timeouts, held long polls, a call held behind another) run the
// real server, gRPC included, inside a testing/synctest bubble: the loop's
// timers run on the bubble's clock, which moves only when every goroutine
// of the bubble waits, and synctest.Wait says "the master holds the call"
// where a test slept before. Only the transport differs from production:
// an in-memory pipe instead of TCP, which a bubble cannot wait on durably
// (mastertest.PipeListener).

// bubbleMaster is a master served on a pipe inside a synctest bubble.
type bubbleMaster struct {
	Server *master.Server
	lis    *mastertest.PipeListener
	// ended receives Serve's result once.
	ended  chan error
	cancel context.CancelFunc
}

// startInBubble serves a master inside the calling synctest bubble until
// the test ends. opts.Token is set to the test token; a nil
// Logger logs to the test, HeartbeatInterval 0 means 500 ms (as mastertest).
func startInBubble(t *testing.T, opts master.Options) *bubbleMaster {
	t.Helper()
	opts.Token = token
	if opts.HeartbeatInterval == 0 {
		opts.HeartbeatInterval = 500 * time.Millisecond
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(&prefixWriter{t: t, prefix: "master: "}, nil))
	}
	ctx, cancel := context.WithCancel(context.Background())
	s, err := master.NewServer(ctx, opts)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	m := &bubbleMaster{Server: s, lis: mastertest.NewPipeListener(), ended: make(chan error, 1), cancel: cancel}
	go func() { m.ended <- s.Serve(ctx, m.lis) }()
	t.Cleanup(func() {
		cancel()
		// A test that waited for the end put its result back.
		if err := <-m.ended; err != nil && !errors.Is(err, master.ErrFenced) {
			t.Errorf("master: %v", err)
		}
	})
	return m
}

// client is a client of m with the given token ("" for none), closed when
// the test ends.
func (m *bubbleMaster) client(t *testing.T, tok string) masterpb.MasterClient {
	t.Helper()
	opts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithContextDialer(m.lis.Dial)}
	if tok != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(bearer(tok)))
	}
	conn, err := grpc.NewClient("passthrough:///pipe", opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return masterpb.NewMasterClient(conn)
}

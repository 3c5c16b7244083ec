package master_test

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kfelastic/kfelastic/api/masterpb"
	"github.com/kfelastic/kfelastic/master"
)

// The tests of the master's loop whose subject is time (waiting and
// heartbeat timeouts, held long polls, a call held behind another) run the
// real server, gRPC included, inside a testing/synctest bubble: the loop's
// timers run on the bubble's clock, which moves only when every goroutine
// of the bubble waits, and synctest.Wait says "the master holds the call"
// where a test slept before. Only the transport differs from production:
// an in-memory pipe instead of TCP, which a bubble cannot wait on durably.

// pipeListener is a net.Listener over net.Pipe connections made by dial.
type pipeListener struct {
	conns  chan net.Conn
	closed chan struct{}
	once   sync.Once
}

func newPipeListener() *pipeListener {
	return &pipeListener{conns: make(chan net.Conn), closed: make(chan struct{})}
}

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

func (l *pipeListener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return nil
}

func (l *pipeListener) Addr() net.Addr { return pipeAddr{} }

// dial hands the server one end of a new pipe and returns the other.
func (l *pipeListener) dial(ctx context.Context, _ string) (net.Conn, error) {
	server, client := net.Pipe()
	select {
	case l.conns <- server:
		return client, nil
	case <-l.closed:
		return nil, net.ErrClosed
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

type pipeAddr struct{}

func (pipeAddr) Network() string { return "pipe" }
func (pipeAddr) String() string  { return "pipe" }

// bubbleMaster is a master served on a pipe inside a synctest bubble.
type bubbleMaster struct {
	Server *master.Server
	lis    *pipeListener
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
	m := &bubbleMaster{Server: s, lis: newPipeListener(), ended: make(chan error, 1), cancel: cancel}
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
	opts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithContextDialer(m.lis.dial)}
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

package mastertest

import (
	"context"
	"net"
	"sync"
	"testing"

	"github.com/kfelastic/kfelastic/master"
)

// A master inside a testing/synctest bubble serves on a PipeListener: an
// in-memory pipe, which the bubble can wait on durably (a TCP socket it
// cannot), so that the bubble's clock moves while the master holds a call.

// PipeListener is a net.Listener over net.Pipe connections made by Dial.
type PipeListener struct {
	conns  chan net.Conn
	closed chan struct{}
	once   sync.Once
}

// NewPipeListener returns a listener that accepts the connections Dial
// makes; inside a bubble, make it there.
func NewPipeListener() *PipeListener {
	return &PipeListener{conns: make(chan net.Conn), closed: make(chan struct{})}
}

// Accept waits for the next Dial.
func (l *PipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

// Close makes Accept and every later Dial fail; the connections made
// stay open.
func (l *PipeListener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return nil
}

// Addr is "pipe".
func (l *PipeListener) Addr() net.Addr { return pipeAddr{} }

// Dial hands the server one end of a new pipe and returns the other; the
// address is ignored. It is a gRPC context dialer (grpc.WithContextDialer,
// agent.MasterConfig.Dialer).
func (l *PipeListener) Dial(ctx context.Context, _ string) (net.Conn, error) {
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

// Bubble is a master served on a PipeListener inside the calling synctest
// bubble.
type Bubble struct {
	Server *master.Server
	// Listener's Dial reaches the master (agent.MasterConfig.Dialer).
	Listener *PipeListener
	cancel   context.CancelFunc
	ended    chan error
	tl       *testLog
	stopOnce sync.Once
}

// StartInBubble serves a master for opts inside the calling synctest
// bubble until Stop or the end of the test. Token is always Token;
// StateURL "" means in memory, HeartbeatInterval 0 means 500 ms, a nil
// Logger the test's log.
func StartInBubble(t testing.TB, opts master.Options) *Bubble {
	t.Helper()
	s, ctx, cancel, tl := newServer(t, opts)
	b := &Bubble{Server: s, Listener: NewPipeListener(), cancel: cancel, ended: make(chan error, 1), tl: tl}
	go func() { b.ended <- s.Serve(ctx, b.Listener) }()
	t.Cleanup(func() {
		if err := b.Stop(); err != nil {
			t.Errorf("master: %v", err)
		}
		tl.stop()
	})
	return b
}

// Stop stops serving and returns Serve's error: from then on the master is
// unreachable (a Dial fails, the connections made are closed).
// Idempotent; the later calls return nil.
func (b *Bubble) Stop() error {
	var err error
	b.stopOnce.Do(func() {
		b.cancel()
		err = <-b.ended
	})
	return err
}

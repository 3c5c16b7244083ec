package master

import (
	"context"
	"fmt"
	"net"
	"os"
	"time"

	"google.golang.org/grpc"

	"github.com/kfelastic/kfelastic/api/masterpb"
	"github.com/kfelastic/kfelastic/master/h2"
)

// Transport is how the master's gRPC service is carried over HTTP/2.
type Transport string

const (
	// TransportLean is the master's own HTTP/2 server for its unary
	// service (package h2): one goroutine per connection, one per call while
	// it runs; under half of grpc-go's memory at 10,000 agents
	// (docs/DESIGN.md §5.11).
	TransportLean Transport = "lean"
	// TransportGRPC is grpc-go's own server (grpc.Server.Serve), as before
	// the lean transport: kept to fall back on.
	TransportGRPC Transport = "grpc"
)

// DefaultTransport is the transport the master serves with unless told.
const DefaultTransport = TransportLean

// Transports are the transports the master knows, the default first.
var Transports = []Transport{TransportLean, TransportGRPC}

// TransportEnv names the environment variable that, where set, replaces
// DefaultTransport for a master whose Options leave Transport empty: how the
// tests of the master and of its clients run under another transport.
const TransportEnv = "KFELASTIC_MASTER_TRANSPORT"

// ParseTransport checks a transport's name; empty is the default
// ($KFELASTIC_MASTER_TRANSPORT, else DefaultTransport).
func ParseTransport(s string) (Transport, error) {
	if s == "" {
		s = os.Getenv(TransportEnv)
	}
	if s == "" {
		return DefaultTransport, nil
	}
	for _, t := range Transports {
		if string(t) == s {
			return t, nil
		}
	}
	return "", fmt.Errorf("unknown transport %q (want one of %v)", s, Transports)
}

// MaxConcurrentCalls bounds the calls one connection may have open at once,
// under either transport: advertised as HTTP/2's
// SETTINGS_MAX_CONCURRENT_STREAMS, and a call past it is refused with
// RST_STREAM REFUSED_STREAM. Without it an authenticated peer could make
// the master hold any number of calls, each a goroutine (≈4 KiB of stack
// and ≈5 KiB of heap held, docs/DESIGN.md §5.11): grpc-go's server has no
// bound by default (x/net's has 250), and the lean transport had none.
//
// An honest agent holds a few calls of its own (a held Join, a held
// Heartbeat, a ReportCheck or Leave) and, under --launcher command, about
// one per torch store connection it relays: torch's client waits for
// each reply (WAITs included: one per connection at a time), and the
// workers connect one each with the agent's store (torch 1.13's elastic
// agent opens two), so nproc_per_node plus a few; 1.13's waits that time
// out send no cancel and stay held until their keys come or the
// connection ends. grpc-go's client does not fail calls past the bound,
// it queues them until a call ends; a bound an agent can reach would hold
// its heartbeat behind the relay's long polls (renewed every 60 s) and
// have the node declared lost. 1024 is far above any agent's need (a
// 1,000-worker node) and keeps what one connection's held calls pin to a
// few MiB (1,024 of them: as many goroutines and 2–4 MiB of heap,
// TestTransportsBoundConcurrentCalls). On the lean transport, calls whose
// messages are still arriving hold what the peer sent of them, not the
// length it declared (h2.TestDeclaredSizeNotAllocated): up to
// MaxMessageBytes each, for a peer with the token.
const MaxConcurrentCalls = 1024

// ConnLimits bound the connections of the lean transport (grpc-go's
// server, --transport grpc, has neither bound).
type ConnLimits struct {
	// AuthTimeout closes a connection that has made no call with the job's
	// token this long after it was accepted (refused calls do not count):
	// a peer without the token holds no connection for long. 0:
	// DefaultAuthTimeout.
	AuthTimeout time.Duration
	// MaxConns bounds the connections open at once: one accepted past it
	// is closed at once. 0: DefaultMaxConns.
	MaxConns int
}

const (
	// DefaultAuthTimeout is ample: an agent's first call follows its
	// connection at once, and carries the token.
	DefaultAuthTimeout = 10 * time.Second
	// DefaultMaxConns is twice what the master is sized for: 10,000
	// agents, one connection each (docs/DESIGN.md §5.11).
	DefaultMaxConns = 20000
)

// serveGRPC serves g on lis until ctx ends (grpc-go's transport).
func serveGRPC(ctx context.Context, g *grpc.Server, lis net.Listener, errc chan<- error) (stop func()) {
	go func() { errc <- g.Serve(lis) }()
	return func() {
		stopped := make(chan struct{})
		go func() { g.GracefulStop(); close(stopped) }()
		select {
		case <-stopped:
		case <-time.After(2 * time.Second):
			g.Stop()
		}
	}
}

// leanServer returns the lean transport's server for s: package h2, handed
// the master's service, its token check and its bounds.
func (s *Server) leanServer() (*h2.Server, error) {
	limits := s.opts.Connections
	if limits.AuthTimeout <= 0 {
		limits.AuthTimeout = DefaultAuthTimeout
	}
	if limits.MaxConns <= 0 {
		limits.MaxConns = DefaultMaxConns
	}
	return h2.NewServer(h2.Config{
		Service:     undecodableService(masterpb.Master_ServiceDesc),
		Impl:        &service{s: s},
		TokenHeader: TokenHeader,
		Authorize: func(values []string) error {
			if !s.authentic(values) {
				s.metrics.refused.Inc()
				return errUnauthenticated
			}
			return nil
		},
		Log:                s.log,
		AuthTimeout:        limits.AuthTimeout,
		MaxConns:           limits.MaxConns,
		MaxConcurrentCalls: MaxConcurrentCalls,
		MaxMessageBytes:    MaxMessageBytes,
		MaxHeaderListBytes: maxHeaderListBytes,
	})
}

package master

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	"golang.org/x/net/http2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
)

// Transport is how the master's gRPC service is carried over HTTP/2.
type Transport string

const (
	// TransportGRPC is grpc-go's own server transport (grpc.Server.Serve).
	TransportGRPC Transport = "grpc"
	// TransportHTTP2 is Go's HTTP/2 server (golang.org/x/net/http2) with the
	// master's own unary gRPC handler (unary.go): per agent, two goroutines
	// for the connection and one for a held call.
	TransportHTTP2 Transport = "http2"
	// TransportLean is the master's own HTTP/2 server (lean.go): one
	// goroutine per connection, one per call while it runs.
	TransportLean Transport = "lean"
	// TransportHTTP2GRPC is Go's HTTP/2 server with grpc-go's handler
	// (grpc.Server.ServeHTTP), which adds two goroutines to every call.
	TransportHTTP2GRPC Transport = "http2-grpc"
)

// DefaultTransport is the transport the master serves with unless told.
const DefaultTransport = TransportGRPC

// Transports are the transports the master knows, the default first.
var Transports = []Transport{TransportGRPC, TransportLean, TransportHTTP2, TransportHTTP2GRPC}

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

// maxReadFrameBytes is the largest HTTP/2 frame the master reads: the
// protocol's minimum, what grpc-go's clients send anyway. The framer keeps
// a buffer of the largest frame it read, per connection.
const maxReadFrameBytes = 16 << 10

// h2Server serves an http.Handler on plaintext HTTP/2 connections with
// prior knowledge (h2c, what grpc-go's clients speak without TLS), one
// x/net/http2 ServeConn per connection: no net/http connection and none of
// its buffers under it, as h2c.NewHandler on an http.Server would keep.
type h2Server struct {
	h2  *http2.Server
	hs  *http.Server // ServeConn's base configuration; its Shutdown sends every connection GOAWAY
	h   http.Handler
	log *slog.Logger

	mu      sync.Mutex
	conns   map[net.Conn]struct{}
	closing bool
	wg      sync.WaitGroup
}

func newH2Server(h http.Handler, log *slog.Logger) *h2Server {
	h2s := &http2.Server{
		// As grpc-go's server: no limit of its own on a client's
		// concurrent calls (an agent's store relay multiplexes its
		// workers' waits on its one connection).
		MaxConcurrentStreams: math.MaxUint32,
		MaxReadFrameSize:     maxReadFrameBytes,
		// As grpc-go's server's keepalive defaults: a connection silent
		// for 2 hours is pinged, and closed without an answer in 20 s.
		// The agents ping every 10 s themselves (agent/masterconn).
		ReadIdleTimeout: 2 * time.Hour,
		PingTimeout:     20 * time.Second,
	}
	hs := &http.Server{
		// The header list of one call: all the master reads before it
		// knows the caller has the job's token (maxHeaderListBytes).
		MaxHeaderBytes: maxHeaderListBytes,
		ErrorLog:       slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}
	if err := http2.ConfigureServer(hs, h2s); err != nil {
		panic(err) // only with a TLS configuration, which hs has none of
	}
	return &h2Server{h2: h2s, hs: hs, h: h, log: log, conns: map[net.Conn]struct{}{}}
}

// serve accepts connections on lis until it is closed.
func (t *h2Server) serve(ctx context.Context, lis net.Listener) error {
	var delay time.Duration
	for {
		c, err := lis.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			// As net/http and grpc-go do with a temporary error (out of
			// file descriptors): wait, up to a second, and go on.
			delay = min(max(2*delay, 5*time.Millisecond), time.Second)
			t.log.Warn("accept", "err", err, "retry_in", delay)
			select {
			case <-time.After(delay):
			case <-ctx.Done():
				return nil
			}
			continue
		}
		delay = 0
		if !t.add(c) {
			c.Close()
			continue
		}
		go func() {
			defer t.wg.Done()
			// Calls outlive ctx by their answers: stop ends them.
			t.h2.ServeConn(c, &http2.ServeConnOpts{Context: context.WithoutCancel(ctx), BaseConfig: t.hs, Handler: t.h})
			c.Close()
			t.mu.Lock()
			delete(t.conns, c)
			t.mu.Unlock()
		}()
	}
}

func (t *h2Server) add(c net.Conn) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closing {
		return false
	}
	t.conns[c] = struct{}{}
	t.wg.Add(1)
	return true
}

// stop ends every connection: GOAWAY first, so that calls in flight end
// with their answers, and after grace whatever is still open is closed.
func (t *h2Server) stop(grace time.Duration) {
	t.mu.Lock()
	t.closing = true
	t.mu.Unlock()
	// No connection of hs's own: Shutdown runs the HTTP/2 server's
	// shutdown hook (GOAWAY on each connection) and returns.
	_ = t.hs.Shutdown(context.Background())
	done := make(chan struct{})
	go func() { t.wg.Wait(); close(done) }()
	select {
	case <-done:
		return
	case <-time.After(grace):
	}
	t.mu.Lock()
	for c := range t.conns {
		c.Close()
	}
	t.mu.Unlock()
	<-done
}

// httpAuthorized refuses a call without the job's token on its headers,
// before any of its message is read, with the gRPC status Unauthenticated
// as a trailers-only response; h serves the others.
func (s *Server) httpAuthorized(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !s.authentic(r.Header.Values(TokenHeader)) {
			s.metrics.refused.Inc()
			writeStatusOnly(w, codes.Unauthenticated, "missing or wrong job token")
			return
		}
		h.ServeHTTP(w, r)
	})
}

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

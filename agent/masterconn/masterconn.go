// Package masterconn is the agent's connection to the kfelastic master: a
// gRPC channel that sends the job's token with every call and redials
// quickly (Dial), and the retry of calls while the master is away,
// restarting or not started yet (Retry). The agent's rendezvous client and
// its store relay both call the master through it.
package masterconn

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	mathrand "math/rand/v2"
	"net"
	"path"
	"time"

	"google.golang.org/grpc"
	grpcbackoff "google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

type tokenAuth string

func (t tokenAuth) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(t)}, nil
}

// RequireTransportSecurity is false: the token guards against other jobs'
// agents on the cluster network, not against an eavesdropper (which the
// cluster's network policy is for).
func (tokenAuth) RequireTransportSecurity() bool { return false }

// staticWindow is the flow-control window of a call to the master.
const staticWindow = 4 << 20

// Dialer opens a connection to the master's address; nil is TCP.
type Dialer func(ctx context.Context, addr string) (net.Conn, error)

// Dial prepares the channel to the master at endpoint (host:port), which
// sends token with every call; it connects lazily (the master may start
// after the agents). A non-nil dial replaces TCP (tests: an in-memory
// pipe inside a testing/synctest bubble) and is handed endpoint as it is,
// unresolved.
func Dial(endpoint, token string, dial Dialer) (*grpc.ClientConn, error) {
	target := endpoint
	var extra []grpc.DialOption
	if dial != nil {
		target = "passthrough:///" + endpoint
		extra = append(extra, grpc.WithContextDialer(dial))
	}
	return grpc.NewClient(target, append([]grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithPerRPCCredentials(tokenAuth(token)),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(80<<20), grpc.MaxCallSendMsgSize(80<<20)),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 10 * time.Second, Timeout: 5 * time.Second, PermitWithoutStream: true}),
		// Fixed flow-control windows: gRPC's dynamic ones measure the
		// bandwidth-delay product with a PING after data arrives, which for
		// the small calls the master answers is a PING and its ack per
		// call. (4 MiB in flight per call is ≈20 GB/s at a cluster's
		// 0.2 ms.)
		grpc.WithStaticStreamWindowSize(staticWindow), grpc.WithStaticConnWindowSize(4 * staticWindow),
		grpc.WithChainUnaryInterceptor(unsendable),
		// gRPC's default reconnect backoff (1 s, ×1.6, up to 120 s) keeps
		// agents away from a restarted master for seconds after it serves
		// again (7 s after a 3 s outage, measured); the calls retry every
		// ≤ 2 s anyway, so the channel redials about as often.
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: grpcbackoff.Config{BaseDelay: 100 * time.Millisecond,
			Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second}, MinConnectTimeout: 5 * time.Second}),
	}, extra...)...)
}

// UnsendableError is a call whose request gRPC cannot encode: a string
// field that is not valid UTF-8 (a pod or node name), which protobuf
// refuses. gRPC reports it as INTERNAL, as it reports a master's failure,
// so it was retried as an unreachable master; no retry can send it.
type UnsendableError struct {
	Method string // the call's full method name
	Err    error  // protobuf's refusal
}

func (e *UnsendableError) Error() string {
	return fmt.Sprintf("cannot send %s to the master: %v", path.Base(e.Method), e.Err)
}

func (e *UnsendableError) Unwrap() error { return e.Err }

// unsendable tells a request that gRPC could not encode from an INTERNAL
// answer of the master by encoding it again, only once a call failed
// INTERNAL: a call that passes costs nothing more.
func unsendable(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoke grpc.UnaryInvoker,
	opts ...grpc.CallOption) error {
	err := invoke(ctx, method, req, reply, cc, opts...)
	if status.Code(err) == codes.Internal {
		if m, ok := req.(proto.Message); ok {
			if _, merr := proto.Marshal(m); merr != nil {
				return &UnsendableError{Method: method, Err: merr}
			}
		}
	}
	return err
}

// Transient reports whether a call failed because the master is away
// (restarting, not yet started, network): retried, not fatal. A request
// that cannot be sent (UnsendableError) is not.
func Transient(err error) bool {
	var u *UnsendableError
	if errors.As(err, &u) {
		return false
	}
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled, codes.Aborted, codes.Internal, codes.Unknown:
		return true
	}
	return false
}

// Retry runs call, with backoff, until it succeeds, fails for good
// (!Transient), ctx ends, or (giveUp > 0) the master was unreachable for
// giveUp, which gaveUp reports. The first failure is logged once, with
// attrs.
func Retry(ctx context.Context, log *slog.Logger, giveUp time.Duration, call func(ctx context.Context) error,
	attrs ...any) (gaveUp bool, err error) {
	backoff := 100 * time.Millisecond
	var since time.Time
	for {
		err := call(ctx)
		if err == nil || ctx.Err() != nil || !Transient(err) {
			if ctx.Err() != nil {
				return false, ctx.Err()
			}
			return false, err
		}
		if since.IsZero() {
			since = time.Now()
			log.Warn("master unreachable; retrying", append(attrs, "err", status.Convert(err).Message())...)
		}
		if giveUp > 0 && time.Since(since) > giveUp {
			return true, err
		}
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-time.After(backoff + mathrand.N(backoff/2+1)):
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

package h2_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/kfelastic/kfelastic/api/masterpb"
	"github.com/kfelastic/kfelastic/master/h2"
)

// The tests serve the master's protocol (masterpb) with a stand-in
// service: Status, and the store's set and get, nothing of the master.

const (
	token              = "h2-test-token"
	maxMessageBytes    = 80 << 20
	maxConcurrentCalls = 1024
)

type testService struct {
	masterpb.UnimplementedMasterServer
	mu sync.Mutex
	kv map[string][]byte
}

func (*testService) Status(context.Context, *masterpb.StatusRequest) (*masterpb.StatusResponse, error) {
	return &masterpb.StatusResponse{Job: "h2"}, nil
}

func (s *testService) Store(_ context.Context, req *masterpb.StoreRequest) (*masterpb.StoreResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch op := req.GetOp().(type) {
	case *masterpb.StoreRequest_Set:
		s.kv[op.Set.GetKey()] = op.Set.GetValue()
		return &masterpb.StoreResponse{}, nil
	case *masterpb.StoreRequest_Get:
		v, ok := s.kv[op.Get.GetKey()]
		if !ok {
			return nil, status.Error(codes.NotFound, "no such key")
		}
		return &masterpb.StoreResponse{Value: v}, nil
	}
	return nil, status.Error(codes.Unimplemented, "only set and get")
}

// serve serves the stand-in service on a loopback port until ctx ends,
// with cfg's bounds where set (the tests' defaults otherwise); it returns
// the server, its address, and Serve's result once Stop returned.
func serve(t *testing.T, ctx context.Context, cfg h2.Config) (*h2.Server, string, <-chan error) {
	t.Helper()
	cfg.Service, cfg.Impl = &masterpb.Master_ServiceDesc, &testService{kv: map[string][]byte{}}
	cfg.TokenHeader = "authorization"
	cfg.Authorize = func(values []string) error {
		for _, v := range values {
			if tok, ok := strings.CutPrefix(v, "Bearer "); ok && tok == token {
				return nil
			}
		}
		return status.Error(codes.Unauthenticated, "missing or wrong job token")
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if cfg.AuthTimeout == 0 {
		cfg.AuthTimeout = 10 * time.Second
	}
	if cfg.MaxConns == 0 {
		cfg.MaxConns = 20000
	}
	cfg.MaxConcurrentCalls, cfg.MaxMessageBytes, cfg.MaxHeaderListBytes = maxConcurrentCalls, maxMessageBytes, 16<<10
	s, err := h2.NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	errc, served := make(chan error, 1), make(chan error, 1)
	go func() { errc <- s.Serve(ctx, lis) }()
	go func() {
		<-ctx.Done()
		s.Stop(2 * time.Second)
		served <- <-errc
	}()
	return s, lis.Addr().String(), served
}

// start is serve with the defaults.
func start(t *testing.T, ctx context.Context) (string, <-chan error) {
	t.Helper()
	_, addr, served := serve(t, ctx, h2.Config{})
	return addr, served
}

type bearer string

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}
func (bearer) RequireTransportSecurity() bool { return false }

// dial is a grpc-go client of addr with tok.
func dial(t testing.TB, addr, tok string) masterpb.MasterClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithPerRPCCredentials(bearer(tok)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return masterpb.NewMasterClient(conn)
}

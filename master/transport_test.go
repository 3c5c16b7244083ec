package master_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/kfelastic/kfelastic/api/masterpb"
	"github.com/kfelastic/kfelastic/internal/test/h2test"
	"github.com/kfelastic/kfelastic/internal/test/mastertest"
	"github.com/kfelastic/kfelastic/master"
)

// Every transport answers grpc-go's clients (the agents') as grpc-go's own
// server does: answers, errors with their codes and messages, the token
// refused, message sizes, deadlines and cancellation of held calls, unknown
// methods.
func TestTransports(t *testing.T) {
	for _, tr := range master.Transports {
		t.Run(string(tr), func(t *testing.T) {
			m := mastertest.StartWith(t, master.Options{Transport: tr, StateURL: "mem://",
				Job: master.Config{JobID: "tr", MinNodes: 2, MaxNodes: 2, HeartbeatTimeout: time.Minute}})
			ctx := t.Context()
			c := dial(t, m.Addr, token)
			if st, err := c.Status(ctx, &masterpb.StatusRequest{}); err != nil || st.GetJob() != "tr" {
				t.Fatalf("Status: %v %v", st, err)
			}
			for _, tok := range []string{"", "wrong"} {
				_, err := dial(t, m.Addr, tok).Status(ctx, &masterpb.StatusRequest{})
				if s, _ := status.FromError(err); s.Code() != codes.Unauthenticated || s.Message() != "missing or wrong job token" {
					t.Errorf("token %q: %v, want Unauthenticated", tok, err)
				}
			}
			// A service error: its code and message.
			_, err := c.Store(ctx, &masterpb.StoreRequest{Client: "x", Seq: 1})
			if s, _ := status.FromError(err); s.Code() != codes.InvalidArgument || !strings.Contains(s.Message(), "no store operation") {
				t.Errorf("Store without an operation: %v, want InvalidArgument", err)
			}
			// Values as large as the store takes, both ways.
			value := make([]byte, 4<<20)
			value[len(value)-1] = 7
			set := &masterpb.StoreRequest{Client: "x", Seq: 1, Op: &masterpb.StoreRequest_Set{Set: &masterpb.StoreSet{Key: "k", Value: value}}}
			if _, err := c.Store(ctx, set, grpc.MaxCallSendMsgSize(master.MaxMessageBytes)); err != nil {
				t.Fatalf("a 4 MiB set: %v", err)
			}
			get := &masterpb.StoreRequest{Client: "x", Seq: 2, Op: &masterpb.StoreRequest_Get{Get: &masterpb.StoreGet{Key: "k"}}}
			res, err := c.Store(ctx, get, grpc.MaxCallRecvMsgSize(master.MaxMessageBytes))
			if err != nil || len(res.GetValue()) != len(value) || res.GetValue()[len(value)-1] != 7 {
				t.Fatalf("get of the 4 MiB value: %d bytes, %v", len(res.GetValue()), err)
			}
			// A message over the limit is refused, not read.
			huge := &masterpb.StoreRequest{Client: "x", Seq: 3, Op: &masterpb.StoreRequest_Set{Set: &masterpb.StoreSet{Key: "h",
				Value: make([]byte, master.MaxMessageBytes)}}}
			_, err = c.Store(ctx, huge, grpc.MaxCallSendMsgSize(2*master.MaxMessageBytes))
			if status.Code(err) != codes.ResourceExhausted {
				t.Errorf("a message over %d bytes: %v, want ResourceExhausted", master.MaxMessageBytes, err)
			}
			// A held call ends at the caller's deadline, and when the caller
			// cancels it.
			join := &masterpb.JoinRequest{Node: &masterpb.Node{Pod: "p0", Incarnation: "1", Rank: -1, LocalWorldSize: 1,
				Addr: "127.0.0.1", Port: 1}, WaitMs: 60000}
			short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			start := time.Now()
			_, err = c.Join(short, join)
			cancel()
			if status.Code(err) != codes.DeadlineExceeded || time.Since(start) > 5*time.Second {
				t.Errorf("a held Join with a 300 ms deadline: %v after %s, want DeadlineExceeded", err, time.Since(start))
			}
			canceled, cancel := context.WithCancel(ctx)
			time.AfterFunc(300*time.Millisecond, cancel)
			_, err = c.Join(canceled, join)
			if status.Code(err) != codes.Canceled {
				t.Errorf("a held Join canceled: %v, want Canceled", err)
			}
			// The master still answers on the same connection.
			if st, err := c.Status(ctx, &masterpb.StatusRequest{}); err != nil || len(st.GetNodes()) != 1 {
				t.Errorf("Status after the held calls: %v %v", st, err)
			}
			conn, err := grpc.NewClient(m.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithPerRPCCredentials(bearer(token)))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			err = conn.Invoke(ctx, "/kfelastic.master.v1.Master/NoSuchMethod", &masterpb.StatusRequest{}, &masterpb.StatusResponse{})
			if status.Code(err) != codes.Unimplemented {
				t.Errorf("an unknown method: %v, want Unimplemented", err)
			}
		})
	}
}

// A request that does not decode, such as a pod name that is not UTF-8
// (protobuf's strings must be; grpc-go's client refuses to send one, a
// client of another language may not), is answered INVALID_ARGUMENT under
// either transport, as a request no retry fixes: grpc-go answered
// INTERNAL, which the agents retry for 10 minutes.
func TestTransportsRefuseUndecodableRequests(t *testing.T) {
	for _, tr := range master.Transports {
		t.Run(string(tr), func(t *testing.T) {
			m := mastertest.StartWith(t, master.Options{Transport: tr, StateURL: "mem://",
				Job: master.Config{JobID: "utf8", MinNodes: 2, MaxNodes: 2, HeartbeatTimeout: time.Minute}})
			conn, err := grpc.NewClient(m.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithPerRPCCredentials(bearer(token)))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			node := &masterpb.Node{Pod: "pod-@@", Incarnation: "1", Rank: -1, LocalWorldSize: 1, Addr: "127.0.0.1", Port: 1, Host: "node-@@"}
			for method, req := range map[string]proto.Message{
				"Join":      &masterpb.JoinRequest{Node: node, WaitMs: 100},
				"Heartbeat": &masterpb.HeartbeatRequest{Node: node, WaitMs: 100},
			} {
				b, err := proto.Marshal(req)
				if err != nil {
					t.Fatal(err)
				}
				b = bytes.ReplaceAll(b, []byte("@@"), []byte("\xff\xfe"))
				err = conn.Invoke(t.Context(), "/kfelastic.master.v1.Master/"+method, b, &emptypb.Empty{}, grpc.ForceCodecV2(rawCodec{}))
				if s, _ := status.FromError(err); s.Code() != codes.InvalidArgument || !strings.Contains(s.Message(), "invalid UTF-8") {
					t.Errorf("%s with a name that is not UTF-8: %v, want InvalidArgument saying so", method, err)
				}
			}
			if st, err := dial(t, m.Addr, token).Status(t.Context(), &masterpb.StatusRequest{}); err != nil || len(st.GetNodes()) != 0 {
				t.Errorf("Status after the refusals: %v %v, want no node", st, err)
			}
		})
	}
}

// rawCodec sends a request's bytes as they are, as a client that does not
// check them would; answers decode as protobuf's codec does.
type rawCodec struct{}

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(v.([]byte))}, nil
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	return proto.Unmarshal(data.Materialize(), v.(proto.Message))
}

func (rawCodec) Name() string { return "proto" }

// Whatever the transport, a master that stops answers the calls it holds
// UNAVAILABLE "master stopping" (the agents redial and retry; it used to
// be INTERNAL) and Serve returns at once.
func TestTransportsStop(t *testing.T) {
	for _, tr := range master.Transports {
		t.Run(string(tr), func(t *testing.T) {
			ctx, stop := context.WithCancel(t.Context())
			defer stop()
			addr, served := serveMaster(t, ctx, tr, master.Config{JobID: "stop", MinNodes: 2, MaxNodes: 2, HeartbeatTimeout: time.Minute})
			c := dial(t, addr, token)
			if _, err := c.Status(t.Context(), &masterpb.StatusRequest{}); err != nil {
				t.Fatal(err)
			}
			held := make(chan error, 1)
			go func() {
				_, err := c.Join(t.Context(), &masterpb.JoinRequest{Node: &masterpb.Node{Pod: "p0", Incarnation: "1", Rank: -1,
					LocalWorldSize: 1, Addr: "127.0.0.1", Port: 1}, WaitMs: 60000})
				held <- err
			}()
			time.Sleep(300 * time.Millisecond)
			start := time.Now()
			stop()
			select {
			case err := <-held:
				if s := status.Convert(err); s.Code() != codes.Unavailable || !strings.Contains(s.Message(), "master stopping") {
					t.Errorf("the held Join as the master stopped: %v, want Unavailable \"master stopping\"", err)
				}
			case <-time.After(5 * time.Second):
				t.Error("the held Join was not answered as the master stopped")
			}
			select {
			case err := <-served:
				if err != nil && !errors.Is(err, context.Canceled) {
					t.Errorf("Serve: %v", err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("Serve did not return")
			}
			if d := time.Since(start); d > 3*time.Second {
				t.Errorf("stopping took %s", d)
			}
			// Nothing listens any more.
			if conn, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
				conn.Close()
				t.Error("the master's port still accepts connections")
			}
		})
	}
}

// Whatever the transport, one connection holds at most
// master.MaxConcurrentCalls calls: the bound is advertised
// (SETTINGS_MAX_CONCURRENT_STREAMS), a call past it is refused with
// RST_STREAM REFUSED_STREAM and costs the master no goroutine, the calls
// within it are answered, and the connection goes on serving. A client
// written frame by frame: grpc-go's would wait for a free stream instead.
func TestTransportsBoundConcurrentCalls(t *testing.T) {
	const extra = 2048
	for _, tr := range master.Transports {
		t.Run(string(tr), func(t *testing.T) {
			addr, _ := serveMaster(t, t.Context(), tr, master.Config{JobID: "bound", MinNodes: 1, MaxNodes: 1})
			r := h2test.Dial(t, addr, 65535)
			// What the master sends, read as it comes (a frame is valid only
			// until the next read).
			type frame struct {
				typ      http2.FrameType
				stream   uint32
				code     http2.ErrCode
				ended    bool
				settings map[http2.SettingID]uint32
				status   string // grpc-status of a header block
				fields   []hpack.HeaderField
			}
			frames := make(chan frame, 8192)
			go func() {
				defer close(frames)
				for {
					f, err := r.Fr.ReadFrame()
					if err != nil {
						return
					}
					x := frame{typ: f.Header().Type, stream: f.Header().StreamID}
					switch f := f.(type) {
					case *http2.RSTStreamFrame:
						x.code = f.ErrCode
					case *http2.MetaHeadersFrame:
						x.ended, x.status, x.fields = f.StreamEnded(), h2test.HeaderValue(f, "grpc-status"), slices.Clone(f.Fields)
					case *http2.SettingsFrame:
						if !f.IsAck() {
							x.settings = map[http2.SettingID]uint32{}
							_ = f.ForeachSetting(func(s http2.Setting) error { x.settings[s.ID] = s.Val; return nil })
						}
					}
					frames <- x
				}
			}()
			next := func() frame {
				t.Helper()
				select {
				case f, ok := <-frames:
					if !ok {
						t.Fatal("the master closed the connection")
					}
					return f
				case <-time.After(20 * time.Second):
					t.Fatal("no frame from the master for 20 s")
				}
				return frame{}
			}
			// The bound is advertised.
			for advertised := false; !advertised; {
				if f := next(); f.settings != nil {
					if v, ok := f.settings[http2.SettingMaxConcurrentStreams]; !ok || v != master.MaxConcurrentCalls {
						t.Fatalf("SETTINGS_MAX_CONCURRENT_STREAMS %d (set %v), want %d", v, ok, master.MaxConcurrentCalls)
					}
					advertised = true
				}
			}
			runtime.GC()
			goroutines := runtime.NumGoroutine()
			var before runtime.MemStats
			runtime.ReadMemStats(&before)
			// The bound's worth of held calls (TCPStore WAITs for a key that
			// is not there), then more.
			wait := &masterpb.StoreRequest{Client: "w", Op: &masterpb.StoreRequest_Wait{Wait: &masterpb.StoreWait{
				Keys: []string{"k"}, TimeoutMs: 60000}}}
			id := uint32(1)
			for range master.MaxConcurrentCalls + extra {
				r.Call(id, "Store", token, wait)
				id += 2
			}
			held := map[uint32]bool{}
			for range extra {
				switch f := next(); f.typ {
				case http2.FrameRSTStream:
					if f.code != http2.ErrCodeRefusedStream || f.stream <= 2*master.MaxConcurrentCalls {
						t.Fatalf("RST_STREAM %d %v, want REFUSED_STREAM for the calls past the first %d", f.stream, f.code,
							master.MaxConcurrentCalls)
					}
				case http2.FrameHeaders:
					t.Fatalf("an answer while every call is held: stream %d %v", f.stream, f.fields)
				default:
					// WINDOW_UPDATE, SETTINGS ack
				}
			}
			runtime.GC()
			var after runtime.MemStats
			runtime.ReadMemStats(&after)
			grown := runtime.NumGoroutine() - goroutines
			heap := int64(after.HeapInuse) - int64(before.HeapInuse)
			t.Logf("%d calls held, %d refused: %d more goroutines, heap in use %+d KiB", master.MaxConcurrentCalls, extra,
				grown, heap>>10)
			if grown > master.MaxConcurrentCalls+64 {
				t.Errorf("%d more goroutines for %d calls held and %d refused, want at most %d", grown,
					master.MaxConcurrentCalls, extra, master.MaxConcurrentCalls+64)
			}
			if heap > 64<<20 {
				t.Errorf("heap in use grew by %d MiB", heap>>20)
			}
			// The key comes: every held call is answered, and the connection
			// still takes calls.
			set := &masterpb.StoreRequest{Client: "s", Seq: 1, Op: &masterpb.StoreRequest_Set{Set: &masterpb.StoreSet{Key: "k", Value: []byte("v")}}}
			if _, err := dial(t, addr, token).Store(t.Context(), set); err != nil {
				t.Fatal(err)
			}
			for len(held) < master.MaxConcurrentCalls {
				if f := next(); f.typ == http2.FrameHeaders && f.ended {
					if f.stream > 2*master.MaxConcurrentCalls || f.status != "0" {
						t.Fatalf("stream %d ended with %v", f.stream, f.fields)
					}
					held[f.stream] = true
				}
			}
			// Calls the peer resets count until their handlers have returned
			// (HTTP/2 "rapid reset" starts no handler past the bound); then
			// the connection takes calls again.
			wait.GetWait().Keys = []string{"k2"}
			first := id
			for range master.MaxConcurrentCalls {
				r.Call(id, "Store", token, wait)
				id += 2
			}
			for s := first; s < id; s += 2 {
				if err := r.Fr.WriteRSTStream(s, http2.ErrCodeCancel); err != nil {
					t.Fatal(err)
				}
			}
			deadline := time.Now().Add(10 * time.Second)
			for answered := false; !answered; {
				if time.Now().After(deadline) {
					t.Fatal("no call taken 10 s after the peer reset its calls")
				}
				r.Call(id, "Status", token, &masterpb.StatusRequest{})
				for done := false; !done; {
					switch f := next(); {
					case f.stream != id:
					case f.typ == http2.FrameRSTStream && f.code == http2.ErrCodeRefusedStream:
						done = true
						time.Sleep(10 * time.Millisecond)
					case f.typ == http2.FrameHeaders && f.ended:
						if f.status != "0" {
							t.Fatalf("stream %d ended with %v", f.stream, f.fields)
						}
						done, answered = true, true
					}
				}
				id += 2
			}
		})
	}
}

// serveMaster serves a master on transport tr with job's config and an
// in-memory state on a loopback port until ctx ends; it returns the
// address and Serve's result.
func serveMaster(t *testing.T, ctx context.Context, tr master.Transport, job master.Config) (string, <-chan error) {
	t.Helper()
	_, addr, served := serveWith(t, ctx, master.Options{Transport: tr, Job: job})
	return addr, served
}

// serveWith is serveMaster with opts (the token and state set here).
func serveWith(t *testing.T, ctx context.Context, opts master.Options) (*master.Server, string, <-chan error) {
	t.Helper()
	opts.Token, opts.StateURL = token, "mem://"
	s, err := master.NewServer(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- s.Serve(ctx, lis) }()
	return s, lis.Addr().String(), served
}

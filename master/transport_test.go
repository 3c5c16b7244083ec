package master_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/kfelastic/kfelastic/api/masterpb"
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

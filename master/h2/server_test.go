package h2_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"google.golang.org/grpc"

	"github.com/kfelastic/kfelastic/api/masterpb"
	"github.com/kfelastic/kfelastic/internal/test/h2test"
	"github.com/kfelastic/kfelastic/internal/test/testenv"
	"github.com/kfelastic/kfelastic/master/h2"
)

// Pings closer than 5 s, with nothing sent between them, end the
// connection as grpc-go's enforcement policy does: GOAWAY
// ENHANCE_YOUR_CALM "too_many_pings". Calls refused for want of the token
// are nothing sent (grpc-go's server counts them so too): their refusals
// once forgave the pings, and a peer without the token could ping without
// end.
func TestPingFlood(t *testing.T) {
	addr, _ := start(t, t.Context())
	for _, refused := range []bool{false, true} {
		t.Run(fmt.Sprintf("refused_calls_between=%v", refused), func(t *testing.T) {
			r := h2test.Dial(t, addr, 65535)
			for i := range 4 {
				if refused {
					r.Call(uint32(2*i+1), "Status", "wrong", &masterpb.StatusRequest{})
				}
				if err := r.Fr.WritePing(false, [8]byte{byte(i)}); err != nil {
					t.Fatal(err)
				}
			}
			r.NC.SetReadDeadline(time.Now().Add(10 * time.Second))
			acks := 0
			for {
				f, err := r.Fr.ReadFrame()
				if err != nil {
					t.Fatalf("no GOAWAY after a ping flood (%d pings answered): %v", acks, err)
				}
				switch f := f.(type) {
				case *http2.PingFrame:
					if f.IsAck() {
						if acks++; acks == 4 {
							t.Fatal("every ping answered, no GOAWAY")
						}
					}
				case *http2.GoAwayFrame:
					if f.ErrCode != http2.ErrCodeEnhanceYourCalm || string(f.DebugData()) != "too_many_pings" {
						t.Errorf("GOAWAY %v %q, want ENHANCE_YOUR_CALM too_many_pings", f.ErrCode, f.DebugData())
					}
					if acks != 3 {
						t.Errorf("%d pings answered before the GOAWAY, want 3", acks)
					}
					return
				}
			}
		})
	}
}

// A peer that asks for a large answer and reads nothing holds a write of
// the server's; the server still stops within its grace.
func TestStopWithPeerNotReading(t *testing.T) {
	ctx, stop := context.WithCancel(t.Context())
	defer stop()
	addr, served := start(t, ctx)
	c := dial(t, addr, token)
	value := make([]byte, 32<<20)
	set := &masterpb.StoreRequest{Client: "x", Seq: 1, Op: &masterpb.StoreRequest_Set{Set: &masterpb.StoreSet{Key: "k", Value: value}}}
	if _, err := c.Store(t.Context(), set, grpc.MaxCallSendMsgSize(maxMessageBytes)); err != nil {
		t.Fatal(err)
	}
	r := h2test.Dial(t, addr, 1<<30)
	r.Call(1, "Store", token, &masterpb.StoreRequest{Client: "y", Seq: 1, Op: &masterpb.StoreRequest_Get{Get: &masterpb.StoreGet{Key: "k"}}})
	time.Sleep(500 * time.Millisecond) // the answer fills the socket's buffers
	start := time.Now()
	stop()
	select {
	case <-served:
		if d := time.Since(start); d > 4*time.Second {
			t.Errorf("stopping took %s", d)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return: a write to a peer that reads nothing held it")
	}
}

// A call without the token is answered on its headers (trailers-only,
// UNAUTHENTICATED) and its sender told to stop (RST_STREAM NO_ERROR); what
// it still sends is dropped, and the connection goes on serving.
func TestRefusedCallNotRead(t *testing.T) {
	addr, _ := start(t, t.Context())
	r := h2test.Dial(t, addr, 65535)
	get := &masterpb.StoreRequest{Client: "y", Seq: 1, Op: &masterpb.StoreRequest_Get{Get: &masterpb.StoreGet{Key: "k"}}}
	r.Call(1, "Store", "wrong", get)
	r.Call(3, "Status", token, &masterpb.StatusRequest{})
	r.NC.SetReadDeadline(time.Now().Add(10 * time.Second))
	var refused, reset, answered bool
	for !answered {
		f, err := r.Fr.ReadFrame()
		if err != nil {
			t.Fatalf("refused %v, reset %v, answered %v: %v", refused, reset, answered, err)
		}
		switch f := f.(type) {
		case *http2.MetaHeadersFrame:
			switch f.StreamID {
			case 1:
				if !f.StreamEnded() || f.PseudoValue("status") != "200" || h2test.HeaderValue(f, "grpc-status") != "16" ||
					h2test.HeaderValue(f, "grpc-message") != "missing or wrong job token" {
					t.Errorf("the refused call's answer: end %v, %v", f.StreamEnded(), f.Fields)
				}
				refused = true
			case 3:
				if f.StreamEnded() {
					if h2test.HeaderValue(f, "grpc-status") != "0" {
						t.Errorf("the call with the token: %v", f.Fields)
					}
					answered = true
				}
			}
		case *http2.RSTStreamFrame:
			if f.StreamID != 1 || f.ErrCode != http2.ErrCodeNo || !refused {
				t.Errorf("RST_STREAM %d %v (after the answer: %v), want 1 NO_ERROR after it", f.StreamID, f.ErrCode, refused)
			}
			reset = true
		}
	}
	if !refused || !reset {
		t.Errorf("refused %v, reset %v", refused, reset)
	}
}

// A call's message is kept as it arrives, not allocated at the size its
// length prefix declares: a peer that declares 1,024 messages of 80 MiB
// and sends 2 bytes of each has the server hold a few bytes each (it once
// reserved 256 KiB each), and they are let go with the connection.
func TestDeclaredSizeNotAllocated(t *testing.T) {
	s, addr, _ := serve(t, t.Context(), h2.Config{})
	r := h2test.Dial(t, addr, 65535)
	synced := [8]byte{'s', 'y', 'n', 'c'}
	read := make(chan struct{})
	go func() { // the server's frames, drained until the ping's answer
		defer close(read)
		for {
			f, err := r.Fr.ReadFrame()
			if p, ok := f.(*http2.PingFrame); err != nil || ok && p.IsAck() && p.Data == synced {
				return
			}
		}
	}()
	const calls = maxConcurrentCalls
	id := uint32(1)
	for range calls {
		r.Headers(id, "Store", token)
		prefix := binary.BigEndian.AppendUint32([]byte{0}, maxMessageBytes)
		if err := r.Fr.WriteData(id, false, append(prefix, 0x0a, 0x01)); err != nil {
			t.Fatal(err)
		}
		id += 2
	}
	// The server reads frames in order: once the ping is answered, every
	// call before it was read.
	if err := r.Fr.WritePing(false, synced); err != nil {
		t.Fatal(err)
	}
	select {
	case <-read:
	case <-time.After(20 * time.Second):
		t.Fatal("the ping after the calls not answered in 20 s")
	}
	held := s.Receiving()
	t.Logf("%d calls declaring %d MiB each, 7 bytes sent: %d bytes held for them", calls, maxMessageBytes>>20, held)
	if held < 7*calls || held > 16*calls {
		t.Errorf("%d bytes held for %d calls of 7 bytes, want 7 to 16 each", held, calls)
	}
	r.NC.Close()
	for deadline := time.Now().Add(10 * time.Second); s.Receiving() != 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d bytes still held 10 s after the connection closed", s.Receiving())
		}
	}
}

// A SETTINGS value out of its range (RFC 9113 §6.5.2) is a connection
// error: GOAWAY PROTOCOL_ERROR (FLOW_CONTROL_ERROR for the initial
// window), and the connection closes; the server goes on serving. A frame
// size of 0, once taken, had the refusal of a call without the token loop
// without end writing empty frames, under the connection's lock.
func TestInvalidSettings(t *testing.T) {
	addr, _ := start(t, t.Context())
	for _, tc := range []struct {
		setting http2.Setting
		want    http2.ErrCode
	}{
		{http2.Setting{ID: http2.SettingMaxFrameSize, Val: 0}, http2.ErrCodeProtocol},
		{http2.Setting{ID: http2.SettingMaxFrameSize, Val: 16383}, http2.ErrCodeProtocol},
		{http2.Setting{ID: http2.SettingMaxFrameSize, Val: 1 << 24}, http2.ErrCodeProtocol},
		{http2.Setting{ID: http2.SettingEnablePush, Val: 2}, http2.ErrCodeProtocol},
		{http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1 << 31}, http2.ErrCodeFlowControl},
	} {
		t.Run(fmt.Sprintf("%v=%d", tc.setting.ID, tc.setting.Val), func(t *testing.T) {
			r := h2test.Dial(t, addr, 65535)
			if err := r.Fr.WriteSettings(tc.setting); err != nil {
				t.Fatal(err)
			}
			r.NC.SetReadDeadline(time.Now().Add(10 * time.Second))
			acks := 0
			for {
				f, err := r.Fr.ReadFrame()
				if err != nil {
					t.Fatalf("no GOAWAY: %v", err)
				}
				if s, ok := f.(*http2.SettingsFrame); ok && s.IsAck() {
					// The first acknowledges rawDial's settings.
					if acks++; acks == 2 {
						t.Fatal("the server took the setting")
					}
				}
				if g, ok := f.(*http2.GoAwayFrame); ok {
					if g.ErrCode != tc.want {
						t.Errorf("GOAWAY %v, want %v", g.ErrCode, tc.want)
					}
					break
				}
			}
			if f, err := r.Fr.ReadFrame(); err == nil {
				t.Errorf("the connection still open after GOAWAY: %v", f)
			}
		})
	}
	if _, err := dial(t, addr, token).Status(t.Context(), &masterpb.StatusRequest{}); err != nil {
		t.Fatal(err)
	}
}

// A connection that has made no call with the token within
// ConnLimits.AuthTimeout is closed, whether it made none or only calls
// refused; one that has made one stays open.
func TestUnauthenticatedConnClosed(t *testing.T) {
	const limit = 300 * time.Millisecond
	_, addr, _ := serve(t, t.Context(), h2.Config{AuthTimeout: limit})
	start := time.Now()
	idle, refused, authed := h2test.Dial(t, addr, 65535), h2test.Dial(t, addr, 65535), h2test.Dial(t, addr, 65535)
	refused.Call(1, "Status", "wrong", &masterpb.StatusRequest{})
	authed.Call(1, "Status", token, &masterpb.StatusRequest{})
	for name, r := range map[string]*h2test.RawConn{"idle": idle, "refused": refused} {
		r.NC.SetReadDeadline(time.Now().Add(10 * time.Second))
		for {
			if _, err := r.Fr.ReadFrame(); err != nil {
				if d := time.Since(start); d < limit || errors.Is(err, os.ErrDeadlineExceeded) {
					t.Errorf("%s connection: %v after %s, want it closed after %s", name, err, d, limit)
				}
				break
			}
		}
	}
	time.Sleep(limit)
	authed.Call(3, "Status", token, &masterpb.StatusRequest{})
	authed.NC.SetReadDeadline(time.Now().Add(10 * time.Second))
	for {
		f, err := authed.Fr.ReadFrame()
		if err != nil {
			t.Fatalf("the connection with a call with the token, after %s: %v", time.Since(start), err)
		}
		if h, ok := f.(*http2.MetaHeadersFrame); ok && h.StreamID == 3 && h.StreamEnded() {
			break
		}
	}
}

// Connections past ConnLimits.MaxConns are closed as they are accepted,
// and said so in one log line, not one each; once one closes, another is
// served.
func TestMaxConns(t *testing.T) {
	var logged testenv.SyncBuffer
	_, addr, _ := serve(t, t.Context(), h2.Config{MaxConns: 2, AuthTimeout: time.Hour,
		Log: slog.New(slog.NewTextHandler(&logged, nil))})
	// served reports whether a new connection is served (its first frame
	// is the server's SETTINGS), or closed at once.
	served := func() bool {
		t.Helper()
		nc, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		nc.Write([]byte(http2.ClientPreface)) // fails where the server closed it first
		nc.SetReadDeadline(time.Now().Add(10 * time.Second))
		f, err := http2.NewFramer(nil, nc).ReadFrame()
		if errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatal("neither served nor closed in 10 s")
		}
		return err == nil && f.Header().Type == http2.FrameSettings
	}
	a, b := h2test.Dial(t, addr, 65535), h2test.Dial(t, addr, 65535)
	for _, r := range []*h2test.RawConn{a, b} {
		if f, err := r.Fr.ReadFrame(); err != nil || f.Header().Type != http2.FrameSettings {
			t.Fatalf("a connection within the bound: %v %v", f, err)
		}
	}
	for i := range 50 {
		if served() {
			t.Fatalf("connection %d past the bound served", i+1)
		}
	}
	if n := strings.Count(logged.String(), "connections refused: too many open"); n != 1 {
		t.Errorf("%d lines logged for 50 connections refused, want 1:\n%s", n, logged.String())
	}
	a.NC.Close()
	for deadline := time.Now().Add(10 * time.Second); !served(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no new connection served 10 s after one closed")
		}
	}
}

// Frames on streams that are not open (RFC 9113 §5.1): DATA on a stream
// the peer ended gets RST_STREAM STREAM_CLOSED and the connection goes on;
// DATA, RST_STREAM or WINDOW_UPDATE on an idle stream (one the peer never
// opened) end the connection with GOAWAY PROTOCOL_ERROR, and a connection
// window past 2^31-1 with FLOW_CONTROL_ERROR (§6.9.1). What a peer still
// sends of a call refused before it ended is dropped
// (TestRefusedCallNotRead).
func TestStreamStates(t *testing.T) {
	addr, _ := start(t, t.Context())
	// next reads frames until one of typ, skipping the rest.
	next := func(t *testing.T, r *h2test.RawConn, typ http2.FrameType) http2.Frame {
		t.Helper()
		r.NC.SetReadDeadline(time.Now().Add(10 * time.Second))
		for {
			f, err := r.Fr.ReadFrame()
			if err != nil {
				t.Fatalf("no %v frame: %v", typ, err)
			}
			if f.Header().Type == typ {
				return f
			}
		}
	}
	r := h2test.Dial(t, addr, 65535)
	r.Call(1, "Status", token, &masterpb.StatusRequest{})
	for {
		if h := next(t, r, http2.FrameHeaders).(*http2.MetaHeadersFrame); h.StreamEnded() {
			break
		}
	}
	if err := r.Fr.WriteData(1, true, []byte("late")); err != nil {
		t.Fatal(err)
	}
	if f := next(t, r, http2.FrameRSTStream).(*http2.RSTStreamFrame); f.StreamID != 1 || f.ErrCode != http2.ErrCodeStreamClosed {
		t.Errorf("DATA on a closed stream: RST_STREAM %d %v, want 1 STREAM_CLOSED", f.StreamID, f.ErrCode)
	}
	r.Call(3, "Status", token, &masterpb.StatusRequest{}) // the connection goes on
	for {
		if h := next(t, r, http2.FrameHeaders).(*http2.MetaHeadersFrame); h.StreamID == 3 && h.StreamEnded() {
			break
		}
	}
	for _, tc := range []struct {
		name string
		send func(fr *http2.Framer) error
		want http2.ErrCode
	}{
		{"idle DATA", func(fr *http2.Framer) error { return fr.WriteData(5, true, []byte("x")) }, http2.ErrCodeProtocol},
		{"idle RST_STREAM", func(fr *http2.Framer) error { return fr.WriteRSTStream(5, http2.ErrCodeCancel) }, http2.ErrCodeProtocol},
		{"idle WINDOW_UPDATE", func(fr *http2.Framer) error { return fr.WriteWindowUpdate(5, 100) }, http2.ErrCodeProtocol},
		{"window overflow", func(fr *http2.Framer) error { return fr.WriteWindowUpdate(0, 1<<31-1) }, http2.ErrCodeFlowControl},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := h2test.Dial(t, addr, 65535)
			r.Call(3, "Status", token, &masterpb.StatusRequest{})
			if err := tc.send(r.Fr); err != nil {
				t.Fatal(err)
			}
			if f := next(t, r, http2.FrameGoAway).(*http2.GoAwayFrame); f.ErrCode != tc.want {
				t.Errorf("GOAWAY %v, want %v", f.ErrCode, tc.want)
			}
		})
	}
}

// A request that is not one (RFC 9113 §8.1.1: a pseudo-header missing, a
// connection-specific header, TE other than "trailers"; §5.3.1: a stream
// that depends on itself) is a stream error, RST_STREAM PROTOCOL_ERROR,
// with the token or without; the connection goes on.
func TestMalformedRequests(t *testing.T) {
	addr, _ := start(t, t.Context())
	without := func(name string) []string {
		var out []string
		h := h2test.CallHeaders("Status", token)
		for i := 0; i < len(h); i += 2 {
			if h[i] != name {
				out = append(out, h[i], h[i+1])
			}
		}
		return out
	}
	for _, tc := range []struct {
		name   string
		fields []string
		dep    bool
	}{
		{"no :method", without(":method"), false},
		{"no :scheme", without(":scheme"), false},
		{"no :path", without(":path"), false},
		{"empty :path", append([]string{":path", ""}, without(":path")...), false},
		{"connection", append(h2test.CallHeaders("Status", token), "connection", "keep-alive"), false},
		{"te gzip", append(without("te"), "te", "gzip"), false},
		{"depends on itself", h2test.CallHeaders("Status", token), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := h2test.Dial(t, addr, 65535)
			p := http2.HeadersFrameParam{StreamID: 1, EndHeaders: true, EndStream: true}
			if tc.dep {
				p.Priority = http2.PriorityParam{StreamDep: 1, Weight: 15}
			}
			r.WriteHeaders(p, tc.fields...)
			r.Call(3, "Status", token, &masterpb.StatusRequest{})
			r.NC.SetReadDeadline(time.Now().Add(10 * time.Second))
			var reset bool
			for {
				f, err := r.Fr.ReadFrame()
				if err != nil {
					t.Fatalf("reset %v: %v", reset, err)
				}
				switch f := f.(type) {
				case *http2.RSTStreamFrame:
					if f.StreamID != 1 || f.ErrCode != http2.ErrCodeProtocol {
						t.Errorf("RST_STREAM %d %v, want 1 PROTOCOL_ERROR", f.StreamID, f.ErrCode)
					}
					reset = true
				case *http2.MetaHeadersFrame:
					if f.StreamID == 1 {
						t.Errorf("the malformed request answered: %v", f.Fields)
					}
					if f.StreamID == 3 && f.StreamEnded() {
						if !reset {
							t.Error("the malformed request not reset")
						}
						return
					}
				}
			}
		})
	}
}

package h2

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

const (
	// streamWindow and connWindow are what a peer may send ahead of the
	// server's reading, per call and per connection. Every frame is read
	// as it comes, so they bound nothing held: they set how often
	// WINDOW_UPDATE goes out for a large message.
	streamWindow = 256 << 10
	connWindow   = 1 << 20
	// prefaceTimeout bounds how long a new connection may take to send
	// the HTTP/2 preface.
	prefaceTimeout = 10 * time.Second
	// As grpc-go's server's enforcement policy (MinTime, the strikes
	// allowed): pings closer than this, more than twice in a row with
	// nothing sent between, end the connection.
	pingMinInterval = 5 * time.Second
	maxPingStrikes  = 2
	// connsRefusedLogEvery spaces the lines that say connections were
	// closed past Config.MaxConns: a flood of them logs one a minute, with
	// how many since the last.
	connsRefusedLogEvery = time.Minute
	// minFrameSize is the frame size every peer takes (RFC 9113 §4.2):
	// the writers never cut frames smaller, whatever the peer's setting.
	minFrameSize = 16384
	// maxReadFrameBytes is the largest frame read: the protocol's minimum,
	// what grpc-go's clients send anyway. The framer keeps a buffer of the
	// largest frame it read, per connection.
	maxReadFrameBytes = minFrameSize
	// maxDraining bounds conn.draining.
	maxDraining = 16
	// maxWindow is the largest a flow-control window may grow (RFC 9113
	// §6.9.1).
	maxWindow = 1<<31 - 1
)

// Config is what a Server serves and its bounds. Every field is required.
type Config struct {
	// Service is the gRPC service served; its methods must all be unary
	// (Streams is ignored), and Impl is handed to their handlers.
	Service *grpc.ServiceDesc
	Impl    any
	// TokenHeader names the header that carries a call's credentials
	// (e.g. "authorization"), and Authorize checks its values: a call it
	// refuses (an error, a gRPC status, UNAUTHENTICATED) is answered that
	// error on its headers, none of its message kept, and does not count
	// as the connection's call with the token (AuthTimeout).
	TokenHeader string
	Authorize   func(values []string) error
	Log         *slog.Logger
	// AuthTimeout closes a connection that has made no call Authorize
	// took this long after it was accepted.
	AuthTimeout time.Duration
	// MaxConns bounds the connections open at once: one accepted past it
	// is closed at once (and logged, once a minute at most).
	MaxConns int
	// MaxConcurrentCalls bounds a connection's open calls
	// (SETTINGS_MAX_CONCURRENT_STREAMS; one past it gets RST_STREAM
	// REFUSED_STREAM). Calls the peer reset count until their handlers
	// return.
	MaxConcurrentCalls int
	// MaxMessageBytes bounds one message either way: RESOURCE_EXHAUSTED
	// past it (a request's refused on its length prefix).
	MaxMessageBytes int
	// MaxHeaderListBytes bounds a call's headers
	// (SETTINGS_MAX_HEADER_LIST_SIZE).
	MaxHeaderListBytes int
}

// Server serves a Config's service on the connections of a listener.
type Server struct {
	cfg     Config
	methods map[string]*grpc.MethodDesc

	// receiving is the bytes held for the messages of calls still
	// arriving, over every connection (what a declared length must not
	// inflate).
	receiving atomic.Int64

	mu      sync.Mutex
	lis     net.Listener
	conns   map[*conn]struct{}
	closing bool
	wg      sync.WaitGroup
}

// NewServer checks cfg and returns a server for it.
func NewServer(cfg Config) (*Server, error) {
	if cfg.Service == nil || cfg.Authorize == nil || cfg.TokenHeader == "" || cfg.Log == nil || cfg.AuthTimeout <= 0 ||
		cfg.MaxConns <= 0 || cfg.MaxConcurrentCalls <= 0 || cfg.MaxMessageBytes <= 0 || cfg.MaxHeaderListBytes <= 0 {
		return nil, errors.New("h2: a Config field left empty (every one is required)")
	}
	cfg.TokenHeader = strings.ToLower(cfg.TokenHeader) // as HTTP/2 carries header names
	return &Server{cfg: cfg, methods: unaryMethods(cfg.Service), conns: map[*conn]struct{}{}}, nil
}

// Receiving is the bytes held for the messages of calls still arriving,
// over every connection.
func (t *Server) Receiving() int64 { return t.receiving.Load() }

// Serve accepts connections on lis until Stop (or lis is closed); the
// calls' contexts derive from ctx's values, not its end: Stop ends them.
func (t *Server) Serve(ctx context.Context, lis net.Listener) error {
	t.mu.Lock()
	if t.closing {
		t.mu.Unlock()
		lis.Close()
		return nil
	}
	t.lis = lis
	t.mu.Unlock()
	var delay time.Duration
	base := context.WithoutCancel(ctx) // calls outlive ctx by their answers: Stop ends them
	// Connections closed past MaxConns since the last line that said so.
	var refused int
	var refusedLogged time.Time
	for {
		nc, err := lis.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			delay = min(max(2*delay, 5*time.Millisecond), time.Second)
			t.cfg.Log.Warn("accept", "err", err, "retry_in", delay)
			select {
			case <-time.After(delay):
			case <-ctx.Done():
				return nil
			}
			continue
		}
		delay = 0
		t.mu.Lock()
		closing, full := t.closing, len(t.conns) >= t.cfg.MaxConns
		if closing || full {
			t.mu.Unlock()
			nc.Close()
			if !closing {
				refused++
				if time.Since(refusedLogged) >= connsRefusedLogEvery {
					t.cfg.Log.Warn("connections refused: too many open", "max_conns", t.cfg.MaxConns, "refused", refused)
					refused, refusedLogged = 0, time.Now()
				}
			}
			continue
		}
		c := newConn(t, nc, base)
		t.conns[c] = struct{}{}
		t.wg.Add(1)
		t.mu.Unlock()
		go func() {
			defer t.wg.Done()
			c.serve()
			t.mu.Lock()
			delete(t.conns, c)
			t.mu.Unlock()
		}()
	}
}

// Stop closes the listener and sends every connection GOAWAY: its calls in
// flight are answered and it closes once they are; after grace the rest
// are closed. A connection whose peer reads nothing (a write blocked, its
// lock held) delays neither: GOAWAY goes out from a goroutine of its own,
// and closing the socket first ends a blocked write.
func (t *Server) Stop(grace time.Duration) {
	t.mu.Lock()
	t.closing = true
	if t.lis != nil {
		t.lis.Close()
	}
	for c := range t.conns {
		go c.goAway()
	}
	t.mu.Unlock()
	done := make(chan struct{})
	go func() { t.wg.Wait(); close(done) }()
	select {
	case <-done:
		return
	case <-time.After(grace):
	}
	t.mu.Lock()
	for c := range t.conns {
		c.nc.Close()
		go c.close()
	}
	t.mu.Unlock()
	<-done
}

// conn is one connection. The reading goroutine owns the framer; the
// rest is under mu, which a call's goroutine also holds while it writes.
type conn struct {
	t      *Server
	nc     net.Conn
	fr     *http2.Framer
	ctx    context.Context // ends with the connection
	cancel context.CancelFunc

	mu   sync.Mutex
	cond *sync.Cond // window updates, resets, close
	// streams are the calls open: being received, or their handler running.
	streams map[uint32]*stream
	// orphans are the handlers still running of calls the peer reset (or
	// the server reset): gone from streams, but they count against
	// MaxConcurrentCalls until they return, or a peer that opens and
	// resets calls at once would start handlers without bound (HTTP/2
	// "rapid reset").
	orphans int
	// lastID is the highest stream the peer opened: a higher one is idle
	// (RFC 9113 §5.1), and a frame other than HEADERS or PRIORITY on it a
	// connection error.
	lastID uint32
	// draining are streams the server ended while the peer was still
	// sending (a refusal, RST_STREAM): what it still sends of them is
	// dropped, not a stream error (RFC 9113 §5.1, "closed"), until it ends
	// them. The latest maxDraining at most: one forgotten gets RST_STREAM
	// STREAM_CLOSED for its late frames, which the peer ignores.
	draining []uint32
	// authed: a call Authorize took came (Config.AuthTimeout).
	authed atomic.Bool
	// The peer's windows and settings, for what the server sends.
	sendWindow        int64
	initialSendWindow int64
	maxFrame          int
	// What the peer sent that the server has read and not credited back.
	recvUnacked int
	enc         *hpack.Encoder
	hbuf        bytes.Buffer // HPACK output, one header block at a time
	goingAway   bool
	closed      bool
	pingStrikes int
	lastPing    time.Time
	sentSince   bool // an answer of a handler's sent since the last ping
}

type stream struct {
	id         uint32
	method     *grpc.MethodDesc
	timeout    time.Duration // 0: none
	msg        []byte        // the request as received (5-byte prefix, message), until its handler runs
	want       int           // len(msg) once complete; -1 until the prefix is in
	recvUnack  int
	sendWindow int64
	running    bool // its handler runs
	reset      bool // the peer reset it, or the connection ended
	orphan     bool // reset while its handler ran: counted in orphans
	cancel     context.CancelFunc
}

func newConn(t *Server, nc net.Conn, base context.Context) *conn {
	c := &conn{t: t, nc: nc, streams: map[uint32]*stream{}, sendWindow: 65535, initialSendWindow: 65535,
		maxFrame: 16384}
	c.ctx, c.cancel = context.WithCancel(base)
	c.cond = sync.NewCond(&c.mu)
	c.fr = http2.NewFramer(nil, nc)
	c.fr.SetReuseFrames()
	c.fr.SetMaxReadFrameSize(maxReadFrameBytes)
	c.fr.MaxHeaderListSize = uint32(t.cfg.MaxHeaderListBytes)
	c.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	c.enc = hpack.NewEncoder(&c.hbuf)
	// The answers carry a few short headers: no dynamic table
	// (memory per connection), at the cost of a few bytes each.
	c.enc.SetMaxDynamicTableSizeLimit(0)
	return c
}

func (c *conn) serve() {
	defer c.close()
	// Closing the socket, not under mu, also ends a peer that reads
	// nothing: the write it blocks, and the lock that write holds.
	unauthed := time.AfterFunc(c.t.cfg.AuthTimeout, func() {
		if !c.authed.Load() {
			c.nc.Close()
		}
	})
	defer unauthed.Stop()
	c.nc.SetReadDeadline(time.Now().Add(prefaceTimeout))
	var pre [len(http2.ClientPreface)]byte
	if _, err := io.ReadFull(c.nc, pre[:]); err != nil || string(pre[:]) != http2.ClientPreface {
		if err == nil {
			// Not HTTP/2: GOAWAY PROTOCOL_ERROR (RFC 9113 §3.4), then an
			// orderly close; a close with the peer's bytes unread would
			// be a TCP reset, which may lose the GOAWAY (h2spec 3.5).
			c.mu.Lock()
			_ = c.write(func(b []byte) []byte { return appendGoAway(b, 0, http2.ErrCodeProtocol, []byte("invalid preface")) })
			c.mu.Unlock()
			lingerClose(c.nc)
		}
		return
	}
	c.mu.Lock()
	err := c.write(func(b []byte) []byte {
		b = appendSettings(b, false,
			http2.Setting{ID: http2.SettingMaxConcurrentStreams, Val: uint32(c.t.cfg.MaxConcurrentCalls)},
			http2.Setting{ID: http2.SettingMaxHeaderListSize, Val: uint32(c.t.cfg.MaxHeaderListBytes)},
			http2.Setting{ID: http2.SettingInitialWindowSize, Val: streamWindow})
		return appendWindowUpdate(b, 0, connWindow-65535)
	})
	c.mu.Unlock()
	if err != nil {
		return
	}
	for first := true; ; first = false {
		f, err := c.fr.ReadFrame()
		if first {
			c.nc.SetReadDeadline(time.Time{})
		}
		if err != nil {
			var se http2.StreamError
			if errors.As(err, &se) {
				c.mu.Lock()
				c.endStream(se.StreamID, true)
				c.drain(se.StreamID)
				werr := c.write(func(b []byte) []byte { return appendRSTStream(b, se.StreamID, se.Code) })
				c.mu.Unlock()
				if werr != nil {
					return
				}
				continue
			}
			var ce http2.ConnectionError
			if errors.Is(err, http2.ErrFrameTooLarge) {
				ce = http2.ConnectionError(http2.ErrCodeFrameSize) // RFC 9113 §4.2
			}
			if ce != 0 || errors.As(err, &ce) {
				c.mu.Lock()
				_ = c.write(func(b []byte) []byte { return appendGoAway(b, c.lastID, http2.ErrCode(ce), nil) })
				c.mu.Unlock()
			}
			return
		}
		if !c.frame(f) {
			return
		}
	}
}

// frame handles one frame read; false ends the connection.
func (c *conn) frame(f http2.Frame) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return false
	}
	switch f := f.(type) {
	case *http2.MetaHeadersFrame:
		return c.headers(f)
	case *http2.DataFrame:
		return c.data(f)
	case *http2.SettingsFrame:
		if f.IsAck() {
			return true
		}
		err := f.ForeachSetting(func(s http2.Setting) error {
			// RFC 9113 §6.5.2: a value out of range is a connection
			// error (a frame size of 0 would have the writers loop).
			if err := s.Valid(); err != nil {
				return err
			}
			switch s.ID {
			case http2.SettingInitialWindowSize:
				d := int64(s.Val) - c.initialSendWindow
				c.initialSendWindow = int64(s.Val)
				for _, st := range c.streams {
					st.sendWindow += d
				}
			case http2.SettingMaxFrameSize:
				c.maxFrame = int(s.Val)
			}
			return nil
		})
		if err != nil {
			code := http2.ErrCodeProtocol
			var ce http2.ConnectionError
			if errors.As(err, &ce) {
				code = http2.ErrCode(ce)
			}
			_ = c.write(func(b []byte) []byte { return appendGoAway(b, c.lastID, code, nil) })
			return false
		}
		c.cond.Broadcast()
		return c.write(func(b []byte) []byte { return appendSettings(b, true) }) == nil
	case *http2.WindowUpdateFrame:
		if f.StreamID > c.lastID {
			return c.connError(http2.ErrCodeProtocol) // an idle stream
		}
		if f.StreamID == 0 {
			if c.sendWindow += int64(f.Increment); c.sendWindow > maxWindow {
				return c.connError(http2.ErrCodeFlowControl)
			}
		} else if st := c.streams[f.StreamID]; st != nil {
			if st.sendWindow += int64(f.Increment); st.sendWindow > maxWindow {
				return c.streamError(st.id, http2.ErrCodeFlowControl)
			}
		}
		c.cond.Broadcast()
	case *http2.PingFrame:
		if f.IsAck() {
			return true
		}
		now := time.Now()
		if c.sentSince {
			c.pingStrikes, c.sentSince = 0, false
		} else if !c.lastPing.IsZero() && now.Sub(c.lastPing) < pingMinInterval {
			c.pingStrikes++
		}
		c.lastPing = now
		if c.pingStrikes > maxPingStrikes {
			_ = c.write(func(b []byte) []byte {
				return appendGoAway(b, c.lastID, http2.ErrCodeEnhanceYourCalm, []byte("too_many_pings"))
			})
			return false
		}
		data := f.Data
		return c.write(func(b []byte) []byte { return appendPing(b, true, data) }) == nil
	case *http2.RSTStreamFrame:
		if f.StreamID > c.lastID {
			return c.connError(http2.ErrCodeProtocol) // an idle stream
		}
		c.drained(f.StreamID, true)
		c.endStream(f.StreamID, true)
	case *http2.GoAwayFrame:
		// The peer closes the connection once its calls are answered.
	case *http2.PriorityFrame:
		if f.StreamDep == f.StreamID {
			return c.streamError(f.StreamID, http2.ErrCodeProtocol) // RFC 9113 §5.3.1
		}
	case *http2.PushPromiseFrame:
		return false // a client may not push
	}
	return true
}

// headers starts a call: the token, method and options are checked here,
// on the headers, before any of its message is read.
func (c *conn) headers(f *http2.MetaHeadersFrame) bool {
	id := f.StreamID
	if c.streams[id] != nil {
		// Trailers from the client: a unary call has none. The call ends
		// as if reset: its handler, if it runs, answers nothing.
		return c.streamError(id, http2.ErrCodeProtocol)
	}
	if id%2 == 0 || id <= c.lastID {
		_ = c.write(func(b []byte) []byte { return appendGoAway(b, c.lastID, http2.ErrCodeProtocol, nil) })
		return false
	}
	c.lastID = id
	if f.HasPriority() && f.Priority.StreamDep == id {
		return c.malformed(f)
	}
	if c.goingAway || len(c.streams)+c.orphans >= c.t.cfg.MaxConcurrentCalls {
		// Not processed at all: a client may send it again (grpc-go's
		// do, transparently; they also wait for a free stream themselves
		// rather than open one past the bound).
		if !f.StreamEnded() {
			c.drain(id)
		}
		return c.write(func(b []byte) []byte { return appendRSTStream(b, id, http2.ErrCodeRefusedStream) }) == nil
	}
	ended := f.StreamEnded()
	answer := func(code codes.Code, msg string) bool {
		return c.writeStatus(id, status.New(code, msg), !ended) == nil
	}
	if f.Truncated {
		return answer(codes.Internal, fmt.Sprintf("header list larger than %d bytes", c.t.cfg.MaxHeaderListBytes))
	}
	var method, scheme, path, contentType, timeout, encoding string
	var tokens []string
	malformed := false
	for _, hf := range f.Fields {
		switch hf.Name {
		case ":method":
			method = hf.Value
		case ":scheme":
			scheme = hf.Value
		case ":path":
			path = hf.Value
		case "connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade":
			malformed = true // connection-specific (RFC 9113 §8.2.2)
		case "te":
			malformed = malformed || hf.Value != "trailers"
		case "content-type":
			contentType = hf.Value
		case "grpc-timeout":
			timeout = hf.Value
		case "grpc-encoding":
			encoding = hf.Value
		case c.t.cfg.TokenHeader:
			tokens = append(tokens, hf.Value)
		}
	}
	if malformed || method == "" || scheme == "" || path == "" {
		return c.malformed(f)
	}
	if err := c.t.cfg.Authorize(tokens); err != nil {
		return c.writeStatus(id, status.Convert(err), !ended) == nil
	}
	c.authed.Store(true)
	if method != "POST" || (contentType != "application/grpc" && !strings.HasPrefix(contentType, "application/grpc+proto") &&
		!strings.HasPrefix(contentType, "application/grpc;")) {
		return answer(codes.Internal, fmt.Sprintf("not a gRPC call: %s with content-type %q", method, contentType))
	}
	m := c.t.methods[path]
	if m == nil {
		return answer(codes.Unimplemented, fmt.Sprintf("unknown method %s", path))
	}
	if encoding != "" && encoding != "identity" {
		return answer(codes.Unimplemented, fmt.Sprintf("grpc: Decompressor is not installed for grpc-encoding %q", encoding))
	}
	st := &stream{id: id, method: m, want: -1, sendWindow: c.initialSendWindow}
	if timeout != "" {
		d, err := decodeTimeout(timeout)
		if err != nil {
			return answer(codes.Internal, fmt.Sprintf("malformed grpc-timeout: %v", err))
		}
		st.timeout = max(d, 1)
	}
	if ended {
		return answer(codes.Internal, "grpc: the request ended before its message")
	}
	c.streams[id] = st
	return true
}

// data takes a DATA frame of a call's message; the message is complete
// with the call's END_STREAM, and its handler starts.
func (c *conn) data(f *http2.DataFrame) bool {
	c.recvUnacked += int(f.Length)
	if c.recvUnacked >= connWindow/4 {
		n := c.recvUnacked
		c.recvUnacked = 0
		if c.write(func(b []byte) []byte { return appendWindowUpdate(b, 0, uint32(n)) }) != nil {
			return false
		}
	}
	st := c.streams[f.StreamID]
	switch {
	case f.StreamID > c.lastID:
		return c.connError(http2.ErrCodeProtocol) // an idle stream
	case st == nil && c.drained(f.StreamID, f.StreamEnded()):
		return true // a call refused or reset while the peer sent it: the rest is dropped
	case st == nil || st.running:
		// Closed, or half-closed (remote): the peer ended it before.
		return c.streamError(f.StreamID, http2.ErrCodeStreamClosed)
	}
	d := f.Data()
	if st.want < 0 {
		need := 5 - len(st.msg)
		if len(d) < need {
			c.keep(st, d)
			d = nil
		} else {
			c.keep(st, d[:need])
			d = d[need:]
			n := binary.BigEndian.Uint32(st.msg[1:5])
			switch {
			case st.msg[0] != 0:
				return c.refuse(st, status.New(codes.Internal, "grpc: compressed flag set with identity or empty encoding"), f)
			case int64(n) > int64(c.t.cfg.MaxMessageBytes):
				return c.refuse(st, status.Newf(codes.ResourceExhausted, "grpc: received message larger than max (%d vs. %d)", n, c.t.cfg.MaxMessageBytes), f)
			}
			st.want = 5 + int(n)
		}
	}
	if len(d) > 0 {
		if st.want < 0 || len(st.msg)+len(d) > st.want {
			return c.refuse(st, status.New(codes.Internal, "grpc: more than one request message in a unary call"), f)
		}
		c.keep(st, d)
	}
	if !f.StreamEnded() {
		st.recvUnack += int(f.Length)
		if st.recvUnack >= streamWindow/2 {
			n := st.recvUnack
			st.recvUnack = 0
			return c.write(func(b []byte) []byte { return appendWindowUpdate(b, st.id, uint32(n)) }) == nil
		}
		return true
	}
	if st.want < 0 || len(st.msg) != st.want {
		return c.refuse(st, status.New(codes.Internal, "grpc: the request ended before its message"), f)
	}
	ctx, cancel := c.ctx, context.CancelFunc(nil)
	if st.timeout > 0 {
		ctx, cancel = context.WithTimeout(ctx, st.timeout)
	} else {
		ctx, cancel = context.WithCancel(ctx)
	}
	st.running, st.cancel = true, cancel
	go c.run(ctx, st, c.drop(st)[5:])
	return true
}

// keep appends bytes of a call's message as they arrive: its buffer grows
// with what the peer sent, never with the length it declared.
func (c *conn) keep(st *stream, d []byte) {
	held := cap(st.msg)
	st.msg = append(st.msg, d...)
	c.t.receiving.Add(int64(cap(st.msg) - held))
}

// drop takes a call's message from it: to its handler, or gone.
func (c *conn) drop(st *stream) []byte {
	msg := st.msg
	st.msg = nil
	c.t.receiving.Add(-int64(cap(msg)))
	return msg
}

// refuse answers a call before its message is all in, and stops the rest.
func (c *conn) refuse(st *stream, s *status.Status, f *http2.DataFrame) bool {
	delete(c.streams, st.id)
	c.drop(st)
	return c.writeStatus(st.id, s, !f.StreamEnded()) == nil
}

// run is a call's goroutine: its handler on msg, then the answer.
func (c *conn) run(ctx context.Context, st *stream, msg []byte) {
	defer st.cancel()
	dec := func(v any) error {
		if err := proto.Unmarshal(msg, v.(proto.Message)); err != nil {
			return status.Errorf(codes.Internal, "grpc: error unmarshalling request: %v", err) // as grpc-go's server
		}
		return nil
	}
	// No interceptor: the token was checked on the headers.
	res, err := st.method.Handler(c.t.cfg.Impl, ctx, dec, nil)
	msg = nil
	var out []byte
	if err == nil {
		pm, _ := res.(proto.Message)
		if size := proto.Size(pm); size > c.t.cfg.MaxMessageBytes {
			err = status.Errorf(codes.ResourceExhausted, "grpc: trying to send message larger than max (%d vs. %d)", size, c.t.cfg.MaxMessageBytes)
		} else {
			out = make([]byte, 5, 5+size)
			binary.BigEndian.PutUint32(out[1:], uint32(size))
			if out, err = (proto.MarshalOptions{}).MarshalAppend(out, pm); err != nil {
				err = status.Errorf(codes.Internal, "grpc: error while marshaling: %v", err)
			}
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if st.orphan {
		c.orphans--
		return
	}
	if st.reset || c.closed {
		return
	}
	if err != nil {
		c.sentSince = true // the handler's answer, as writeAnswer's
		_ = c.writeStatus(st.id, status.Convert(err), false)
	} else {
		_ = c.writeAnswer(st, out)
	}
	c.endStream(st.id, false)
}

// endStream forgets a call; reset: the peer gave up on it.
func (c *conn) endStream(id uint32, reset bool) {
	st := c.streams[id]
	if st == nil {
		return
	}
	delete(c.streams, id)
	c.drop(st)
	if reset {
		st.reset = true
		if st.running {
			st.orphan = true
			c.orphans++
		}
		if st.cancel != nil {
			st.cancel()
		}
		c.cond.Broadcast()
	}
	if c.goingAway && len(c.streams) == 0 {
		c.closeLocked()
	}
}

// malformed refuses a request that is not one (RFC 9113 §8.1.1: a
// pseudo-header missing, a connection-specific header, a stream that
// depends on itself): a stream error PROTOCOL_ERROR, nothing answered.
func (c *conn) malformed(f *http2.MetaHeadersFrame) bool {
	if !f.StreamEnded() {
		c.drain(f.StreamID)
	}
	return c.streamError(f.StreamID, http2.ErrCodeProtocol)
}

// connError ends the connection for a connection error (RFC 9113 §5.4.1):
// GOAWAY with code; it returns false, for frame.
func (c *conn) connError(code http2.ErrCode) bool {
	_ = c.write(func(b []byte) []byte { return appendGoAway(b, c.lastID, code, nil) })
	return false
}

// streamError ends stream id for a stream error (RFC 9113 §5.4.2):
// RST_STREAM with code, and its call, if open, as if the peer reset it; it
// reports whether the connection goes on.
func (c *conn) streamError(id uint32, code http2.ErrCode) bool {
	c.endStream(id, true)
	return c.write(func(b []byte) []byte { return appendRSTStream(b, id, code) }) == nil
}

// drain notes stream id ended by the server while the peer may still send
// on it (draining).
func (c *conn) drain(id uint32) {
	if len(c.draining) == maxDraining {
		n := copy(c.draining, c.draining[1:])
		c.draining = c.draining[:n]
	}
	c.draining = append(c.draining, id)
}

// drained reports whether stream id is draining; ended: the peer ended it,
// forgotten.
func (c *conn) drained(id uint32, ended bool) bool {
	i := slices.Index(c.draining, id)
	if i >= 0 && ended {
		c.draining = slices.Delete(c.draining, i, i+1)
	}
	return i >= 0
}

// goAway starts the connection's end: no new call, and it closes once the
// calls open are answered.
func (c *conn) goAway() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || c.goingAway {
		return
	}
	c.goingAway = true
	if c.write(func(b []byte) []byte { return appendGoAway(b, c.lastID, http2.ErrCodeNo, nil) }) != nil || len(c.streams) == 0 {
		c.closeLocked()
	}
}

// lingerClose ends the connection's writing side and reads what the peer
// still sends, at most 64 KiB for at most a second, so that the close is
// a FIN the peer sees after what was written, not a reset.
func lingerClose(nc net.Conn) {
	if cw, ok := nc.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
	_ = nc.SetReadDeadline(time.Now().Add(time.Second))
	var buf [512]byte // not io.Copy's 32 KiB: many such peers at once cost little
	for read := 0; read < 64<<10; {
		n, err := nc.Read(buf[:])
		if err != nil {
			return
		}
		read += n
	}
}

func (c *conn) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closeLocked()
}

func (c *conn) closeLocked() {
	if c.closed {
		return
	}
	c.closed = true
	c.cancel()
	for _, st := range c.streams {
		st.reset = true
		c.drop(st)
	}
	c.cond.Broadcast()
	c.nc.Close()
}

// ---- writing (under mu) ----

var bufs = sync.Pool{New: func() any { b := make([]byte, 0, 1024); return &b }}

// write appends frames with fill and sends them.
func (c *conn) write(fill func([]byte) []byte) error {
	if c.closed {
		return net.ErrClosed
	}
	bp := bufs.Get().(*[]byte)
	b := fill((*bp)[:0])
	_, err := c.nc.Write(b)
	if cap(b) <= 64<<10 {
		*bp = b[:0]
		bufs.Put(bp)
	}
	if err != nil {
		c.closeLocked()
	}
	return err
}

// headerBlock is fields HPACK-encoded (into c.hbuf, valid until the next).
func (c *conn) headerBlock(fields ...string) []byte {
	c.hbuf.Reset()
	for i := 0; i+1 < len(fields); i += 2 {
		_ = c.enc.WriteField(hpack.HeaderField{Name: fields[i], Value: fields[i+1]})
	}
	return c.hbuf.Bytes()
}

// writeStatus answers a call with an error status, trailers-only; rst: the
// peer is still sending, told to stop (RST_STREAM NO_ERROR). It forgives
// no ping (sentSince): a refusal is no answer, or a peer without the token
// could ping without end between refused calls.
func (c *conn) writeStatus(id uint32, s *status.Status, rst bool) error {
	fields := []string{":status", "200", "content-type", "application/grpc", "grpc-status", strconv.Itoa(int(s.Code()))}
	if m := s.Message(); m != "" {
		fields = append(fields, "grpc-message", encodeGRPCMessage(m))
	}
	if p := s.Proto(); len(p.GetDetails()) > 0 {
		if b, err := proto.Marshal(p); err == nil {
			fields = append(fields, "grpc-status-details-bin", base64.RawStdEncoding.EncodeToString(b))
		}
	}
	block := c.headerBlock(fields...)
	if rst {
		c.drain(id)
	}
	return c.write(func(b []byte) []byte {
		b = appendHeaders(b, id, block, true, c.maxFrame)
		if rst {
			b = appendRSTStream(b, id, http2.ErrCodeNo)
		}
		return b
	})
}

// writeAnswer sends a call's answer: headers, the message within the
// peer's windows, and the status in trailers.
func (c *conn) writeAnswer(st *stream, msg []byte) error {
	c.sentSince = true
	block := c.headerBlock(":status", "200", "content-type", "application/grpc")
	bp := bufs.Get().(*[]byte)
	defer func() {
		if cap(*bp) <= 64<<10 {
			bufs.Put(bp)
		}
	}()
	b := appendHeaders((*bp)[:0], st.id, block, false, c.maxFrame)
	flush := func() error {
		c.sentSince = true // as grpc-go's server, each write forgives the pings before it (BDP pings follow data)
		_, err := c.nc.Write(b)
		b = b[:0]
		if err != nil {
			c.closeLocked()
		}
		return err
	}
	for len(msg) > 0 {
		for !c.closed && !st.reset && (c.sendWindow <= 0 || st.sendWindow <= 0) {
			if len(b) > 0 {
				if err := flush(); err != nil {
					return err
				}
			}
			c.cond.Wait()
		}
		if c.closed || st.reset {
			return net.ErrClosed
		}
		n := int(min(int64(len(msg)), int64(max(c.maxFrame, minFrameSize)), c.sendWindow, st.sendWindow))
		b = appendFrameHeader(b, n, http2.FrameData, 0, st.id)
		b = append(b, msg[:n]...)
		msg = msg[n:]
		c.sendWindow -= int64(n)
		st.sendWindow -= int64(n)
		if len(b) >= 64<<10 {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	block = c.headerBlock("grpc-status", "0")
	b = appendHeaders(b, st.id, block, true, c.maxFrame)
	err := flush()
	*bp = b
	return err
}

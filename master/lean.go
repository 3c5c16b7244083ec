package master

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

// The lean transport (TransportLean) is the master's own HTTP/2 server
// for its gRPC service, every method of which is unary, as grpc-go's
// clients (the agents) speak it over plaintext (h2c with prior knowledge).
// It exists for memory at scale (docs/DESIGN.md §5.11): each connection is
// one goroutine, which reads frames (x/net/http2's Framer and HPACK
// decoder) and keeps the connection's state; each call is one goroutine
// while its handler runs (a held long poll included), started on a shallow
// stack; answers are written by the call's goroutine under the
// connection's lock, from a pooled buffer. grpc-go's server costs three
// goroutines and their buffers per connection and grows each call's stack
// to 8 KiB; x/net's http2.Server two goroutines per connection, 4 KiB of
// response buffer per call.
//
// What it does of HTTP/2 and gRPC: SETTINGS (the peer's initial window,
// frame size; a value out of range ends the connection), flow control both
// ways (the peer's windows are respected when answering; what the peer
// sends is credited back as it is read), PING (answered; too frequent
// pings end the connection as grpc-go's enforcement policy does),
// SETTINGS_MAX_CONCURRENT_STREAMS (advertised;
// a call beyond it is refused with RST_STREAM REFUSED_STREAM),
// RST_STREAM (the call's context is canceled),
// GOAWAY on stop (calls in flight are answered, then the connection
// closes), grpc-timeout, status and message (percent-encoded) in trailers,
// trailers-only errors. No compression, no server push, no TLS, no
// streaming methods: the master has none of them. Connections are bounded
// (ConnLimits): in number, and in how long one may go without a call with
// the job's token.

const (
	// leanStreamWindow and leanConnWindow are what a peer may send ahead
	// of the master's reading, per call and per connection. The master
	// reads every frame as it comes, so they bound nothing held: they set
	// how often it sends WINDOW_UPDATE for a large message.
	leanStreamWindow = 256 << 10
	leanConnWindow   = 1 << 20
	// leanPrefaceTimeout bounds how long a new connection may take to send
	// the HTTP/2 preface.
	leanPrefaceTimeout = 10 * time.Second
	// As grpc-go's server's enforcement policy (MinTime, the strikes
	// allowed): pings closer than this, more than twice in a row with
	// nothing sent between, end the connection.
	leanPingMinInterval = 5 * time.Second
	leanMaxPingStrikes  = 2
	// leanConnsRefusedLogEvery spaces the lines that say connections were
	// closed past ConnLimits.MaxConns: a flood of them logs one a minute,
	// with how many since the last.
	leanConnsRefusedLogEvery = time.Minute
	// minFrameSize is the frame size every peer takes (RFC 9113 §4.2):
	// the writers never cut frames smaller, whatever the peer's setting.
	minFrameSize = 16384
)

type leanServer struct {
	s       *Server
	svc     *service
	methods map[string]*grpc.MethodDesc
	log     *slog.Logger
	limits  ConnLimits

	// receiving is the bytes held for the messages of calls still
	// arriving, over every connection (what a declared length must not
	// inflate).
	receiving atomic.Int64

	mu      sync.Mutex
	conns   map[*leanConn]struct{}
	closing bool
	wg      sync.WaitGroup
}

func newLeanServer(s *Server) *leanServer {
	limits := s.opts.Connections
	if limits.AuthTimeout <= 0 {
		limits.AuthTimeout = DefaultAuthTimeout
	}
	if limits.MaxConns <= 0 {
		limits.MaxConns = DefaultMaxConns
	}
	return &leanServer{s: s, svc: &service{s: s}, methods: unaryMethods(), log: s.log, limits: limits,
		conns: map[*leanConn]struct{}{}}
}

// serve accepts connections on lis until it is closed.
func (t *leanServer) serve(ctx context.Context, lis net.Listener) error {
	var delay time.Duration
	base := context.WithoutCancel(ctx) // calls outlive ctx by their answers: stop ends them
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
			t.log.Warn("accept", "err", err, "retry_in", delay)
			select {
			case <-time.After(delay):
			case <-ctx.Done():
				return nil
			}
			continue
		}
		delay = 0
		t.mu.Lock()
		closing, full := t.closing, len(t.conns) >= t.limits.MaxConns
		if closing || full {
			t.mu.Unlock()
			nc.Close()
			if !closing {
				refused++
				if time.Since(refusedLogged) >= leanConnsRefusedLogEvery {
					t.log.Warn("connections refused: too many open", "max_conns", t.limits.MaxConns, "refused", refused)
					refused, refusedLogged = 0, time.Now()
				}
			}
			continue
		}
		c := newLeanConn(t, nc, base)
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

// stop sends every connection GOAWAY: its calls in flight are answered and
// it closes once they are; after grace the rest are closed. A connection
// whose peer reads nothing (a write blocked, its lock held) delays neither:
// GOAWAY goes out from a goroutine of its own, and closing the socket
// first ends a blocked write.
func (t *leanServer) stop(grace time.Duration) {
	t.mu.Lock()
	t.closing = true
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

// leanConn is one connection. The reading goroutine owns the framer; the
// rest is under mu, which a call's goroutine also holds while it writes.
type leanConn struct {
	t      *leanServer
	nc     net.Conn
	fr     *http2.Framer
	ctx    context.Context // ends with the connection
	cancel context.CancelFunc

	mu   sync.Mutex
	cond *sync.Cond // window updates, resets, close
	// streams are the calls open: being received, or their handler running.
	streams map[uint32]*leanStream
	// orphans are the handlers still running of calls the peer reset (or
	// the master reset): gone from streams, but they count against
	// MaxConcurrentCalls until they return, or a peer that opens and
	// resets calls at once would start handlers without bound (HTTP/2
	// "rapid reset").
	orphans int
	lastID  uint32
	// authed: a call with the job's token came (ConnLimits.AuthTimeout).
	authed atomic.Bool
	// The peer's windows and settings, for what the master sends.
	sendWindow        int64
	initialSendWindow int64
	maxFrame          int
	// What the peer sent that the master has read and not credited back.
	recvUnacked int
	enc         *hpack.Encoder
	hbuf        bytes.Buffer // HPACK output, one header block at a time
	goingAway   bool
	closed      bool
	pingStrikes int
	lastPing    time.Time
	sentSince   bool // an answer of a handler's sent since the last ping
}

type leanStream struct {
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

func newLeanConn(t *leanServer, nc net.Conn, base context.Context) *leanConn {
	c := &leanConn{t: t, nc: nc, streams: map[uint32]*leanStream{}, sendWindow: 65535, initialSendWindow: 65535,
		maxFrame: 16384}
	c.ctx, c.cancel = context.WithCancel(base)
	c.cond = sync.NewCond(&c.mu)
	c.fr = http2.NewFramer(nil, nc)
	c.fr.SetReuseFrames()
	c.fr.SetMaxReadFrameSize(maxReadFrameBytes)
	c.fr.MaxHeaderListSize = maxHeaderListBytes
	c.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	c.enc = hpack.NewEncoder(&c.hbuf)
	// The master's answers carry a few short headers: no dynamic table
	// (memory per connection), at the cost of a few bytes each.
	c.enc.SetMaxDynamicTableSizeLimit(0)
	return c
}

func (c *leanConn) serve() {
	defer c.close()
	// Closing the socket, not under mu, also ends a peer that reads
	// nothing: the write it blocks, and the lock that write holds.
	unauthed := time.AfterFunc(c.t.limits.AuthTimeout, func() {
		if !c.authed.Load() {
			c.nc.Close()
		}
	})
	defer unauthed.Stop()
	c.nc.SetReadDeadline(time.Now().Add(leanPrefaceTimeout))
	var pre [len(http2.ClientPreface)]byte
	if _, err := io.ReadFull(c.nc, pre[:]); err != nil || string(pre[:]) != http2.ClientPreface {
		return
	}
	c.mu.Lock()
	err := c.write(func(b []byte) []byte {
		b = appendSettings(b, false,
			http2.Setting{ID: http2.SettingMaxConcurrentStreams, Val: MaxConcurrentCalls},
			http2.Setting{ID: http2.SettingMaxHeaderListSize, Val: maxHeaderListBytes},
			http2.Setting{ID: http2.SettingInitialWindowSize, Val: leanStreamWindow})
		return appendWindowUpdate(b, 0, leanConnWindow-65535)
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
				werr := c.write(func(b []byte) []byte { return appendRSTStream(b, se.StreamID, se.Code) })
				c.mu.Unlock()
				if werr != nil {
					return
				}
				continue
			}
			var ce http2.ConnectionError
			if errors.As(err, &ce) {
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
func (c *leanConn) frame(f http2.Frame) bool {
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
		if f.StreamID == 0 {
			c.sendWindow += int64(f.Increment)
		} else if st := c.streams[f.StreamID]; st != nil {
			st.sendWindow += int64(f.Increment)
		}
		c.cond.Broadcast()
	case *http2.PingFrame:
		if f.IsAck() {
			return true
		}
		now := time.Now()
		if c.sentSince {
			c.pingStrikes, c.sentSince = 0, false
		} else if !c.lastPing.IsZero() && now.Sub(c.lastPing) < leanPingMinInterval {
			c.pingStrikes++
		}
		c.lastPing = now
		if c.pingStrikes > leanMaxPingStrikes {
			_ = c.write(func(b []byte) []byte {
				return appendGoAway(b, c.lastID, http2.ErrCodeEnhanceYourCalm, []byte("too_many_pings"))
			})
			return false
		}
		data := f.Data
		return c.write(func(b []byte) []byte { return appendPing(b, true, data) }) == nil
	case *http2.RSTStreamFrame:
		c.endStream(f.StreamID, true)
	case *http2.GoAwayFrame:
		// The peer closes the connection once its calls are answered.
	case *http2.PushPromiseFrame:
		return false // a client may not push
	}
	return true
}

// headers starts a call: the token, method and options are checked here,
// on the headers, before any of its message is read.
func (c *leanConn) headers(f *http2.MetaHeadersFrame) bool {
	id := f.StreamID
	if c.streams[id] != nil {
		// Trailers from the client: a unary call has none. The call ends
		// as if reset: its handler, if it runs, answers nothing.
		c.endStream(id, true)
		return c.write(func(b []byte) []byte { return appendRSTStream(b, id, http2.ErrCodeProtocol) }) == nil
	}
	if id%2 == 0 || id <= c.lastID {
		_ = c.write(func(b []byte) []byte { return appendGoAway(b, c.lastID, http2.ErrCodeProtocol, nil) })
		return false
	}
	c.lastID = id
	if c.goingAway || len(c.streams)+c.orphans >= MaxConcurrentCalls {
		// Not processed at all: a client may send it again (grpc-go's
		// do, transparently; they also wait for a free stream themselves
		// rather than open one past the bound).
		return c.write(func(b []byte) []byte { return appendRSTStream(b, id, http2.ErrCodeRefusedStream) }) == nil
	}
	ended := f.StreamEnded()
	answer := func(code codes.Code, msg string) bool {
		return c.writeStatus(id, status.New(code, msg), !ended) == nil
	}
	if f.Truncated {
		return answer(codes.Internal, fmt.Sprintf("header list larger than %d bytes", maxHeaderListBytes))
	}
	var method, path, contentType, timeout, encoding string
	var tokens []string
	for _, hf := range f.Fields {
		switch hf.Name {
		case ":method":
			method = hf.Value
		case ":path":
			path = hf.Value
		case "content-type":
			contentType = hf.Value
		case "grpc-timeout":
			timeout = hf.Value
		case "grpc-encoding":
			encoding = hf.Value
		case TokenHeader:
			tokens = append(tokens, hf.Value)
		}
	}
	if !c.t.s.authentic(tokens) {
		c.t.s.metrics.refused.Inc()
		return answer(codes.Unauthenticated, "missing or wrong job token")
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
	st := &leanStream{id: id, method: m, want: -1, sendWindow: c.initialSendWindow}
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
func (c *leanConn) data(f *http2.DataFrame) bool {
	c.recvUnacked += int(f.Length)
	if c.recvUnacked >= leanConnWindow/4 {
		n := c.recvUnacked
		c.recvUnacked = 0
		if c.write(func(b []byte) []byte { return appendWindowUpdate(b, 0, uint32(n)) }) != nil {
			return false
		}
	}
	st := c.streams[f.StreamID]
	if st == nil || st.running {
		return true // a call answered already (refused) or reset: what it still sends is dropped
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
			case n > MaxMessageBytes:
				return c.refuse(st, status.Newf(codes.ResourceExhausted, "grpc: received message larger than max (%d vs. %d)", n, MaxMessageBytes), f)
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
		if st.recvUnack >= leanStreamWindow/2 {
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
func (c *leanConn) keep(st *leanStream, d []byte) {
	held := cap(st.msg)
	st.msg = append(st.msg, d...)
	c.t.receiving.Add(int64(cap(st.msg) - held))
}

// drop takes a call's message from it: to its handler, or gone.
func (c *leanConn) drop(st *leanStream) []byte {
	msg := st.msg
	st.msg = nil
	c.t.receiving.Add(-int64(cap(msg)))
	return msg
}

// refuse answers a call before its message is all in, and stops the rest.
func (c *leanConn) refuse(st *leanStream, s *status.Status, f *http2.DataFrame) bool {
	delete(c.streams, st.id)
	c.drop(st)
	return c.writeStatus(st.id, s, !f.StreamEnded()) == nil
}

// run is a call's goroutine: its handler on msg, then the answer.
func (c *leanConn) run(ctx context.Context, st *leanStream, msg []byte) {
	defer st.cancel()
	dec := func(v any) error {
		if err := proto.Unmarshal(msg, v.(proto.Message)); err != nil {
			return undecodable(err.Error())
		}
		return nil
	}
	// No interceptor: the token was checked on the headers.
	res, err := st.method.Handler(c.t.svc, ctx, dec, nil)
	msg = nil
	var out []byte
	if err == nil {
		pm, _ := res.(proto.Message)
		if size := proto.Size(pm); size > MaxMessageBytes {
			err = status.Errorf(codes.ResourceExhausted, "grpc: trying to send message larger than max (%d vs. %d)", size, MaxMessageBytes)
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
func (c *leanConn) endStream(id uint32, reset bool) {
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

// goAway starts the connection's end: no new call, and it closes once the
// calls open are answered.
func (c *leanConn) goAway() {
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

func (c *leanConn) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closeLocked()
}

func (c *leanConn) closeLocked() {
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

var leanBufs = sync.Pool{New: func() any { b := make([]byte, 0, 1024); return &b }}

// write appends frames with fill and sends them.
func (c *leanConn) write(fill func([]byte) []byte) error {
	if c.closed {
		return net.ErrClosed
	}
	bp := leanBufs.Get().(*[]byte)
	b := fill((*bp)[:0])
	_, err := c.nc.Write(b)
	if cap(b) <= 64<<10 {
		*bp = b[:0]
		leanBufs.Put(bp)
	}
	if err != nil {
		c.closeLocked()
	}
	return err
}

// headerBlock is fields HPACK-encoded (into c.hbuf, valid until the next).
func (c *leanConn) headerBlock(fields ...string) []byte {
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
func (c *leanConn) writeStatus(id uint32, s *status.Status, rst bool) error {
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
func (c *leanConn) writeAnswer(st *leanStream, msg []byte) error {
	c.sentSince = true
	block := c.headerBlock(":status", "200", "content-type", "application/grpc")
	bp := leanBufs.Get().(*[]byte)
	defer func() {
		if cap(*bp) <= 64<<10 {
			leanBufs.Put(bp)
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

// ---- frames ----

func appendFrameHeader(b []byte, length int, t http2.FrameType, flags http2.Flags, id uint32) []byte {
	return append(b, byte(length>>16), byte(length>>8), byte(length), byte(t), byte(flags),
		byte(id>>24)&0x7f, byte(id>>16), byte(id>>8), byte(id))
}

func appendSettings(b []byte, ack bool, s ...http2.Setting) []byte {
	var flags http2.Flags
	if ack {
		flags = http2.FlagSettingsAck
	}
	b = appendFrameHeader(b, 6*len(s), http2.FrameSettings, flags, 0)
	for _, x := range s {
		b = binary.BigEndian.AppendUint16(b, uint16(x.ID))
		b = binary.BigEndian.AppendUint32(b, x.Val)
	}
	return b
}

func appendWindowUpdate(b []byte, id, inc uint32) []byte {
	b = appendFrameHeader(b, 4, http2.FrameWindowUpdate, 0, id)
	return binary.BigEndian.AppendUint32(b, inc&0x7fffffff)
}

func appendPing(b []byte, ack bool, data [8]byte) []byte {
	var flags http2.Flags
	if ack {
		flags = http2.FlagPingAck
	}
	b = appendFrameHeader(b, 8, http2.FramePing, flags, 0)
	return append(b, data[:]...)
}

func appendRSTStream(b []byte, id uint32, code http2.ErrCode) []byte {
	b = appendFrameHeader(b, 4, http2.FrameRSTStream, 0, id)
	return binary.BigEndian.AppendUint32(b, uint32(code))
}

func appendGoAway(b []byte, last uint32, code http2.ErrCode, debug []byte) []byte {
	b = appendFrameHeader(b, 8+len(debug), http2.FrameGoAway, 0, 0)
	b = binary.BigEndian.AppendUint32(b, last&0x7fffffff)
	b = binary.BigEndian.AppendUint32(b, uint32(code))
	return append(b, debug...)
}

// appendHeaders appends a header block as HEADERS and, past the peer's
// frame size, CONTINUATION frames.
func appendHeaders(b []byte, id uint32, block []byte, endStream bool, maxFrame int) []byte {
	maxFrame = max(maxFrame, minFrameSize) // each frame carries some of the block
	flags := http2.Flags(0)
	if endStream {
		flags |= http2.FlagHeadersEndStream
	}
	t := http2.FrameHeaders
	for {
		n := min(len(block), maxFrame)
		f := flags
		if n == len(block) {
			f |= http2.FlagHeadersEndHeaders
		}
		b = appendFrameHeader(b, n, t, f, id)
		b = append(b, block[:n]...)
		block = block[n:]
		if len(block) == 0 {
			return b
		}
		t, flags = http2.FrameContinuation, 0
	}
}

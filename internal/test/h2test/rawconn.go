package h2test

import (
	"bytes"
	"encoding/binary"
	"net"
	"testing"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/protobuf/proto"
)

// RawConn is an HTTP/2 client written frame by frame, for what grpc-go's
// client never does (flood pings, stop reading, open calls past the
// bound). Fr reads what the server sends, and writes frames of the test's.
type RawConn struct {
	NC   net.Conn
	Fr   *http2.Framer
	t    testing.TB
	hbuf bytes.Buffer
	enc  *hpack.Encoder
}

// Dial connects to addr and sends the client preface and SETTINGS with an
// initial stream window of window (and a connection window as large).
func Dial(t testing.TB, addr string, window uint32) *RawConn {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	r := &RawConn{t: t, NC: nc, Fr: http2.NewFramer(nc, nc)}
	r.Fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	r.enc = hpack.NewEncoder(&r.hbuf)
	if _, err := nc.Write([]byte(http2.ClientPreface)); err != nil {
		t.Fatal(err)
	}
	if err := r.Fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: window}); err != nil {
		t.Fatal(err)
	}
	if window > 65535 {
		if err := r.Fr.WriteWindowUpdate(0, window-65535); err != nil {
			t.Fatal(err)
		}
	}
	return r
}

// Headers opens stream id with a call's headers: method of the master's
// service (kfelastic.master.v1.Master), tok as the bearer token.
func (r *RawConn) Headers(id uint32, method, tok string) {
	r.t.Helper()
	r.WriteHeaders(http2.HeadersFrameParam{StreamID: id, EndHeaders: true}, CallHeaders(method, tok)...)
}

// CallHeaders are a call's headers, name and value in turn: method of the
// master's service, tok as the bearer token.
func CallHeaders(method, tok string) []string {
	return []string{":method", "POST", ":scheme", "http", ":path", "/kfelastic.master.v1.Master/" + method,
		":authority", "master", "content-type", "application/grpc", "te", "trailers", "authorization", "Bearer " + tok}
}

// WriteHeaders sends a HEADERS frame p with fields (name and value in
// turn) as its block.
func (r *RawConn) WriteHeaders(p http2.HeadersFrameParam, fields ...string) {
	r.t.Helper()
	r.hbuf.Reset()
	for i := 0; i+1 < len(fields); i += 2 {
		_ = r.enc.WriteField(hpack.HeaderField{Name: fields[i], Value: fields[i+1]})
	}
	p.BlockFragment = r.hbuf.Bytes()
	if err := r.Fr.WriteHeaders(p); err != nil {
		r.t.Fatal(err)
	}
}

// Call sends a unary call on stream id: headers (Headers), the message,
// the end of the stream.
func (r *RawConn) Call(id uint32, method, tok string, req proto.Message) {
	r.t.Helper()
	r.Headers(id, method, tok)
	b, err := proto.Marshal(req)
	if err != nil {
		r.t.Fatal(err)
	}
	msg := binary.BigEndian.AppendUint32([]byte{0}, uint32(len(b)))
	if err := r.Fr.WriteData(id, true, append(msg, b...)); err != nil {
		r.t.Fatal(err)
	}
}

// HeaderValue is the value of f's header name, "" if none.
func HeaderValue(f *http2.MetaHeadersFrame, name string) string {
	for _, hf := range f.Fields {
		if hf.Name == name {
			return hf.Value
		}
	}
	return ""
}

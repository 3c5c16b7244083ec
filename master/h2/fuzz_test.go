package h2_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/protobuf/proto"

	"github.com/kfelastic/kfelastic/api/masterpb"
	"github.com/kfelastic/kfelastic/master/h2"
)

// FuzzConn feeds the server any bytes a peer can send after
// the client preface and its SETTINGS: well-formed calls with and without
// the token, the attacks of the other tests (bad SETTINGS, ping
// floods, huge declared messages, endless CONTINUATION) and whatever the
// fuzzer makes of them. Whatever comes, the server does not panic, answers
// or closes the connection within 5 s of the peer's end (no hang), holds
// no received bytes once it is closed (memory bounded per connection), and
// still serves the next connection. Seeds run in make test; fuzz with
// go test -fuzz FuzzConn ./master/h2.
func FuzzConn(f *testing.F) {
	for _, seed := range fuzzSeeds() {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, frames []byte) {
		s, addr, _ := serve(t, t.Context(), h2.Config{})
		nc, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		go func() {
			// A peer's bytes: the server may close before it read them
			// all, which fails this write and ends it.
			_, _ = nc.Write(append([]byte(http2.ClientPreface), append(settingsFrame(), frames...)...))
			_ = nc.(*net.TCPConn).CloseWrite()
		}()
		_ = nc.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.Copy(io.Discard, nc); errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("the server neither closed nor finished the connection within 5 s of the peer's end (%d bytes sent)", len(frames))
		}
		nc.Close()
		for deadline := time.Now().Add(5 * time.Second); s.Receiving() != 0; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%d received bytes still held 5 s after the connection closed", s.Receiving())
			}
		}
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		if _, err := dial(t, addr, token).Status(ctx, &masterpb.StatusRequest{}); err != nil {
			t.Fatalf("the server no longer serves: %v", err)
		}
	})
}

// settingsFrame is a client's SETTINGS: an empty one.
func settingsFrame() []byte {
	var b bytes.Buffer
	_ = http2.NewFramer(&b, nil).WriteSettings()
	return b.Bytes()
}

// fuzzSeeds are frame sequences a client sends, good and hostile.
func fuzzSeeds() [][]byte {
	var seeds [][]byte
	frames := func(write func(fr *http2.Framer, hdr func(tok string) []byte)) {
		var b, hb bytes.Buffer
		fr := http2.NewFramer(&b, nil)
		enc := hpack.NewEncoder(&hb)
		hdr := func(tok string) []byte {
			hb.Reset()
			for _, kv := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", "/kfelastic.master.v1.Master/Status"},
				{":authority", "master"}, {"content-type", "application/grpc"}, {"te", "trailers"}, {"authorization", "Bearer " + tok}} {
				_ = enc.WriteField(hpack.HeaderField{Name: kv[0], Value: kv[1]})
			}
			return bytes.Clone(hb.Bytes())
		}
		write(fr, hdr)
		seeds = append(seeds, b.Bytes())
	}
	req, _ := proto.Marshal(&masterpb.StatusRequest{})
	msg := append(binary.BigEndian.AppendUint32([]byte{0}, uint32(len(req))), req...)
	frames(func(fr *http2.Framer, hdr func(string) []byte) { // a good call
		_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: hdr(token), EndHeaders: true})
		_ = fr.WriteData(1, true, msg)
	})
	frames(func(fr *http2.Framer, hdr func(string) []byte) { // no token
		_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: hdr("wrong"), EndHeaders: true})
		_ = fr.WriteData(1, true, msg)
	})
	frames(func(fr *http2.Framer, hdr func(string) []byte) { // a 2 GiB message declared
		_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: hdr(token), EndHeaders: true})
		_ = fr.WriteData(1, false, binary.BigEndian.AppendUint32([]byte{0}, 1<<31-1))
	})
	frames(func(fr *http2.Framer, hdr func(string) []byte) { // headers in pieces, never ended
		block := hdr(token)
		_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block[:3]})
		for range 50 {
			_ = fr.WriteContinuation(1, false, block[3:4])
		}
	})
	frames(func(fr *http2.Framer, _ func(string) []byte) { // bad settings, pings, window overflow
		_ = fr.WriteSettings(http2.Setting{ID: http2.SettingMaxFrameSize, Val: 1})
		_ = fr.WritePing(false, [8]byte{1})
		_ = fr.WriteWindowUpdate(0, 1<<31-1)
		_ = fr.WriteWindowUpdate(0, 1<<31-1)
	})
	frames(func(fr *http2.Framer, hdr func(string) []byte) { // resets, priorities, unknown frames, an even stream
		_ = fr.WriteRSTStream(7, http2.ErrCodeCancel)
		_ = fr.WritePriority(3, http2.PriorityParam{StreamDep: 3})
		_ = fr.WriteRawFrame(0xfa, 0, 1, []byte("unknown"))
		_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 2, BlockFragment: hdr(token), EndHeaders: true})
		_ = fr.WriteGoAway(0, http2.ErrCodeNo, nil)
	})
	frames(func(fr *http2.Framer, _ func(string) []byte) { // a ping flood
		for i := range 20 {
			_ = fr.WritePing(false, [8]byte{byte(i)})
		}
	})
	seeds = append(seeds, []byte{0, 0, 5}, bytes.Repeat([]byte{0xff}, 64))
	return seeds
}

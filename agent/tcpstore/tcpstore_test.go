package tcpstore

import (
	"bytes"
	"encoding/hex"
	"errors"
	"io"
	"reflect"
	"strings"
	"testing"
)

// unhex reads a byte sequence written with spaces and comments (# to the end
// of a line) for readability.
func unhex(t testing.TB, s string) []byte {
	t.Helper()
	var clean strings.Builder
	for _, line := range strings.Split(s, "\n") {
		line, _, _ = strings.Cut(line, "#")
		clean.WriteString(strings.Join(strings.Fields(line), ""))
	}
	b, err := hex.DecodeString(clean.String())
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// The streams below are written from TORCH-STORE.md's tables and torch's
// TCPStore.cpp client code (sendCommandForKey, sendValue, sendVector: command
// byte, then u64 little-endian lengths and counts), except the torch 2.6 one,
// captured from a real client; the relay's tests run real 1.13 and 2.6
// clients end to end.
func TestDecodeRecordedStreams(t *testing.T) {
	cases := []struct {
		name   string
		legacy Numbering
		stream string
		want   []Request
		num    Numbering
	}{{
		name: "torch 1.13: a client with world_size, then get = WAIT + GET, then delete",
		stream: `03 0500000000000000 696e69742f 0100000000000000 # ADD "init/" 1
			05 0100000000000000 0200000000000000 2f61  # WAIT ["/a"]
			02 0200000000000000 2f61                   # GET "/a"
			06                                         # GETNUMKEYS
			08 0200000000000000 2f61                   # DELETE_KEY "/a"
			07 0200000000000000 2f62                   # WATCH_KEY "/b"`,
		want: []Request{{Cmd: Add, Key: "init/", Delta: 1}, {Cmd: Wait, Keys: []string{"/a"}}, {Cmd: Get, Key: "/a"},
			{Cmd: NumKeys}, {Cmd: Delete, Key: "/a"}, {Cmd: WatchKey, Key: "/b"}},
		num: Torch113,
	}, {
		name: "torch 1.13: SET first, COMPARE_SET, CHECK of two keys, ADD of -2",
		stream: `00 0200000000000000 2f6b 0300000000000000 76616c   # SET "/k" "val"
			01 0200000000000000 2f6b 0000000000000000 0100000000000000 78 # COMPARE_SET "/k" "" "x"
			04 0200000000000000 0200000000000000 2f61 0200000000000000 2f62 # CHECK ["/a" "/b"]
			03 0200000000000000 2f6e feffffffffffffff  # ADD "/n" -2`,
		want: []Request{{Cmd: Set, Key: "/k", Value: []byte("val")},
			{Cmd: CompareSet, Key: "/k", Expected: []byte{}, Value: []byte("x")},
			{Cmd: Check, Keys: []string{"/a", "/b"}}, {Cmd: Add, Key: "/n", Delta: -2}},
		num: Torch113,
	}, {
		name: "torch 2.1 when configured: DELETE_KEY 7, APPEND 8",
		stream: `07 0200000000000000 2f61                     # DELETE_KEY "/a"
			08 0200000000000000 2f61 0100000000000000 7a  # APPEND "/a" "z"`,
		legacy: Torch21,
		want:   []Request{{Cmd: Delete, Key: "/a"}, {Cmd: Append, Key: "/a", Value: []byte("z")}},
		num:    Torch21,
	}, {
		name: "torch 2.1 found out by its MULTI_SET, then 7 is DELETE_KEY",
		stream: `0a 0100000000000000 0200000000000000 2f61 0100000000000000 31 # MULTI_SET {"/a": "1"}
			09 0100000000000000 0200000000000000 2f61  # MULTI_GET ["/a"]
			0b                                         # CANCEL_WAIT
			07 0200000000000000 2f61                   # DELETE_KEY "/a"`,
		want: []Request{{Cmd: MultiSet, Keys: []string{"/a"}, Values: [][]byte{[]byte("1")}},
			{Cmd: MultiGet, Keys: []string{"/a"}}, {Cmd: CancelWait}, {Cmd: Delete, Key: "/a"}},
		num: Torch21,
	}, {
		// Captured from Debian trixie's torch 2.6 client (TCPStore(...,
		// is_master=False).set("a", "1") against a recording socket that
		// echoed the PING): one connection, handshake, PING, SET.
		name: "torch 2.6, recorded: VALIDATE, PING, SET",
		stream: `00 cef7853c                                  # VALIDATE magic
			0d 94410000                                  # PING 0x4194
			01 0200000000000000 2f61 0100000000000000 31 # SET "/a" "1"`,
		want: []Request{{Cmd: Validate, Number: Magic}, {Cmd: Ping, Number: 0x4194},
			{Cmd: Set, Key: "/a", Value: []byte("1")}},
		num: Torch22,
	}, {
		name: "torch 2.2+: VALIDATE, PING, SET, MULTI_GET, CANCEL_WAIT, QUEUE_LEN",
		stream: `00 cef7853c                                # VALIDATE magic
			0d 2a000000                                # PING 42
			01 0200000000000000 2f61 0100000000000000 31  # SET "/a" "1"
			0a 0200000000000000 0200000000000000 2f61 0200000000000000 2f62 # MULTI_GET ["/a" "/b"]
			0c                                         # CANCEL_WAIT
			10 0200000000000000 2f71                   # QUEUE_LEN "/q"
			08 0200000000000000 2f61                   # DELETE_KEY "/a"`,
		want: []Request{{Cmd: Validate, Number: Magic}, {Cmd: Ping, Number: 42}, {Cmd: Set, Key: "/a", Value: []byte("1")},
			{Cmd: MultiGet, Keys: []string{"/a", "/b"}}, {Cmd: CancelWait}, {Cmd: QueueLen, Key: "/q"},
			{Cmd: Delete, Key: "/a"}},
		num: Torch22,
	}}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			raw := unhex(t, c.stream)
			d := NewDecoder(bytes.NewReader(raw), c.legacy, Limits{})
			var got []Request
			for {
				r, err := d.Next()
				if err == io.EOF {
					break
				}
				if err != nil {
					t.Fatalf("after %d requests: %v", len(got), err)
				}
				got = append(got, r)
			}
			if !reflect.DeepEqual(got, c.want) {
				t.Errorf("got  %+v\nwant %+v", got, c.want)
			}
			if d.Numbering() != c.num {
				t.Errorf("numbering %s, want %s", d.Numbering(), c.num)
			}
			// The encoder writes the same bytes back (for 2.1 found out by
			// its codes, in the numbering the decoder ended with).
			var enc []byte
			for _, r := range c.want {
				var err error
				if enc, err = AppendRequest(enc, c.num, r); err != nil {
					t.Fatal(err)
				}
			}
			if !bytes.Equal(enc, raw) {
				t.Errorf("encoded\n%x\nwant\n%x", enc, raw)
			}
		})
	}
}

// A 1.13 client whose first command is one byte long (GETNUMKEYS) is read
// without waiting for five bytes; one whose first command is SET is not
// mistaken for a handshake.
func TestSniffDoesNotWaitForFiveBytes(t *testing.T) {
	r, w := io.Pipe()
	d := NewDecoder(r, 0, Limits{})
	go func() { _, _ = w.Write([]byte{6}) }() // GETNUMKEYS, and nothing more for now
	req, err := d.Next()
	if err != nil || req.Cmd != NumKeys || d.Numbering() != Torch113 {
		t.Fatalf("got %+v, %v, %s", req, err, d.Numbering())
	}
	w.Close()
}

func TestRefusals(t *testing.T) {
	cases := []struct {
		name, stream string
		want         error
	}{
		{"a key of 4 GiB", "02 0000000001000000", ErrTooLarge},
		{"a value of 2^64-1 bytes", "00 0100000000000000 61 ffffffffffffffff", ErrTooLarge},
		{"a key just over the limit", "02 0110000000000000", ErrTooLarge},
		{"2^40 keys to wait for", "05 0000000000010000", ErrTooLarge},
		{"a MULTI_SET of 2^32 pairs", "00 cef7853c 0b 0000000001000000", ErrTooLarge},
		{"a 1.13 code 12", "0c", ErrUnknown},
		{"a 2.2+ code 18", "00 cef7853c 12", ErrUnknown},
		{"a second VALIDATE with another magic", "00 cef7853c 00 01020304", ErrUnknown},
		{"half a frame", "00 0200000000000000 2f61 0500000000000000 6869", io.ErrUnexpectedEOF},
		{"half a length", "02 0200", io.ErrUnexpectedEOF},
		{"a first byte 0 and nothing more", "00", io.ErrUnexpectedEOF},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			// The stream ends where the length does: a decoder that tried
			// to read (or allocate) the announced bytes would report EOF.
			d := NewDecoder(bytes.NewReader(unhex(t, c.stream)), 0, Limits{})
			var err error
			for err == nil {
				_, err = d.Next()
			}
			if !errors.Is(err, c.want) {
				t.Errorf("got %v, want %v", err, c.want)
			}
		})
	}
}

// The frame limit bounds what MULTI_SET's pairs add up to, not only each.
func TestFrameLimitAddsUp(t *testing.T) {
	lim := Limits{MaxValue: 10, MaxFrame: 16}
	req := Request{Cmd: MultiSet, Keys: []string{"/a", "/b"}, Values: [][]byte{[]byte("0123456"), []byte("0123456")}}
	b, _ := AppendRequest(nil, Torch21, req)
	_, err := NewDecoder(bytes.NewReader(b), Torch21, lim).Next()
	if !errors.Is(err, ErrTooLarge) {
		t.Fatalf("18 bytes in a frame of at most 16: %v", err)
	}
	req.Values[1] = []byte("01234")
	b, _ = AppendRequest(nil, Torch21, req)
	if _, err := NewDecoder(bytes.NewReader(b), Torch21, lim).Next(); err != nil {
		t.Fatalf("16 bytes: %v", err)
	}
}

// FuzzFrame feeds the decoder arbitrary streams: it must never panic or
// allocate past its limits, and whatever it accepts must encode back to the
// very bytes it consumed.
func FuzzFrame(f *testing.F) {
	for _, s := range []string{
		"03 0500000000000000 696e69742f 0100000000000000",
		"00 cef7853c 0d 2a000000 0a 0100000000000000 0200000000000000 2f61",
		"0a 0100000000000000 0200000000000000 2f61 0100000000000000 31 07 0200000000000000 2f61",
		"01 0200000000000000 2f6b 0000000000000000 0100000000000000 78",
		"02 0000000001000000",
	} {
		f.Add(unhex(f, s), false)
	}
	f.Fuzz(func(t *testing.T, data []byte, legacy21 bool) {
		legacy := Torch113
		if legacy21 {
			legacy = Torch21
		}
		lim := Limits{MaxKey: 64, MaxValue: 256, MaxKeys: 8, MaxFrame: 512}
		d := NewDecoder(bytes.NewReader(data), legacy, lim)
		var reqs []Request
		var nums []Numbering
		for {
			r, err := d.Next()
			if err != nil {
				break
			}
			reqs, nums = append(reqs, r), append(nums, d.Numbering())
		}
		var enc []byte
		for i, r := range reqs {
			var err error
			if enc, err = AppendRequest(enc, nums[i], r); err != nil {
				t.Fatalf("request %d %+v does not encode in %s: %v", i, r, nums[i], err)
			}
		}
		if !bytes.HasPrefix(data, enc) {
			t.Fatalf("decoded %+v, which encodes to\n%x\nnot a prefix of\n%x", reqs, enc, data)
		}
	})
}

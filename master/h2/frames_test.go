package h2

import (
	"bytes"
	"testing"

	"golang.org/x/net/http2"
)

// A header block is cut into frames no smaller than HTTP/2's minimum
// frame size whatever the size given: a size of 0 once looped without
// end, appending empty frames.
func TestHeadersAnyFrameSize(t *testing.T) {
	block := bytes.Repeat([]byte{'h'}, 40000)
	for _, size := range []int{0, -1, 1, minFrameSize, 20000, 1 << 20} {
		fr := http2.NewFramer(nil, bytes.NewReader(appendHeaders(nil, 1, block, true, size)))
		fr.SetMaxReadFrameSize(1<<24 - 1)
		var got []byte
		for frames := 0; ; frames++ {
			f, err := fr.ReadFrame()
			if err != nil {
				t.Fatalf("size %d: frame %d: %v", size, frames, err)
			}
			if n := int(f.Header().Length); n < min(len(block)-len(got), minFrameSize) || n > max(size, minFrameSize) {
				t.Fatalf("size %d: frame %d of %d bytes", size, frames, n)
			}
			switch f := f.(type) {
			case *http2.HeadersFrame:
				got = append(got, f.HeaderBlockFragment()...)
			case *http2.ContinuationFrame:
				got = append(got, f.HeaderBlockFragment()...)
			}
			if f.Header().Flags.Has(http2.FlagHeadersEndHeaders) {
				break
			}
		}
		if !bytes.Equal(got, block) {
			t.Errorf("size %d: %d bytes of the block sent, want %d", size, len(got), len(block))
		}
	}
}

package outputreader_test

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/flyteorg/flyte/flyteidl/gen/pb-go/flyteidl/core"
	"gocloud.dev/blob/memblob"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	kferrors "github.com/kfelastic/kfelastic/errors"
	"github.com/kfelastic/kfelastic/outputreader"
)

// referenceRootCause is the dumb version Read must agree with: open every
// document, rank by (timestamp or else modification time, worker, key); a
// document that cannot be decoded is skipped, and is a failure too, at its
// modification time, of the worker its name carries, else of the one its
// bytes name as far as they can be read.
func referenceRootCause(docs map[string][]byte, modified map[string]time.Time) (key string, skipped int) {
	type cand struct {
		at     time.Time
		worker string
		key    string
		code   string
	}
	var all []cand
	for k, data := range docs {
		f, err := kferrors.DecodeFailure(data, kferrors.DefaultMaxDocumentBytes)
		if err != nil {
			skipped++
			w := kferrors.WorkerFromKey(k)
			if p, ok := kferrors.PartialFailure(data); ok && w == "" {
				w = p.Worker
			}
			all = append(all, cand{modified[k], w, k, ""})
			continue
		}
		at := f.Time
		if at.IsZero() {
			at = modified[k]
		}
		all = append(all, cand{at, f.Worker, k, f.Code})
	}
	if len(all) == 0 {
		return "", skipped
	}
	order := func(a, b cand) int {
		if c := a.at.Compare(b.at); c != 0 {
			return c
		}
		if c := strings.Compare(a.worker, b.worker); c != 0 {
			return c
		}
		return strings.Compare(a.key, b.key)
	}
	best := slices.MinFunc(all, order)
	// A peer's secondary failure yields to the earliest hardware fault
	// within HardwareWindow after it.
	if kferrors.IsSecondaryCode(best.code) {
		var hw []cand
		for _, c := range all {
			if kferrors.IsHardwareCode(c.code) && !c.at.After(best.at.Add(outputreader.HardwareWindow)) {
				hw = append(hw, c)
			}
		}
		if len(hw) > 0 {
			best = slices.MinFunc(hw, order)
		}
	}
	return best.key, skipped
}

// FuzzRootCause generates a set of documents from the fuzz input — ours with
// honest or later-than-named stamps, flytekit's, untimed, arbitrary bytes,
// timestamps present but empty, invalid or out of range, messages that are
// not UTF-8 — and checks Read's root cause, counts and order against the
// reference, that no document ranks before the year 2000 (as 1970), and
// Summarize against Read.
func FuzzRootCause(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 0, 1, 2, 4, 1, 5, 1, 9, 2, 0, 3, 1})
	f.Add([]byte{3, 255, 0, 0, 4, 0, 0, 0, 0, 0, 1, 0})
	f.Add([]byte("\x02\x00\x01\x00\x02\x00\x01\x00\x00\x00\x01\x00\x01\x00\x00\x07"))
	f.Add(make([]byte, 160))
	f.Fuzz(func(t *testing.T, in []byte) {
		if len(in) < 1 || len(in) > 4*200 {
			return
		}
		ctx := context.Background()
		b := memblob.OpenBucket(nil)
		defer b.Close()
		base := time.Date(2026, 1, 2, 10, 0, 0, 0, time.UTC)
		docs := map[string][]byte{}
		opts := &outputreader.Options{Concurrency: 1 + int(in[0]%4)}
		for i := 0; i+4 <= len(in); i += 4 {
			kind, off, w, extra := in[i]%7, in[i+1], in[i+2]%4, in[i+3]
			at := base.Add(time.Duration(off) * 10 * time.Millisecond)
			worker := fmt.Sprintf("job-worker-%d", w)
			fl := kferrors.UserError(fmt.Sprintf("E%d", i), "m", worker, at)
			var key string
			var data []byte
			switch kind {
			case 0: // ours, stamped as named; some a peer's NCCL error, some a hardware fault
				switch extra % 4 {
				case 2:
					fl = kferrors.SystemFailure(kferrors.CodeNcclTimeout, "m", worker, at)
				case 3:
					fl = kferrors.SystemFailure(kferrors.CodeGpuFallenOffBus, "m", worker, at)
				}
				key = kferrors.DocumentKey(fl, fmt.Sprintf("%016x", i))
			case 1: // ours, stored time later than the name says
				key = kferrors.NewKey(at, worker, fmt.Sprintf("%016x", i))
				fl.Time = at.Add(time.Duration(extra) * 7 * time.Millisecond)
			case 2: // flytekit
				key = fmt.Sprintf("error-%032x.pb", i)
			case 3: // arbitrary bytes
				key = fmt.Sprintf("error-%032x.pb", i)
				data = in[i:min(len(in), i+int(extra%16))]
			case 4: // untimed: ranks by modification time, after every stamp
				key = fmt.Sprintf("error-%032x.pb", i)
				fl.Time = time.Time{}
			case 5: // a timestamp no writer of ours stores: empty, invalid, out of range
				key = fmt.Sprintf("error-%032x.pb", i)
				ts := []*timestamppb.Timestamp{{}, {Nanos: int32(extra)}, {Seconds: -int64(extra)}, {Seconds: 253402300800 + int64(extra)},
					{Seconds: at.Unix(), Nanos: -1 - int32(extra)}, {Seconds: at.UnixMilli()}}[int(extra)%6]
				var err error
				data, err = proto.Marshal(&core.ErrorDocument{Error: &core.ContainerError{Code: "Bad", Worker: worker, Timestamp: ts}})
				if err != nil {
					t.Fatal(err)
				}
			case 6: // a message that is not UTF-8 (proto refuses to encode it: patch the bytes)
				key = fmt.Sprintf("error-%032x.pb", i)
				fl.Message = "caf#"
				var err error
				if data, err = kferrors.Encode(fl.Document(0)); err != nil {
					t.Fatal(err)
				}
				data[bytes.IndexByte(data, '#')] = 0x80 | extra
			}
			if kind != 3 && kind != 5 && kind != 6 {
				var err error
				if data, err = kferrors.Encode(fl.Document(0)); err != nil {
					t.Fatal(err)
				}
			}
			if err := b.WriteAll(ctx, key, data, nil); err != nil {
				t.Fatal(err)
			}
			docs[key] = data
		}
		modified := map[string]time.Time{}
		for k := range docs {
			a, err := b.Attributes(ctx, k)
			if err != nil {
				t.Fatal(err)
			}
			modified[k] = a.ModTime
		}
		wantKey, wantSkipped := referenceRootCause(docs, modified)
		r, _ := readBoth(t, b, opts.Concurrency)
		if len(r.Skipped) != wantSkipped {
			t.Fatalf("skipped %d, want %d: %v", len(r.Skipped), wantSkipped, r.Skipped)
		}
		if wantKey == "" {
			if r.RootCause != nil {
				t.Fatalf("root cause %+v, want none", r.RootCause)
			}
			return
		}
		if r.RootCause == nil || r.RootCause.Key != wantKey {
			t.Fatalf("root cause %+v, want %s", r.RootCause, wantKey)
		}
		if r.RootCause.At.Before(kferrors.EarliestUsableTime) {
			t.Fatalf("root cause ranked at %v", r.RootCause.At)
		}
		if got := 1 + len(r.Others); got != len(docs) {
			t.Fatalf("%d documents accounted for, %d stored", got, len(docs))
		}
		for i, d := range r.Others {
			if outputreader.Less(d, *r.RootCause) && r.Displaced == nil {
				t.Fatalf("other %s ranks before the root cause", d.Key)
			}
			if i > 0 && outputreader.Less(d, r.Others[i-1]) && r.Others[i-1].Opened() && d.Opened() {
				t.Fatalf("others out of order at %d", i)
			}
		}
	})
}

func TestLessIsATotalOrder(t *testing.T) {
	base := time.Date(2026, 1, 2, 10, 0, 0, 0, time.UTC)
	docs := []outputreader.Document{
		{Key: "b", Failure: kferrors.Failure{Worker: "w1"}, At: base},
		{Key: "a", Failure: kferrors.Failure{Worker: "w1"}, At: base},
		{Key: "a", Failure: kferrors.Failure{Worker: "w0"}, At: base},
		{Key: "z", Failure: kferrors.Failure{Worker: "w0"}, At: base.Add(-time.Nanosecond)},
		{Key: "untimed", Failure: kferrors.Failure{Worker: "a"}}, // no time at all: last, never 1970
		{Key: "ftime", Failure: kferrors.Failure{Worker: "w9", Time: base.Add(time.Second)}},
		{Key: "mtime", Modified: base.Add(2 * time.Second)},
	}
	want := []string{"z", "a", "a", "b", "ftime", "mtime", "untimed"}
	slices.SortFunc(docs, func(a, b outputreader.Document) int {
		if outputreader.Less(a, b) {
			return -1
		}
		if outputreader.Less(b, a) {
			return 1
		}
		return 0
	})
	for i, d := range docs {
		if d.Key != want[i] {
			t.Fatalf("order %v", docs)
		}
	}
	if docs[1].Failure.Worker != "w0" {
		t.Fatal("same time: worker decides before key")
	}
}

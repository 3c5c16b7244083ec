package outputreader_test

import (
	"context"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"gocloud.dev/blob/memblob"

	kferrors "github.com/kfelastic/kfelastic/errors"
	"github.com/kfelastic/kfelastic/outputreader"
	"github.com/kfelastic/kfelastic/outputreader/flyteio"
)

func TestMessageGolden(t *testing.T) {
	at := time.Date(2026, 11, 21, 10, 0, 1, 123456789, time.UTC)
	root := &outputreader.Document{
		Key:     "error-1795254401123456789-job-worker-1-0123456789abcdef.pb",
		Failure: kferrors.UserError("RuntimeError", "CUDA error: device-side assert triggered", "job-worker-1", at),
		At:      at,
	}
	other := func(worker, code string, opened bool) outputreader.Document {
		d := outputreader.Document{Failure: kferrors.Failure{Worker: worker, Code: code}, At: at.Add(time.Second)}
		if !opened {
			d.AtSource = outputreader.TimeFromName
		}
		return d
	}
	cases := []struct {
		name string
		r    outputreader.Report
		want string
	}{
		{"alone", outputreader.Report{RootCause: root},
			"[job-worker-1, 2026-11-21T10:00:01.123456789Z] RuntimeError: CUDA error: device-side assert triggered"},
		{"tally", outputreader.Report{RootCause: root, Others: []outputreader.Document{
			other("job-worker-0", kferrors.CodePreempted, true), other("job-worker-2", kferrors.CodeNonZeroExit, true), other("job-worker-3", kferrors.CodePreempted, true)}},
			"[job-worker-1, 2026-11-21T10:00:01.123456789Z] RuntimeError: CUDA error: device-side assert triggered\n" +
				"Also failed: 3 other workers (2× Preempted, 1× NonZeroExit). Earliest failure shown."},
		{"not opened, same worker again, skipped", outputreader.Report{RootCause: root,
			Others: []outputreader.Document{
				other("job-worker-1", "DistNetworkError", true), other("job-worker-2", "", false), other("job-worker-3", "", false)},
			Skipped: []outputreader.Skipped{{Key: "error.pb", Err: outputreader.ErrNotFound}}},
			"[job-worker-1, 2026-11-21T10:00:01.123456789Z] RuntimeError: CUDA error: device-side assert triggered\n" +
				"Also failed: 2 other workers, 3 other documents (1× DistNetworkError, 2 later, not opened). Skipped 1 document that vanished while read. Earliest failure shown."},
		{"legacy root", outputreader.Report{RootCause: &outputreader.Document{
			Key: "error.pb", Failure: kferrors.UserError("OldError", "", "", time.Time{}), At: at, AtSource: outputreader.TimeFromModified}},
			"[error.pb, 2026-11-21T10:00:01.123456789Z (upload time)] OldError"},
		{"no root cause", outputreader.Report{Skipped: []outputreader.Skipped{{Key: "error.pb", Err: kferrors.ErrEmpty}}}, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := c.r.Message(); got != c.want {
				t.Fatalf("got\n%s\nwant\n%s", got, c.want)
			}
		})
	}
}

func TestExecutionErrorFollowsRootKind(t *testing.T) {
	at := time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC)
	for _, f := range []kferrors.Failure{
		kferrors.UserError("ValueError", "x", "w", at),
		kferrors.SystemFailure(kferrors.CodeOOMKilled, "x", "w", at),
		func() kferrors.Failure {
			f := kferrors.UserError(kferrors.CodeRecoverable, "x", "w", at)
			f.Recoverable = true
			return f
		}(),
	} {
		r := outputreader.Report{RootCause: &outputreader.Document{Failure: f, At: at}}
		ee := flyteio.ExecutionError(r.Summary())
		if ee.IsRecoverable != f.Recoverable || ee.Kind != f.Origin || ee.Code != f.Code || ee.Message != r.Message() {
			t.Errorf("%s: %+v", f.Code, ee)
		}
	}
	if flyteio.ExecutionError((&outputreader.Report{}).Summary()) != nil {
		t.Fatal("no root cause must give nil")
	}
}

func TestRootMessageIsCapped(t *testing.T) {
	s := backends()[0].open(t)
	long := strings.Repeat("frame\n", 10000) + "RuntimeError: the end"
	ours(t, s, kferrors.UserError("RuntimeError", long, "w", t0))
	r, err := outputreader.Read(context.Background(), s.src, &outputreader.Options{MessageCap: 200})
	if err != nil {
		t.Fatal(err)
	}
	m := r.RootCause.Failure.Message
	if len(m) > 200 || !strings.HasSuffix(m, "RuntimeError: the end") {
		t.Fatalf("capped message %d bytes: %q", len(m), m)
	}
}

// FuzzRootMessage: whatever the stored message and cap, the root cause's
// message stays within the cap, is valid UTF-8, is unchanged when it fits,
// and the UI message carries it.
func FuzzRootMessage(f *testing.F) {
	f.Add("RuntimeError: boom\n", 64)
	f.Add(strings.Repeat("日本語 ", 100)+"\xff tail", 50)
	f.Add("", 1)
	f.Fuzz(func(t *testing.T, msg string, max int) {
		if max <= 0 || max > 1<<14 || len(msg) > 1<<16 {
			return
		}
		b := memblob.OpenBucket(nil)
		defer b.Close()
		ctx := context.Background()
		at := time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC)
		data, err := kferrors.Encode(kferrors.UserError("E", msg, "w", at).Document(1 << 20))
		if err != nil {
			t.Fatal(err)
		}
		if err := b.WriteAll(ctx, kferrors.NewKey(at, "w", "0"), data, nil); err != nil {
			t.Fatal(err)
		}
		r, err := outputreader.Read(ctx, outputreader.NewBucketSource(b), &outputreader.Options{MessageCap: max})
		if err != nil {
			t.Fatal(err)
		}
		got := r.RootCause.Failure.Message
		if len(got) > max || !utf8.ValidString(got) || !utf8.ValidString(r.Message()) {
			t.Fatalf("cap %d: %d bytes, valid %v", max, len(got), utf8.ValidString(got))
		}
		if stored := kferrors.ValidUTF8(msg); len(stored) <= max && got != stored {
			t.Fatalf("fitting message changed: %q → %q", stored, got)
		}
		if want := strings.TrimRight(got, " \t\r\n"); !strings.Contains(r.Message(), want) {
			t.Fatalf("UI message lacks the root message: %q", r.Message())
		}
	})
}

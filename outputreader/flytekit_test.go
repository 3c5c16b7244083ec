package outputreader_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"gocloud.dev/blob"
	"gocloud.dev/blob/memblob"

	kferrors "github.com/kfelastic/kfelastic/errors"
	"github.com/kfelastic/kfelastic/internal/test/flytekitdoc"
	"github.com/kfelastic/kfelastic/outputreader"
)

// Two pods of a flytekit Elastic task fail within one second: job-worker-1
// raised ValueError at .300, job-worker-0's worker then lost its peer
// ("[gloo] Connection closed by peer") at .700. flytekit's documents carry
// torch's whole second, so the tie goes to the worker name and the
// secondary failure is shown; the documents the agent refines under
// --launcher command (the worker's error file's time; flytekit's moved to
// refined/) put the real root cause first. The UI shows flytekit's
// USER:RuntimeError as the exception it wraps.
func TestFlytekitDocumentsSameSecond(t *testing.T) {
	ctx := context.Background()
	second := time.Date(2026, 11, 25, 21, 33, 0, 0, time.UTC)
	valueErr := flytekitdoc.Failure("job-worker-1", "ValueError: batch 17 has NaN labels", "/tmp/torchelastic_a/run/attempt_0/0/error.json", second.Add(300*time.Millisecond))
	glooErr := flytekitdoc.Failure("job-worker-0", "RuntimeError: [gloo] Connection closed by peer [10.0.0.7]:33155", "/tmp/torchelastic_b/run/attempt_0/0/error.json", second.Add(700*time.Millisecond))
	put := func(b *blob.Bucket, key string, f kferrors.Failure) {
		data, err := kferrors.Encode(f.Document(0))
		if err != nil {
			t.Fatal(err)
		}
		if err := b.WriteAll(ctx, key, data, nil); err != nil {
			t.Fatal(err)
		}
	}
	read := func(b *blob.Bucket) *outputreader.Report {
		r, err := outputreader.Read(ctx, outputreader.NewBucketSource(b), nil)
		if err != nil || r.RootCause == nil {
			t.Fatalf("Read: %v %+v", err, r)
		}
		return r
	}

	// As flytekit writes them: whole seconds, the tie decides.
	flytekit := memblob.OpenBucket(nil)
	put(flytekit, flytekitdoc.Key(), valueErr)
	put(flytekit, flytekitdoc.Key(), glooErr)
	if r := read(flytekit); r.RootCause.Failure.Worker != "job-worker-0" || r.RootCause.Time().Nanosecond() != 0 {
		t.Fatalf("whole seconds: the tie should go to the name (job-worker-0), got %s at %s", r.RootCause.Failure.Worker, r.RootCause.Time())
	}

	// As the agent leaves them: its refined copies under our names.
	refined := memblob.OpenBucket(nil)
	for _, f := range []kferrors.Failure{valueErr, glooErr} {
		at := second.Add(300 * time.Millisecond)
		if f.Worker == "job-worker-0" {
			at = second.Add(700 * time.Millisecond)
		}
		f.Time = at
		key, data, err := kferrors.NewWriter(nil, nil).Prepare(f)
		if err != nil {
			t.Fatal(err)
		}
		if err := refined.WriteAll(ctx, key, data, nil); err != nil {
			t.Fatal(err)
		}
		put(refined, kferrors.RefinedPrefix+flytekitdoc.Key(), f)
	}
	r := read(refined)
	if r.RootCause.Failure.Worker != "job-worker-1" || !r.RootCause.Time().Equal(second.Add(300*time.Millisecond)) || len(r.Others) != 1 {
		t.Fatalf("refined: root cause %s at %s, %d others; want job-worker-1 at .300", r.RootCause.Failure.Worker, r.RootCause.Time(), len(r.Others))
	}
	msg := r.Message()
	want := "[job-worker-1, 2026-11-25T21:33:00.300000000Z] ValueError: batch 17 has NaN labels\n\nTrace:\n\n    Traceback"
	if !strings.HasPrefix(msg, want) || !strings.Contains(msg, "Also failed: 1 other worker (1× RuntimeError).") {
		t.Errorf("UI message:\n%s\nwant it to start %q and tally 1× RuntimeError", msg, want)
	}
	if r.RootCause.Failure.Code != flytekitdoc.Code {
		t.Errorf("the document keeps flytekit's code; got %s", r.RootCause.Failure.Code)
	}
}

func TestWrappedException(t *testing.T) {
	at := time.Date(2026, 11, 25, 21, 33, 0, 0, time.UTC)
	for _, c := range []struct {
		code, line, want string
	}{
		{flytekitdoc.Code, "ValueError: batch 17 has NaN labels", "ValueError"},
		{flytekitdoc.Code, "torch.distributed.DistBackendError: NCCL error", "DistBackendError"},
		{flytekitdoc.Code, "KeyboardInterrupt", "KeyboardInterrupt"},
		{flytekitdoc.Code, "Signal 9 (SIGKILL) received by PID 4242", "SignalSIGKILL"},
		{"RecoverableFlyteException", "__mp_main__.FlyteRecoverableException: USER:Recoverable: error=spot", "FlyteRecoverableException"},
		{"ValueError", "ValueError: not flytekit's", ""},
	} {
		exc, line, ok := outputreader.WrappedException(c.code, flytekitdoc.Message(c.line, "/tmp/e.json", at))
		if c.want == "" {
			if ok {
				t.Errorf("%s: %q is no wrapper code, got %s", c.line, c.code, exc)
			}
			continue
		}
		if !ok || exc != c.want || line != c.line {
			t.Errorf("%s: got %q %q %v, want %s", c.line, exc, line, ok, c.want)
		}
	}
	// No root cause table (a task that failed before torch ran): as it is.
	if _, _, ok := outputreader.WrappedException(flytekitdoc.Code, "Trace:\n\n    Traceback…\n    ImportError: no torch\n"); ok {
		t.Error("a message without torch's root cause gave an exception")
	}
	if code, msg := outputreader.Shown("OOMKilled", "m"); code != "OOMKilled" || msg != "m" {
		t.Errorf("Shown of another code: %s %s", code, msg)
	}
}

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

// Issue 27: flytekit's wrapper codes show the exception they wrap, in the
// shapes real flytekit 1.16 writes: a task that is not Elastic (or raised
// outside torch) names the user's exception in its "Message:" section; an
// Elastic task's "Message:" is flytekit's wrapper again, and torch's table
// names the exception.
func TestWrappedExceptionFlytekitShapes(t *testing.T) {
	at := time.Date(2026, 11, 25, 21, 33, 0, 0, time.UTC)
	userTrace := `Traceback (most recent call last):
  File "/usr/lib/python3/dist-packages/flytekit/core/base_task.py", line 764, in dispatch_execute
    native_outputs = self.execute(**native_inputs)
  File "/app/train.py", line 41, in train
    raise ValueError(f"loss is NaN at step {step}")
ValueError: loss is NaN at step 20
`
	long := strings.Repeat("  File \"/app/deep.py\", line 1, in f\n    f()\n", 4000) // ≈170 KiB: capped, tail kept
	for _, c := range []struct {
		name, code, message string
		want, line          string
	}{
		{"plain task", flytekitdoc.Code, flytekitdoc.TaskMessage(userTrace, "ValueError: loss is NaN at step 20"),
			"ValueError", "ValueError: loss is NaN at step 20"},
		{"multi-line value", flytekitdoc.Code, flytekitdoc.TaskMessage(userTrace, "AssertionError: shapes differ\n(3, 4) vs (4, 3)"),
			"AssertionError", "AssertionError: shapes differ"},
		{"value without text", flytekitdoc.Code, flytekitdoc.TaskMessage(userTrace, "KeyboardInterrupt: "),
			"KeyboardInterrupt", "KeyboardInterrupt:"},
		{"capped, tail kept", flytekitdoc.Code,
			kferrors.CapMessage(flytekitdoc.TaskMessage("Traceback (most recent call last):\n"+long+"RecursionError: maximum recursion depth exceeded\n",
				"RecursionError: maximum recursion depth exceeded"), kferrors.DefaultMessageCap),
			"RecursionError", "RecursionError: maximum recursion depth exceeded"},
		{"Message: inside the traceback too", flytekitdoc.Code,
			flytekitdoc.TaskMessage("Traceback (most recent call last):\nMessage:\n\n    NotThis: x\nKeyError: 'label'\n", "KeyError: 'label'"),
			"KeyError", "KeyError: 'label'"},
		{"elastic: table under flytekit's wrapper", flytekitdoc.Code,
			flytekitdoc.Message("ValueError: batch 17 has NaN labels", "/tmp/e.json", at), "ValueError", "ValueError: batch 17 has NaN labels"},
		{"elastic, recoverable: table", "RecoverableFlyteException",
			flytekitdoc.Message("__mp_main__.FlyteRecoverableException: USER:Recoverable: error=spot", "/tmp/e.json", at),
			"FlyteRecoverableException", "__mp_main__.FlyteRecoverableException: USER:Recoverable: error=spot"},
		{"recoverable, no table: as it is", "RecoverableFlyteException",
			flytekitdoc.TaskMessage(userTrace, "FlyteRecoverableException: RecoverableFlyteException: error=spot instance preempted"), "", ""},
		{"wrapper without table: as it is", flytekitdoc.Code,
			flytekitdoc.TaskMessage(userTrace, "FlyteUserRuntimeException: USER:RuntimeError: error=boom"), "", ""},
		{"not flytekit's message", flytekitdoc.Code, "boom", "", ""},
		{"section not indented", flytekitdoc.Code, "Trace:\n\nx\nMessage:\n\nValueError: x", "", ""},
		{"not a wrapper code", "ValueError", flytekitdoc.TaskMessage(userTrace, "ValueError: loss is NaN at step 20"), "", ""},
	} {
		exc, line, ok := outputreader.WrappedException(c.code, c.message)
		if c.want == "" {
			if ok {
				t.Errorf("%s: got %s (%q), want the code as it is", c.name, exc, line)
			}
			continue
		}
		if !ok || exc != c.want || line != c.line {
			t.Errorf("%s: got %q %q %v, want %s %q", c.name, exc, line, ok, c.want, c.line)
		}
	}

	// An Elastic task's exception of a megabyte, its message capped inside
	// the exception's line (as the agent rewrites such a document): the
	// line's head names it, cut to 1 KiB.
	capped := kferrors.CapMessage(flytekitdoc.Message("ValueError: loss is NaN; batch "+strings.Repeat("[nan, nan] ", 100_000), "/tmp/e.json", at),
		kferrors.DefaultMessageCap)
	if exc, line, ok := outputreader.WrappedException(flytekitdoc.Code, capped); !ok || exc != "ValueError" ||
		!strings.HasPrefix(line, "ValueError: loss is NaN; batch [nan, nan]") || len(line) > 1<<10 {
		t.Errorf("capped: got %q %.80q (%d bytes) %v, want ValueError", exc, line, len(line), ok)
	}

	// The UI message and the tally show it, the document keeps flytekit's code.
	b := memblob.OpenBucket(nil)
	defer b.Close()
	f := kferrors.UserError(flytekitdoc.Code, flytekitdoc.TaskMessage(userTrace, "ValueError: loss is NaN at step 20"), "job-worker-1", at.Add(300*time.Millisecond))
	g := kferrors.UserError(flytekitdoc.Code, flytekitdoc.TaskMessage(userTrace, "KeyError: 'label'"), "job-worker-0", at.Add(700*time.Millisecond))
	for _, f := range []kferrors.Failure{f, g} {
		data, err := kferrors.Encode(f.Document(0))
		if err != nil {
			t.Fatal(err)
		}
		if err := b.WriteAll(t.Context(), flytekitdoc.Key(), data, nil); err != nil {
			t.Fatal(err)
		}
	}
	r, err := outputreader.Read(t.Context(), outputreader.NewBucketSource(b), nil)
	if err != nil || r.RootCause == nil {
		t.Fatalf("Read: %v", err)
	}
	msg := r.Message()
	if want := "[job-worker-1, 2026-11-25T21:33:00.300000000Z] ValueError: loss is NaN at step 20\n\nTrace:"; !strings.HasPrefix(msg, want) ||
		!strings.Contains(msg, "(1× KeyError)") {
		t.Errorf("UI message:\n%s\nwant it to start %q and tally 1× KeyError", msg, want)
	}
	if r.RootCause.Failure.Code != flytekitdoc.Code {
		t.Errorf("the document keeps flytekit's code; got %s", r.RootCause.Failure.Code)
	}
}

package errors_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/flyteorg/flyte/flyteidl/gen/pb-go/flyteidl/core"
	"gocloud.dev/blob"
	"gocloud.dev/blob/memblob"

	kferrors "github.com/kfelastic/kfelastic/errors"
)

var t0 = time.Date(2026, 11, 21, 10, 0, 0, 123456789, time.UTC)

func TestClassify(t *testing.T) {
	torchErr := &kferrors.TorchError{Message: "RuntimeError: boom", Traceback: "Traceback...\nRuntimeError: boom", Time: t0.Add(-time.Second)}
	cases := []struct {
		name        string
		exit        kferrors.Exit
		code        string
		recoverable bool
		origin      core.ExecutionError_ErrorKind
		at          time.Time
	}{
		{"user exception", kferrors.Exit{ExitCode: 1, TorchError: torchErr, ObservedAt: t0}, "RuntimeError", false, core.ExecutionError_USER, t0.Add(-time.Second)},
		{"flytekit recoverable", kferrors.Exit{ExitCode: 1, TorchError: torchErr, RecoverableMarker: true, ObservedAt: t0}, kferrors.CodeRecoverable, true, core.ExecutionError_USER, t0.Add(-time.Second)},
		{"plain non-zero exit", kferrors.Exit{ExitCode: 3, ObservedAt: t0}, kferrors.CodeNonZeroExit, false, core.ExecutionError_USER, t0},
		{"OOM wins over error file", kferrors.Exit{Signal: syscall.SIGKILL, OOM: true, TorchError: torchErr, ObservedAt: t0}, kferrors.CodeOOMKilled, true, core.ExecutionError_SYSTEM, t0},
		{"preempted", kferrors.Exit{Signal: syscall.SIGTERM, Preempted: true, ObservedAt: t0}, kferrors.CodePreempted, true, core.ExecutionError_SYSTEM, t0},
		{"kill -9", kferrors.Exit{Signal: syscall.SIGKILL, ObservedAt: t0}, "SignalSIGKILL", true, core.ExecutionError_SYSTEM, t0},
		{"segfault", kferrors.Exit{Signal: syscall.SIGSEGV, ObservedAt: t0}, "SignalSIGSEGV", true, core.ExecutionError_SYSTEM, t0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.exit.Worker = "job-worker-0/1"
			f := kferrors.Classify(c.exit)
			if f.Code != c.code || f.Recoverable != c.recoverable || f.Origin != c.origin || !f.Time.Equal(c.at) || f.Worker != "job-worker-0/1" {
				t.Fatalf("got %+v, want code=%s recoverable=%v origin=%v at=%v", f, c.code, c.recoverable, c.origin, c.at)
			}
		})
	}
}

func TestParseTorchErrorRefinesSeconds(t *testing.T) {
	data := []byte(`{"message":{"message":"ValueError: bad shape","extraInfo":{"py_callstack":"Traceback (most recent call last):\nValueError: bad shape","timestamp":"1795264324"}}}`)
	whole := time.Unix(1795264324, 0).UTC()
	te, err := kferrors.ParseTorchError(data, whole.Add(420*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if te.ExceptionType() != "ValueError" || !te.Time.Equal(whole.Add(420*time.Millisecond)) {
		t.Fatalf("got %+v type %s", te, te.ExceptionType())
	}
	// An mtime outside the recorded second (file copied later) is not trusted.
	te, _ = kferrors.ParseTorchError(data, whole.Add(5*time.Second))
	if !te.Time.Equal(whole) {
		t.Fatalf("mtime outside the second must not win: %v", te.Time)
	}
	// The string form torch also accepts.
	te, err = kferrors.ParseTorchError([]byte(`{"message":"torch.distributed.DistBackendError: peer gone"}`), whole)
	if err != nil || te.ExceptionType() != "torch.distributed.DistBackendError" {
		t.Fatalf("got %+v, %v", te, err)
	}
	for _, bad := range []string{"", "{", `{"other":1}`, `{"message":7}`} {
		if _, err := kferrors.ParseTorchError([]byte(bad), whole); err == nil {
			t.Errorf("%q: want an error", bad)
		}
	}
}

func TestReadTorchErrorWithMarker(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "error.json")
	if te, rec, err := kferrors.ReadTorchError(path); te != nil || rec || err != nil {
		t.Fatalf("missing file: %v %v %v", te, rec, err)
	}
	os.WriteFile(path, []byte(`{"message":{"message":"RuntimeError: x","extraInfo":{"timestamp":"1795264324"}}}`), 0o644)
	os.WriteFile(filepath.Join(dir, kferrors.RecoverableMarkerName), nil, 0o644)
	te, rec, err := kferrors.ReadTorchError(path)
	if err != nil || te == nil || !rec {
		t.Fatalf("got %v %v %v", te, rec, err)
	}
}

func TestDocumentRoundTrip(t *testing.T) {
	f := kferrors.SystemFailure(kferrors.CodeHang, "no progress for 30s", "pod-1/0", t0)
	data, err := kferrors.Encode(f.Document(0))
	if err != nil {
		t.Fatal(err)
	}
	got, err := kferrors.DecodeFailure(data, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got != f {
		t.Fatalf("round trip: got %+v want %+v", got, f)
	}
	// No timestamp stays "unknown", never 1970.
	f.Time = time.Time{}
	data, _ = kferrors.Encode(f.Document(0))
	got, _ = kferrors.DecodeFailure(data, 0)
	if !got.Time.IsZero() {
		t.Fatalf("missing timestamp decoded as %v", got.Time)
	}
}

func TestDecodeRejects(t *testing.T) {
	good, _ := kferrors.Encode(kferrors.UserError("E", "m", "w", t0).Document(0))
	cases := map[string]struct {
		data []byte
		max  int
		want error
	}{
		"empty":      {nil, 0, kferrors.ErrEmpty},
		"too large":  {good, 4, kferrors.ErrTooLarge},
		"garbage":    {[]byte{0xff, 0xff, 0xff}, 0, kferrors.ErrCorrupt},
		"no error":   {[]byte{}, 0, kferrors.ErrEmpty},
		"other type": {[]byte{0x10, 0x01}, 0, kferrors.ErrMissingError},
	}
	for name, c := range cases {
		if _, err := kferrors.Decode(c.data, c.max); !isErr(err, c.want) {
			t.Errorf("%s: got %v, want %v", name, err, c.want)
		}
	}
}

func isErr(err, target error) bool {
	for e := err; e != nil; {
		if e == target {
			return true
		}
		u, ok := e.(interface{ Unwrap() error })
		if !ok {
			return false
		}
		e = u.Unwrap()
	}
	return false
}

func TestKeysOrderByTimeAndStayInsidePrefix(t *testing.T) {
	k1 := kferrors.NewKey(t0, "w", "a")
	k2 := kferrors.NewKey(t0.Add(time.Nanosecond), "a", "a")
	if !(k1 < k2) {
		t.Fatalf("keys not in time order: %s %s", k1, k2)
	}
	if ts, ok := kferrors.TimeFromKey(k1); !ok || !ts.Equal(t0) {
		t.Fatalf("TimeFromKey(%s) = %v %v", k1, ts, ok)
	}
	if _, ok := kferrors.TimeFromKey("error-3f2a9c0d1e6b4a5f8c7d9e0f1a2b3c4d.pb"); ok {
		t.Fatal("flytekit's uuid key must carry no time")
	}
	// A sign would parse, yet break "key order is time order" ('+' < '0').
	if _, ok := kferrors.TimeFromKey("error-+999999999999999999-w-r.pb"); ok {
		t.Fatal("a signed number is not a key time")
	}
	for _, hostile := range []string{"../../etc/passwd", "a/../../b", "..", "/", "", "x\x00y", "ü/..\\..", strings.Repeat("a/", 200)} {
		k := kferrors.NewKey(t0, hostile, "r")
		if strings.Contains(k, "/") || strings.Contains(k, "..") || strings.Contains(k, "\\") || len(k) > 120 || !kferrors.IsDocumentKey(k) {
			t.Errorf("worker %q gave key %q", hostile, k)
		}
	}
}

// capReference is the dumb version CapMessage must agree with on what it keeps.
func capReference(msg string, max int) (head, tail string, ok bool) {
	msg = strings.ToValidUTF8(msg, "\uFFFD")
	if len(msg) <= max {
		return msg, "", true
	}
	return "", "", false
}

func checkCap(t *testing.T, msg string, max int) {
	got := kferrors.CapMessage(msg, max)
	if !utf8.ValidString(got) {
		t.Fatalf("invalid UTF-8 from %q cap %d: %q", msg, max, got)
	}
	if max >= 0 && len(got) > max {
		t.Fatalf("cap %d exceeded: %d bytes", max, len(got))
	}
	valid := strings.ToValidUTF8(msg, "\uFFFD")
	if whole, _, fits := capReference(msg, max); fits {
		if got != whole {
			t.Fatalf("fitting message changed: %q → %q", msg, got)
		}
		return
	}
	// Whatever is kept is a prefix and a suffix of the (valid) message.
	if i := strings.Index(got, "\n… ["); i >= 0 {
		j := strings.Index(got[i:], "] …\n")
		if j < 0 {
			t.Fatalf("marker not closed: %q", got)
		}
		head, tail := got[:i], got[i+j+len("] …\n"):]
		if !strings.HasPrefix(valid, head) || !strings.HasSuffix(valid, tail) {
			t.Fatalf("head/tail not from message: %q", got)
		}
		if max >= 200 && (len(head) == 0 || len(tail) == 0) {
			t.Fatalf("roomy cap %d kept no head or tail: %q", max, got)
		}
	} else if !strings.HasPrefix(valid, got) {
		t.Fatalf("tiny cap %d: %q is not a prefix", max, got)
	}
}

func TestCapMessage(t *testing.T) {
	long := strings.Repeat("héllo wörld ", 1000) + "RuntimeError: the end"
	checkCap(t, long, 256)
	if got := kferrors.CapMessage(long, 256); !strings.HasSuffix(got, "RuntimeError: the end") {
		t.Fatalf("tail lost: %q", got)
	}
	for _, max := range []int{0, 1, 2, 5, 20, 30, 31, 64, 1000} {
		checkCap(t, long, max)
	}
	checkCap(t, "short", 100)
	checkCap(t, "bad \xff\xfe bytes", 100)
}

func FuzzCapMessage(f *testing.F) {
	f.Add("RuntimeError: boom", 10)
	f.Add(strings.Repeat("日本語", 50), 40)
	f.Add("\xff\xfe\xfd", 2)
	f.Fuzz(func(t *testing.T, msg string, max int) {
		if max < 0 || max > 1<<16 {
			return
		}
		checkCap(t, msg, max)
	})
}

func FuzzDecode(f *testing.F) {
	good, _ := kferrors.Encode(kferrors.UserError("RuntimeError", "boom", "pod-0", t0).Document(0))
	f.Add(good)
	f.Add([]byte{})
	f.Add([]byte{0x0a, 0x00})
	f.Fuzz(func(t *testing.T, data []byte) {
		fl, err := kferrors.DecodeFailure(data, 4096)
		if err != nil {
			return
		}
		// Whatever decodes must re-encode and decode to the same failure.
		again, err := kferrors.Encode(fl.Document(1 << 20))
		if err != nil {
			t.Fatalf("re-encode: %v", err)
		}
		back, err := kferrors.DecodeFailure(again, 1<<21)
		if err != nil || back.Code != fl.Code || back.Worker != fl.Worker || !back.Time.Equal(fl.Time) {
			t.Fatalf("round trip: %+v vs %+v (%v)", fl, back, err)
		}
	})
}

func FuzzSanitizeWorker(f *testing.F) {
	f.Add("../../x")
	f.Add("pod/0")
	f.Fuzz(func(t *testing.T, w string) {
		s := kferrors.SanitizeWorker(w)
		if s == "" || strings.Contains(s, "/") || strings.Contains(s, "..") || strings.HasPrefix(s, ".") || len(s) > 64 {
			t.Fatalf("SanitizeWorker(%q) = %q", w, s)
		}
	})
}

func TestWriterNeverOverwrites(t *testing.T) {
	ctx := context.Background()
	forEachBucket(t, func(t *testing.T, b *blob.Bucket) {
		w := kferrors.NewWriter(b, nil)
		f := kferrors.UserError("RuntimeError", "boom", "../../evil/pod", t0)
		k1, err := w.Write(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		k2, err := w.Write(ctx, f)
		if err != nil || k1 == k2 {
			t.Fatalf("second write of the same failure: %s %s %v", k1, k2, err)
		}
		// A conditional write onto an existing key fails instead of replacing.
		err = b.WriteAll(ctx, k1, []byte("x"), &blob.WriterOptions{IfNotExist: true})
		if err == nil {
			t.Fatal("IfNotExist write replaced a document")
		}
		data, _ := b.ReadAll(ctx, k1)
		got, err := kferrors.DecodeFailure(data, 0)
		if err != nil || got.Code != "RuntimeError" || got.Worker != "../../evil/pod" {
			t.Fatalf("stored document: %+v %v", got, err)
		}
	})
}

func TestOpenPrefixErrors(t *testing.T) {
	ctx := context.Background()
	for _, bad := range []string{"not a url", "nosuchscheme://x/y", "file:///definitely/not/here/kfelastic"} {
		if b, err := kferrors.OpenPrefix(ctx, bad, false); err == nil {
			b.Close()
			t.Errorf("%q: want an error", bad)
		}
	}
}

func TestSupersedeMovesOnlyThePodsEarlierDocuments(t *testing.T) {
	ctx := context.Background()
	forEachBucket(t, func(t *testing.T, b *blob.Bucket) {
		w := kferrors.NewWriter(b, nil)
		put := func(worker string, at time.Time) string {
			k, err := w.Write(ctx, kferrors.UserError("RuntimeError", "boom", worker, at))
			if err != nil {
				t.Fatal(err)
			}
			return k
		}
		restart := t0.Add(10 * time.Second)
		// flytekit's naming: no time in the key, the document must be opened.
		flytekitKey := "error-3f2a9c0d1e6b4a5f8c7d9e0f1a2b3c4d.pb"
		data, _ := kferrors.Encode(kferrors.UserError("USER:Recoverable", "x", "job-worker-1/0", t0).Document(0))
		b.WriteAll(ctx, flytekitKey, data, nil)
		mine := []string{put("job-worker-1/0", t0), put("job-worker-1", t0.Add(time.Second)), flytekitKey}
		kept := []string{
			put("job-worker-1/1", restart.Add(time.Second)), // after the restart: the new group's
			put("job-worker-10/0", t0),                      // another pod whose name extends ours
			put("job-worker-2/0", t0),                       // another pod
		}
		b.WriteAll(ctx, "error-corrupt.pb", []byte{0xff}, nil)
		kept = append(kept, "error-corrupt.pb")

		moved, err := kferrors.Supersede(ctx, b, "job-worker-1", restart)
		if err != nil {
			t.Fatal(err)
		}
		if len(moved) != len(mine) {
			t.Fatalf("moved %v, want %v", moved, mine)
		}
		for _, k := range mine {
			if ok, _ := b.Exists(ctx, k); ok {
				t.Errorf("%s still decides the outcome", k)
			}
			if ok, _ := b.Exists(ctx, kferrors.SupersededPrefix+k); !ok {
				t.Errorf("%s was lost, not kept under %s", k, kferrors.SupersededPrefix)
			}
		}
		for _, k := range kept {
			if ok, _ := b.Exists(ctx, k); !ok {
				t.Errorf("%s was moved but is not an earlier failure of the pod", k)
			}
		}
		// Idempotent: a second call finds nothing more to move.
		if again, err := kferrors.Supersede(ctx, b, "job-worker-1", restart); err != nil || len(again) != 0 {
			t.Fatalf("second call: %v %v", again, err)
		}
	})
}

func TestWorkerFromKey(t *testing.T) {
	for key, want := range map[string]string{
		kferrors.NewKey(t0, "job-worker-1/0", "ab12"): "job-worker-1.0",
		kferrors.NewKey(t0, "../../x", "r"):           "_._._x",
		"error-3f2a9c0d1e6b4a5f8c7d9e0f1a2b3c4d.pb":   "",
		kferrors.LegacyKey:                            "",
		"error-1795255201000000000-.pb":               "",
		"error-1795255201000000000-nodash.pb":         "",
	} {
		if got := kferrors.WorkerFromKey(key); got != want {
			t.Errorf("WorkerFromKey(%q) = %q, want %q", key, got, want)
		}
	}
}

// forEachBucket runs f over a mem:// bucket and a file:// one opened by URL
// (OpenPrefix, creating the folder), as the writers meet them.
func forEachBucket(t *testing.T, f func(t *testing.T, b *blob.Bucket)) {
	for name, open := range map[string]func() (*blob.Bucket, error){
		"mem": func() (*blob.Bucket, error) { return memblob.OpenBucket(nil), nil },
		"file": func() (*blob.Bucket, error) {
			return kferrors.OpenPrefix(context.Background(), "file://"+filepath.Join(t.TempDir(), "outputs", "attempt-0"), true)
		},
	} {
		t.Run(name, func(t *testing.T) {
			b, err := open()
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			f(t, b)
		})
	}
}

func TestHeadlineSaysTheCodeOnce(t *testing.T) {
	cases := []struct{ code, msg, want string }{
		{"ValueError", "ValueError: batch 17 has NaN labels", "ValueError: batch 17 has NaN labels"},
		{"ValueError", "batch 17 has NaN labels", "ValueError: batch 17 has NaN labels"},
		{"ValueError", "ValueError", "ValueError"},
		{"ValueError", "\n  ValueError: x\n", "ValueError: x\n"},
		{"ValueError", "ValueErrors were seen", "ValueError: ValueErrors were seen"},
		{"USER:ValueError", "ValueError: batch 17", "USER:ValueError: batch 17"},
		{"USER:ValueError", "USER:ValueError: batch 17", "USER:ValueError: batch 17"},
		{kferrors.CodeRecoverable, "USER:Recoverable: try again", "USER:Recoverable: try again"},
		{kferrors.CodeRecoverable, "Recoverable: try again", "USER:Recoverable: try again"},
		{kferrors.CodeRecoverable, "FlyteRecoverableException: try again", "USER:Recoverable: FlyteRecoverableException: try again"},
		{"torch.distributed.DistNetworkError", "torch.distributed.DistNetworkError: Connection closed by peer", "torch.distributed.DistNetworkError: Connection closed by peer"},
		{"E:", "E: x", "E: x"},
		{"", "just a message", "just a message"},
		{"OOMKilled", "", "OOMKilled"},
		{"", "", ""},
	}
	for _, c := range cases {
		if got := kferrors.Headline(c.code, c.msg); got != c.want {
			t.Errorf("Headline(%q, %q) = %q, want %q", c.code, c.msg, got, c.want)
		}
	}
}

func TestPodOf(t *testing.T) {
	for worker, want := range map[string]string{"job-worker-1/0": "job-worker-1", "job-worker-1": "job-worker-1", "a/b/12": "a/b",
		"pod/x": "pod/x", "pod/": "pod/", "/3": "/3", "": ""} {
		if got := kferrors.PodOf(worker); got != want {
			t.Errorf("PodOf(%q) = %q, want %q", worker, got, want)
		}
	}
	if got := kferrors.PodOfSanitized(kferrors.SanitizeWorker("job-worker-1/7")); got != "job-worker-1" {
		t.Errorf("PodOfSanitized = %q", got)
	}
}

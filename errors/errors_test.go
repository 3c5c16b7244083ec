package errors_test

import (
	"context"
	"math/rand/v2"
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
	"google.golang.org/protobuf/encoding/protowire"

	kferrors "github.com/kfelastic/kfelastic/errors"
	"github.com/kfelastic/kfelastic/internal/test/testenv"
)

var t0 = time.Date(2026, 11, 21, 10, 0, 0, 123456789, time.UTC)

func TestClassify(t *testing.T) {
	torchErr := &kferrors.TorchError{Message: "RuntimeError: boom", Traceback: "Traceback...\nRuntimeError: boom", Time: t0.Add(-time.Second)}
	cases := []struct {
		name        string
		exit        kferrors.WorkerExit
		code        string
		recoverable bool
		origin      core.ExecutionError_ErrorKind
		at          time.Time
	}{
		{"user exception", kferrors.WorkerExit{ExitCode: 1, TorchError: torchErr, ObservedAt: t0}, "RuntimeError", false, core.ExecutionError_USER, t0.Add(-time.Second)},
		{"flytekit recoverable", kferrors.WorkerExit{ExitCode: 1, TorchError: torchErr, RecoverableMarker: true, ObservedAt: t0}, kferrors.CodeRecoverable, true, core.ExecutionError_USER, t0.Add(-time.Second)},
		{"plain non-zero exit", kferrors.WorkerExit{ExitCode: 3, ObservedAt: t0}, kferrors.CodeNonZeroExit, false, core.ExecutionError_USER, t0},
		{"OOM wins over error file", kferrors.WorkerExit{Signal: syscall.SIGKILL, OOM: true, TorchError: torchErr, ObservedAt: t0}, kferrors.CodeOOMKilled, true, core.ExecutionError_SYSTEM, t0},
		{"OOM dated when its count rose", kferrors.WorkerExit{Signal: syscall.SIGKILL, OOM: true, OOMSeenAt: t0.Add(-600 * time.Millisecond), ObservedAt: t0}, kferrors.CodeOOMKilled, true, core.ExecutionError_SYSTEM, t0.Add(-600 * time.Millisecond)},
		{"OOM count seen before the worker started", kferrors.WorkerExit{Signal: syscall.SIGKILL, OOM: true, OOMSeenAt: t0.Add(-time.Hour), StartedAt: t0.Add(-time.Minute), ObservedAt: t0}, kferrors.CodeOOMKilled, true, core.ExecutionError_SYSTEM, t0},
		{"preempted", kferrors.WorkerExit{Signal: syscall.SIGTERM, Preempted: true, ObservedAt: t0}, kferrors.CodePreempted, true, core.ExecutionError_SYSTEM, t0},
		{"kill -9", kferrors.WorkerExit{Signal: syscall.SIGKILL, ObservedAt: t0}, "SignalSIGKILL", true, core.ExecutionError_SYSTEM, t0},
		{"segfault", kferrors.WorkerExit{Signal: syscall.SIGSEGV, ObservedAt: t0}, "SignalSIGSEGV", true, core.ExecutionError_SYSTEM, t0},
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
	// A file written just after the recorded second ended: the failure
	// was at that second's very end, not at its start.
	te, _ = kferrors.ParseTorchError(data, whole.Add(time.Second+300*time.Microsecond))
	if !te.Time.Equal(whole.Add(time.Second - time.Nanosecond)) {
		t.Fatalf("mtime just after the second: %v, want the second's last nanosecond", te.Time)
	}
	// An mtime further off (file copied later) is not trusted.
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
	f.Add(containerError("E\xff", "caf\xe9", "w\xfe", timestamp(0, 0)))
	f.Add(containerError("E", "m", "w", timestamp(253402300800, 0)))
	f.Add(containerError("E", "m", "w", timestamp(t0.Unix(), -1)))
	f.Fuzz(func(t *testing.T, data []byte) {
		fl, err := kferrors.DecodeFailure(data, 4096)
		if err != nil {
			return
		}
		// Never 1970, never out of range: a time is usable or absent.
		if !fl.Time.IsZero() && !kferrors.UsableTime(fl.Time) {
			t.Fatalf("decoded unusable time %v", fl.Time)
		}
		// Repaired, not refused: every string is UTF-8.
		if !utf8.ValidString(fl.Code) || !utf8.ValidString(fl.Message) || !utf8.ValidString(fl.Worker) {
			t.Fatalf("decoded invalid UTF-8: %+v", fl)
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

// An unknown query parameter of a file:// URL is named alone, before any
// I/O, not in fileblob's error listing parameters the user never wrote;
// the ones fileblob knows still pass.
func TestFileURLUnknownParameter(t *testing.T) {
	dir := t.TempDir()
	err := kferrors.CheckURL("file://" + dir + "?bogus=1")
	if err == nil || !strings.Contains(err.Error(), `unknown query parameter "bogus"`) ||
		strings.Contains(err.Error(), "no_tmp_dir=true") || strings.Contains(err.Error(), "metadata=skip") {
		t.Errorf("CheckURL: %v; want the unknown parameter named, and no parameter the user did not write", err)
	}
	if b, err := kferrors.OpenPrefix(t.Context(), "file://"+dir+"?bogus=1", false); err == nil || strings.Contains(err.Error(), "no_tmp_dir=true") {
		if b != nil {
			b.Close()
		}
		t.Errorf("OpenPrefix: %v", err)
	}
	b, err := kferrors.OpenPrefix(t.Context(), "file://"+dir+"?create_dir=true", true)
	if err != nil {
		t.Fatalf("a parameter fileblob knows: %v", err)
	}
	b.Close()
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

// containerError encodes a ContainerError by hand, field by field, so that a
// test can store what our encoder never writes: invalid UTF-8, timestamps
// present but empty, out of range or invalid.
func containerError(code, message, worker string, timestamp []byte) []byte {
	var ce []byte
	for _, f := range []struct {
		num protowire.Number
		v   string
	}{{1, code}, {2, message}, {6, worker}} {
		ce = protowire.AppendTag(ce, f.num, protowire.BytesType)
		ce = protowire.AppendString(ce, f.v)
	}
	ce = protowire.AppendTag(ce, 3, protowire.VarintType)
	ce = protowire.AppendVarint(ce, uint64(core.ContainerError_RECOVERABLE))
	if timestamp != nil {
		ce = protowire.AppendTag(ce, 5, protowire.BytesType)
		ce = protowire.AppendBytes(ce, timestamp)
	}
	doc := protowire.AppendTag(nil, 1, protowire.BytesType)
	return protowire.AppendBytes(doc, ce)
}

// timestamp encodes a google.protobuf.Timestamp by hand (seconds, nanos),
// out-of-range values included.
func timestamp(seconds int64, nanos int32) []byte {
	var ts []byte
	if seconds != 0 {
		ts = protowire.AppendTag(ts, 1, protowire.VarintType)
		ts = protowire.AppendVarint(ts, uint64(seconds))
	}
	if nanos != 0 {
		ts = protowire.AppendTag(ts, 2, protowire.VarintType)
		ts = protowire.AppendVarint(ts, uint64(int64(nanos)))
	}
	if ts == nil {
		ts = []byte{}
	}
	return ts
}

// Every way a document's time can be missing or unusable decodes as "no
// time" with the rest of the document intact: never as 1970, never as a
// corrupt document.
func TestTimestampMissingOrInvalidIsNoTime(t *testing.T) {
	for name, ts := range map[string][]byte{
		"absent":                   nil,
		"present but empty":        timestamp(0, 0),
		"one nanosecond past 1970": timestamp(0, 1),
		"1970 plus uptime":         timestamp(86400*3, 0),
		"negative":                 timestamp(-5, 0),
		"nanos out of range":       timestamp(t0.Unix(), 2_000_000_000),
		"negative nanos":           timestamp(t0.Unix(), -1),
		"milliseconds as seconds":  timestamp(t0.UnixMilli(), 0),
		"after year 9999":          timestamp(253402300800, 0),
		"beyond int64 nanoseconds": timestamp(kferrors.LatestUsableTime.Unix()+1, 0),
	} {
		f, err := kferrors.DecodeFailure(containerError("RuntimeError", "boom", "pod-1/0", ts), 0)
		if err != nil {
			t.Errorf("%s: %v, want the document with no time", name, err)
			continue
		}
		if !f.Time.IsZero() || f.Code != "RuntimeError" || f.Message != "boom" || f.Worker != "pod-1/0" || !f.Recoverable {
			t.Errorf("%s: decoded %+v", name, f)
		}
	}
	// The edges of the range are usable.
	for _, at := range []time.Time{kferrors.EarliestUsableTime, kferrors.LatestUsableTime, t0} {
		f, err := kferrors.DecodeFailure(containerError("E", "m", "w", timestamp(at.Unix(), int32(at.Nanosecond()))), 0)
		if err != nil || !f.Time.Equal(at) {
			t.Errorf("%v: decoded %v, %v", at, f.Time, err)
		}
	}
	// The writer never stores an unusable time, nor names a key by one.
	doc := kferrors.UserError("E", "m", "w", time.Unix(3, 0)).Document(0)
	if doc.GetError().GetTimestamp() != nil {
		t.Errorf("1970 written as %v", doc.GetError().GetTimestamp())
	}
	for _, at := range []time.Time{{}, time.Unix(3, 0), time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)} {
		k := kferrors.NewKey(at, "w", "r")
		if _, ok := kferrors.TimeFromKey(k); ok || !strings.HasPrefix(k, "error-0000000000000000000-") {
			t.Errorf("%v named %s", at, k)
		}
	}
	if _, ok := kferrors.TimeFromKey("error-0000000000000000001-w-r.pb"); ok {
		t.Error("a key 1 ns after 1970 read as a time")
	}
}

// A message (or code, or worker) that is not UTF-8 is repaired, and the
// document is used: its worker, time and code stand.
func TestNonUTF8DocumentIsRepaired(t *testing.T) {
	data := containerError("Runtime\xffError", "caf\xe9 au lait\n\xc3", "pod-\xfe1/0", timestamp(t0.Unix(), int32(t0.Nanosecond())))
	f, err := kferrors.DecodeFailure(data, 0)
	if err != nil {
		t.Fatalf("decode: %v", err)
	}
	if f.Message != "caf\uFFFD au lait\n\uFFFD" || f.Code != "Runtime\uFFFDError" || f.Worker != "pod-\uFFFD1/0" || !f.Time.Equal(t0) {
		t.Fatalf("decoded %+v", f)
	}
	// Malformed wire data stays corrupt.
	if _, err := kferrors.Decode(append(data[:len(data)-3:len(data)-3], 0xff), 0); !isErr(err, kferrors.ErrCorrupt) {
		t.Fatalf("truncated document: %v", err)
	}
}

func TestParseTorchErrorTimestamps(t *testing.T) {
	whole := time.Unix(1795264324, 0).UTC()
	mtime := whole.Add(420 * time.Millisecond)
	doc := func(ts string) []byte {
		return []byte(`{"message":{"message":"ValueError: x","extraInfo":{"py_callstack":"tb","timestamp":` + ts + `}}}`)
	}
	for ts, want := range map[string]time.Time{
		`"1795264324"`:    mtime,                             // torch's form, refined by mtime
		`1795264324`:      mtime,                             // a number
		`"1795264324.25"`: whole.Add(420 * time.Millisecond), // a fraction, refined
		`"1795264324000"`: mtime,                             // milliseconds: not a time, mtime stands in
		`"253402300800"`:  mtime,                             // after year 9999
		`"-1"`:            mtime,                             // negative
		`"0"`:             mtime,                             // 1970
		`"NaN"`:           mtime,                             // not a number
		`"1e400"`:         mtime,                             // overflow
		`null`:            mtime,                             // none
		`{"s":1}`:         mtime,                             // another type: no time, not a bad file
		`"9223372036"`:    time.Unix(9223372036, 0).UTC(),    // the last whole second an int64 of ns holds
		`"9223372037"`:    mtime,                             // one more
		`"946684800"`:     kferrors.EarliestUsableTime,       // 2000-01-01
		`"946684799"`:     mtime,                             // the second before
		`"1795264330"`:    time.Unix(1795264330, 0).UTC(),    // mtime outside the second: torch's stands
	} {
		te, err := kferrors.ParseTorchError(doc(ts), mtime)
		if err != nil || !te.Time.Equal(want) {
			t.Errorf("timestamp %s: got %v (%v), want %v", ts, te, err, want)
		}
	}
	// With an unusable mtime as well, nothing is known: the zero time.
	te, err := kferrors.ParseTorchError(doc(`"1795264324000"`), time.Unix(5, 0))
	if err != nil || !te.Time.IsZero() {
		t.Errorf("no usable time: %v %v", te, err)
	}
	te, err = kferrors.ParseTorchError([]byte(`{"message":"RuntimeError: x"}`), time.Unix(5, 0))
	if err != nil || !te.Time.IsZero() {
		t.Errorf("string form with a 1970 mtime: %v %v", te, err)
	}
}

// A time the error file claims outside the worker's life gives way to the
// observed exit time, as a missing one does; a plausible one stands.
func TestClassifyFallsBackToObservedTime(t *testing.T) {
	started, observed := t0, t0.Add(time.Minute)
	for claimed, want := range map[time.Time]time.Time{
		{}:                                   observed,
		started.Add(30 * time.Second):        started.Add(30 * time.Second),
		started.Add(-500 * time.Millisecond): started.Add(-500 * time.Millisecond), // torch's truncated second
		started.Add(-time.Hour):              observed,                             // before the worker started
		observed.Add(time.Hour):              observed,                             // after its exit was seen
		time.Date(58000, 1, 1, 0, 0, 0, 0, time.UTC): observed,
	} {
		f := kferrors.Classify(kferrors.WorkerExit{Worker: "p/0", ExitCode: 1, StartedAt: started, ObservedAt: observed,
			TorchError: &kferrors.TorchError{Message: "ValueError: x", Time: claimed}})
		if !f.Time.Equal(want) || f.Code != "ValueError" {
			t.Errorf("claimed %v: got %v %s, want %v", claimed, f.Time, f.Code, want)
		}
	}
	f := kferrors.Classify(kferrors.WorkerExit{Worker: "p/0", ExitCode: 1, ObservedAt: observed, ErrorFileProblem: "not JSON"})
	if f.Code != kferrors.CodeNonZeroExit || !strings.Contains(f.Message, "exited with code 1 (its error file was not usable: not JSON)") {
		t.Errorf("problem not told: %+v", f)
	}
}

// An error file is read with a cap, and only if it is a regular file: a
// 300 MB file, a FIFO nobody writes, a folder are refused at once.
func TestReadTorchErrorRefusesWhatItMustNotRead(t *testing.T) {
	dir := t.TempDir()
	huge := filepath.Join(dir, "huge.json")
	if err := os.WriteFile(huge, []byte(`{"message":"`), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(huge, 300<<20); err != nil { // sparse: no disk, no time
		t.Fatal(err)
	}
	fifo := filepath.Join(dir, "fifo.json")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	folder := filepath.Join(dir, "folder.json")
	os.Mkdir(folder, 0o755)
	for path, want := range map[string]string{huge: "too large", fifo: "not a regular file", folder: "not a regular file"} {
		done := make(chan error, 1)
		go func() { _, _, err := kferrors.ReadTorchError(path); done <- err }()
		select {
		case err := <-done:
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("%s: %v, want %q", filepath.Base(path), err, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: ReadTorchError blocked", filepath.Base(path))
		}
	}
	var big syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &big)
	if big.Maxrss > 200<<10 { // KiB
		t.Errorf("max RSS %d KiB after refusing a 300 MB error file", big.Maxrss)
	}
}

func FuzzParseTorchError(f *testing.F) {
	f.Add([]byte(`{"message":{"message":"ValueError: x","extraInfo":{"py_callstack":"tb","timestamp":"1795264324"}}}`), int64(1795264324_420000000), int64(0))
	f.Add([]byte(`{"message":{"message":"E: x","extraInfo":{"timestamp":"1795264324000"}}}`), int64(0), int64(-1))
	f.Add([]byte(`{"message":{"message":"E","extraInfo":{"timestamp":1e300}}}`), int64(5), int64(1))
	f.Add([]byte(`{"message":"RuntimeError: caf\xe9"}`), int64(1795264324_000000000), int64(2))
	f.Fuzz(func(t *testing.T, data []byte, mtimeNs, startOffset int64) {
		mtime := time.Unix(0, mtimeNs)
		te, err := kferrors.ParseTorchError(data, mtime)
		if err != nil {
			return
		}
		if !te.Time.IsZero() && !kferrors.UsableTime(te.Time) {
			t.Fatalf("unusable time %v from %q", te.Time, data)
		}
		observed := time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC)
		started := observed.Add(-time.Duration(startOffset%int64(24*time.Hour)) - time.Second)
		if startOffset < 0 {
			started = time.Time{}
		}
		fl := kferrors.Classify(kferrors.WorkerExit{Worker: "w", ExitCode: 1, TorchError: te, StartedAt: started, ObservedAt: observed})
		if !kferrors.UsableTime(fl.Time) || fl.Time.After(observed.Add(time.Second)) ||
			(!started.IsZero() && fl.Time.Before(started.Add(-time.Second))) {
			t.Fatalf("failure time %v outside the worker's life [%v, %v]", fl.Time, started, observed)
		}
		doc, err := kferrors.Encode(fl.Document(0))
		if err != nil {
			t.Fatalf("encode: %v", err)
		}
		back, err := kferrors.DecodeFailure(doc, 0)
		if err != nil || !back.Time.Equal(fl.Time) || !utf8.ValidString(back.Message) {
			t.Fatalf("round trip of %+v: %+v %v", fl, back, err)
		}
	})
}

// A link in the prefix is never followed by Supersede: a document of the
// pod outside the prefix is neither copied into superseded/ nor unlinked.
func TestSupersedeLeavesLinksAlone(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	b := testenv.FilePrefix(t, filepath.Join(root, "prefix"))
	data, _ := kferrors.Encode(kferrors.UserError("E", "outside", "job-worker-1/0", t0).Document(0))
	os.WriteFile(filepath.Join(root, "outside.pb"), data, 0o644)
	link := filepath.Join(root, "prefix", "error-3f2a9c0d1e6b4a5f8c7d9e0f1a2b3c4d.pb")
	os.Symlink(filepath.Join(root, "outside.pb"), link)
	os.Symlink("error-loop.pb", filepath.Join(root, "prefix", "error-loop.pb"))
	moved, err := kferrors.Supersede(ctx, b, "job-worker-1", t0.Add(time.Hour))
	if err != nil || len(moved) != 0 {
		t.Fatalf("moved %v, %v", moved, err)
	}
	if _, err := os.Lstat(link); err != nil {
		t.Errorf("link removed: %v", err)
	}
}

// A huge file named like a flytekit document is not read whole by
// Supersede (nor by anything that reads through ReadDocument).
func TestSupersedeDoesNotReadHugeFiles(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	b := testenv.FilePrefix(t, dir)
	huge := filepath.Join(dir, "error-3f2a9c0d1e6b4a5f8c7d9e0f1a2b3c4d.pb")
	os.WriteFile(huge, []byte{0x0a}, 0o644)
	os.Truncate(huge, 300<<20)
	if moved, err := kferrors.Supersede(ctx, b, "job-worker-1", t0.Add(time.Hour)); err != nil || len(moved) != 0 {
		t.Fatalf("moved %v, %v", moved, err)
	}
	if _, err := kferrors.ReadDocument(ctx, b, filepath.Base(huge), 0); !isErr(err, kferrors.ErrTooLarge) {
		t.Fatalf("ReadDocument: %v", err)
	}
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	if ru.Maxrss > 200<<10 {
		t.Errorf("max RSS %d MiB", ru.Maxrss>>10)
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

// Issue 27, item 4: whatever a failure carries, what the writer stores is
// under the reader's limit, with the head and tail of each text and the
// cut said.
func TestPrepareStaysUnderTheReadersLimit(t *testing.T) {
	f := kferrors.UserError(strings.Repeat("C", 2<<20), "head "+strings.Repeat("x", 3<<20)+" ValueError: tail", strings.Repeat("w", 2<<20), time.Now())
	_, data, err := kferrors.NewWriter(nil, &kferrors.WriterOptions{MessageCap: 8 << 20}).Prepare(f)
	if err != nil {
		t.Fatal(err)
	}
	got, err := kferrors.DecodeFailure(data, 0)
	if err != nil || len(data) > kferrors.DefaultMaxDocumentBytes {
		t.Fatalf("%d bytes: %v", len(data), err)
	}
	if !strings.HasPrefix(got.Message, "head ") || !strings.HasSuffix(got.Message, "ValueError: tail") || !strings.Contains(got.Message, "bytes elided") {
		t.Errorf("message not cut head and tail: %q…", got.Message[:40])
	}
}

// PartialFailure reads what it can of a document cut short (a reader reads
// only the head of one too large) or corrupt after some fields.
func TestPartialFailure(t *testing.T) {
	f := kferrors.UserError("USER:RuntimeError", "Trace:\n\n    Traceback (most recent call last):\n"+strings.Repeat("    frame\n", 1000), "job-worker-1", t0)
	data, err := kferrors.Encode(f.Document(1 << 20))
	if err != nil {
		t.Fatal(err)
	}
	head := data[:200]
	p, ok := kferrors.PartialFailure(head)
	if !ok || p.Code != f.Code || !strings.HasPrefix(f.Message, p.Message) || len(p.Message) < 150 || p.Worker != "" {
		t.Fatalf("head: %+v %v", p, ok)
	}
	if p, ok := kferrors.PartialFailure(data); !ok || p.Code != f.Code || p.Message != f.Message || p.Worker != f.Worker {
		t.Fatalf("whole: %+v %v", p, ok)
	}
	// A string cut inside a UTF-8 sequence is made valid.
	g := kferrors.UserError("E", "caf\u00e9", "w", t0)
	gd, _ := kferrors.Encode(g.Document(0))
	cut := gd[:strings.Index(string(gd), "caf")+4]
	if p, ok := kferrors.PartialFailure(cut); !ok || p.Message != "caf\uFFFD" {
		t.Fatalf("cut: %+v %v", p, ok)
	}
	for _, bad := range [][]byte{nil, []byte("junk"), {0x12, 0x01, 0x0a}, {0x0a, 0xff}} {
		if p, ok := kferrors.PartialFailure(bad); ok {
			t.Errorf("%q: %+v", bad, p)
		}
	}
}

// Issue 30: one helper shortens a message to one line, the line that names
// the failure; the agent's used to return a message's last line whatever it
// was, the report's a rule of "=".
func TestOneLineNamesTheFailure(t *testing.T) {
	childFailed := "==========\ntrain.py FAILED\n----------\nFailures:\n  <NO_OTHER_FAILURES>\n==========\n"
	for _, c := range []struct{ msg, want string }{
		{"", ""},
		{"ValueError: boom", "ValueError: boom"},
		{"  \n\nconnection refused\nretrying in 1 s\n", "connection refused"},
		{"Traceback (most recent call last):\n  File \"t.py\", line 1, in <module>\nValueError: loss is NaN\n", "ValueError: loss is NaN"},
		{"USER:RuntimeError: Traceback (most recent call last):\n  File \"x\"\nValueError: batch 17\n\n", "ValueError: batch 17"},
		{childFailed, "train.py FAILED"},
		{"=====\n-----", ""},
		{strings.Repeat("é", 400), strings.Repeat("é", 150) + "…"},
		{"bad \xff byte", "bad \uFFFD byte"},
	} {
		if got := kferrors.OneLine(c.msg); got != c.want {
			t.Errorf("OneLine(%q) = %q, want %q", c.msg, got, c.want)
		}
	}
	// Any message: one line, valid UTF-8, within the cap, and a line of the
	// message (or its cut).
	rng := rand.New(rand.NewPCG(30, 1))
	alphabet := []string{"a", "Z", "7", " ", "\n", "=", "-", "é", "\xff", "Traceback (most recent call last)", "\t"}
	for range 5000 {
		var b strings.Builder
		for range rng.IntN(400) {
			b.WriteString(alphabet[rng.IntN(len(alphabet))])
		}
		msg := b.String()
		got := kferrors.OneLine(msg)
		if strings.Contains(got, "\n") || !utf8.ValidString(got) || len(got) > 300+len("…") {
			t.Fatalf("OneLine(%q) = %q: not one valid line within 300 bytes", msg, got)
		}
		if !strings.Contains(kferrors.ValidUTF8(msg), strings.TrimSuffix(got, "…")) {
			t.Fatalf("OneLine(%q) = %q: not from the message", msg, got)
		}
	}
}

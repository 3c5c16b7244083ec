package events_test

import (
	"bytes"
	"context"
	goerrors "errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"gocloud.dev/blob"
	"gocloud.dev/blob/memblob"

	kferrors "github.com/kfelastic/kfelastic/errors"
	"github.com/kfelastic/kfelastic/events"
	"github.com/kfelastic/kfelastic/internal/test/testenv"
	"github.com/kfelastic/kfelastic/outputreader"
)

func TestMain(m *testing.M) { testenv.Main(m) }

var t0 = time.Date(2026, 11, 21, 10, 0, 0, 123456789, time.UTC)

func exit(n int) *int { return &n }

func TestEncodeDecodeRoundTrip(t *testing.T) {
	for _, ev := range []events.Event{
		{Time: t0, Pod: "job-worker-1", Kind: events.GroupStarted, Attempt: 1, Round: 3, WorldSize: 8},
		{Time: t0.In(time.FixedZone("CET", 3600)), Pod: "job-worker-1", Kind: events.WorkerExited, Attempt: 1, Worker: "job-worker-1/0", ExitCode: exit(0)},
		{Time: t0, Pod: "job-worker-1", Kind: events.WorkerExited, Attempt: 1, Worker: "job-worker-1/1", Signal: "SIGKILL", Code: "SignalSIGKILL", Stopped: true},
		{Time: t0, Pod: "job-worker-1", Kind: events.Restart, Attempt: 2, RestartCount: 1, Reason: "failure"},
		{Time: t0, Pod: "job-worker-1", Kind: events.PodFailed, Code: "ValueError", ExitCode: exit(1), Document: "error-1.pb", Message: "ValueError: x"},
		{Time: t0, Pod: "job-worker-1", Kind: events.Relaunch, Replacement: "job-worker-4", Reason: "OOMKilled"},
	} {
		data, err := events.Encode(ev)
		if err != nil {
			t.Fatal(err)
		}
		got, err := events.Decode(data)
		if err != nil {
			t.Fatalf("%s: %v", data, err)
		}
		ev.Version, ev.Time = 1, ev.Time.UTC()
		if !reflect.DeepEqual(got, ev) {
			t.Fatalf("round trip\n got %+v\nwant %+v", got, ev)
		}
		if !bytes.HasPrefix(data, []byte(`{"v":1,"time":"2026-11-21T10:00:00.123456789Z","pod":"job-worker-1","kind":"`)) {
			t.Fatalf("not the documented layout: %s", data)
		}
	}
	long, err := events.Encode(events.Event{Time: t0, Pod: "p", Kind: events.PodFailed, Message: strings.Repeat("x", 100<<10)})
	if err != nil || len(long) > events.MaxBytes {
		t.Fatalf("a long message is capped, not refused: %d bytes, %v", len(long), err)
	}
	for _, bad := range []events.Event{{Pod: "p", Kind: events.Restart}, {Time: t0, Kind: events.Restart}, {Time: t0, Pod: "p"}} {
		if _, err := events.Encode(bad); !goerrors.Is(err, events.ErrCorrupt) {
			t.Errorf("Encode(%+v) = %v, want ErrCorrupt", bad, err)
		}
	}
}

func TestDecodeRejects(t *testing.T) {
	const ok = `"time":"2026-11-21T10:00:00Z","pod":"p","kind":"restart"`
	cases := []struct {
		in   string
		want error
	}{
		{"", events.ErrEmpty},
		{`{"v":1,` + ok + `,"message":"` + strings.Repeat("x", events.MaxBytes) + `"}`, events.ErrTooLarge},
		{"not json", events.ErrCorrupt},
		{`[1,2]`, events.ErrCorrupt},
		{`{` + ok + `}`, events.ErrCorrupt},
		{`{"v":0,` + ok + `}`, events.ErrCorrupt},
		{`{"v":"1",` + ok + `}`, events.ErrCorrupt},
		{`{"v":1.5,` + ok + `}`, events.ErrCorrupt},
		{`{"v":2,"whatever":[]}`, events.ErrNewerVersion},
		{`{"v":1,"pod":"p","kind":"restart"}`, events.ErrCorrupt},
		{`{"v":1,"time":"2026-11-21T10:00:00Z","kind":"restart"}`, events.ErrCorrupt},
		{`{"v":1,"time":"2026-11-21T10:00:00Z","pod":"p"}`, events.ErrCorrupt},
		{`{"v":1,"time":"yesterday","pod":"p","kind":"restart"}`, events.ErrCorrupt},
		{`{"v":1,` + ok + `,"attempt":"two"}`, events.ErrCorrupt},
		{`{"v":1,` + ok + `} trailing`, events.ErrCorrupt},
	}
	for _, c := range cases {
		if _, err := events.Decode([]byte(c.in)); !goerrors.Is(err, c.want) {
			t.Errorf("Decode(%.60q) = %v, want %v", c.in, err, c.want)
		}
	}
	// Additions within version 1: unknown fields are ignored, unknown kinds kept.
	ev, err := events.Decode([]byte(`{"v":1,"time":"2026-11-21T11:00:00+01:00","pod":"p","kind":"checkpoint-saved","step":1200}`))
	if err != nil || ev.Kind != "checkpoint-saved" || ev.Kind.Known() || ev.Time != time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC) {
		t.Fatalf("forward-compatible event: %+v, %v", ev, err)
	}
}

// FuzzDecode: whatever the bytes, Decode either refuses them with one of
// its errors or returns a valid event that encodes and decodes to itself.
func FuzzDecode(f *testing.F) {
	f.Add([]byte(`{"v":1,"time":"2026-11-21T10:00:00.123456789Z","pod":"job-worker-1","kind":"restart","attempt":2,"restartCount":1,"reason":"failure"}`))
	f.Add([]byte(`{"v":1,"time":"2026-11-21T10:00:00Z","pod":"p\u202e<script>","kind":"x","exitCode":-1,"message":"\u001b[31mred"}`))
	f.Add([]byte(`{"v":2}`))
	f.Add([]byte(`{"v":1,"v":1,"time":"0001-01-01T00:00:00Z","pod":"","kind":""}`))
	f.Add([]byte("\xff\xfe"))
	f.Fuzz(func(t *testing.T, data []byte) {
		ev, err := events.Decode(data)
		if err != nil {
			if !goerrors.Is(err, events.ErrEmpty) && !goerrors.Is(err, events.ErrTooLarge) && !goerrors.Is(err, events.ErrCorrupt) && !goerrors.Is(err, events.ErrNewerVersion) {
				t.Fatalf("unclassified error %v", err)
			}
			return
		}
		if ev.Version != events.Version || ev.Time.IsZero() || ev.Pod == "" || ev.Kind == "" || ev.Time.Location() != time.UTC {
			t.Fatalf("invalid event accepted: %+v", ev)
		}
		if len(ev.Message) > events.MaxMessageBytes {
			return // a foreign writer's long message: Encode would cap it
		}
		again, err := events.Encode(ev)
		if err != nil {
			if ev.Time.Year() > 9999 || ev.Time.Year() < 0 {
				return // JSON cannot say such years
			}
			t.Fatalf("decoded event does not encode: %v: %+v", err, ev)
		}
		back, err := events.Decode(again)
		if err != nil || !reflect.DeepEqual(back, ev) {
			t.Fatalf("re-decode: %v\n got %+v\nwant %+v", err, back, ev)
		}
	})
}

func buckets() map[string]func(t *testing.T) *blob.Bucket {
	return map[string]func(t *testing.T) *blob.Bucket{
		"mem": func(t *testing.T) *blob.Bucket { return memblob.OpenBucket(nil) },
		"file": func(t *testing.T) *blob.Bucket {
			b, err := kferrors.OpenPrefix(context.Background(), "file://"+filepath.Join(t.TempDir(), "attempt-0"), true)
			if err != nil {
				t.Fatal(err)
			}
			return b
		},
		"minio": func(t *testing.T) *blob.Bucket {
			s := testenv.MinIO(t)
			b, err := kferrors.OpenPrefix(context.Background(), s.MinIOProcess.URL(s.Bucket, "metadata/n0/attempt-0"), false)
			if err != nil {
				t.Fatal(err)
			}
			return b
		},
	}
}

// Events live next to the error documents, and no error reader takes them
// for one: ours (outputreader), Supersede, and upstream's listing of
// "<prefix>/error…" all pass them by. Bad objects are skipped, not lost.
func TestAppendReadNextToDocuments(t *testing.T) {
	for name, open := range buckets() {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			b := open(t)
			defer b.Close()
			w := events.NewWriter(b)
			// Written out of order: Read orders by time.
			for _, ev := range []events.Event{
				{Time: t0.Add(2 * time.Second), Pod: "job-worker-1", Kind: events.Restart, Attempt: 2, RestartCount: 1, Reason: "failure"},
				{Time: t0, Pod: "job-worker-1", Kind: events.GroupStarted, Attempt: 1},
				{Time: t0, Pod: "job-worker-0", Kind: events.GroupStarted, Attempt: 1},
				{Time: t0.Add(time.Second), Pod: "job-worker-1", Kind: events.WorkerExited, Attempt: 1, Worker: "job-worker-1/0", ExitCode: exit(1), Code: "ValueError"},
			} {
				key, err := w.Append(ctx, ev)
				if err != nil {
					t.Fatal(err)
				}
				if !strings.HasPrefix(key, events.Prefix) || strings.HasPrefix(key, kferrors.KeyPrefix) || strings.HasSuffix(key, kferrors.KeySuffix) {
					t.Fatalf("key %s could be taken for an error document", key)
				}
			}
			// The same event twice is two events: append-only, nothing replaced.
			twice := events.Event{Time: t0.Add(3 * time.Second), Pod: "job-worker-1", Kind: events.PodFailed, Code: "ValueError"}
			k1, _ := w.Append(ctx, twice)
			k2, _ := w.Append(ctx, twice)
			if k1 == k2 {
				t.Fatal("two appends, one key")
			}
			dw := kferrors.NewWriter(b, nil)
			if _, err := dw.Write(ctx, kferrors.UserError("ValueError", "x", "job-worker-1/0", t0.Add(time.Second))); err != nil {
				t.Fatal(err)
			}
			for key, data := range map[string]string{
				events.Prefix + "0000-bad.json":   "{",
				events.Prefix + "0001-empty.json": "",
				events.Prefix + "0002-newer.json": `{"v":7}`,
				events.Prefix + "notes.txt":       "hello",
			} {
				if err := b.WriteAll(ctx, key, []byte(data), nil); err != nil {
					t.Fatal(err)
				}
			}

			log, err := events.Read(ctx, b, nil)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, ev := range log.Events {
				got = append(got, fmt.Sprintf("%s %s", ev.Pod, ev.Kind))
				if ev.Key == "" {
					t.Fatal("event without its key")
				}
			}
			want := "job-worker-0 group-started|job-worker-1 group-started|job-worker-1 worker-exited|job-worker-1 restart|job-worker-1 pod-failed|job-worker-1 pod-failed"
			if strings.Join(got, "|") != want {
				t.Fatalf("events\n got %s\nwant %s", strings.Join(got, "|"), want)
			}
			wantSkipped := map[string]error{
				events.Prefix + "0000-bad.json": events.ErrCorrupt, events.Prefix + "0001-empty.json": events.ErrEmpty,
				events.Prefix + "0002-newer.json": events.ErrNewerVersion, events.Prefix + "notes.txt": events.ErrCorrupt,
			}
			if len(log.Skipped) != len(wantSkipped) {
				t.Fatalf("skipped %v", log.Skipped)
			}
			for _, s := range log.Skipped {
				if !goerrors.Is(s.Err, wantSkipped[s.Key]) {
					t.Errorf("%s skipped for %v", s.Key, s.Err)
				}
			}

			r, err := outputreader.Read(ctx, outputreader.NewBucketSource(b), &outputreader.Options{OpenAll: true})
			if err != nil || r.RootCause == nil || len(r.Others) != 0 || len(r.Skipped) != 0 {
				t.Fatalf("the error reader saw events: %+v %v", r, err)
			}
			if moved, err := kferrors.Supersede(ctx, b, "job-worker-1", t0.Add(time.Hour)); err != nil || len(moved) != 1 || !strings.HasPrefix(moved[0], kferrors.KeyPrefix) {
				t.Fatalf("Supersede moved %v, %v", moved, err)
			}
			// Upstream lists "<dir>/error" and keeps keys ending ".pb".
			it := b.List(&blob.ListOptions{Prefix: kferrors.KeyPrefix})
			for {
				obj, err := it.Next(ctx)
				if err == io.EOF {
					break
				}
				if err != nil {
					t.Fatal(err) // not a listing that ended early and found nothing
				}
				if strings.HasPrefix(obj.Key, events.Prefix) {
					t.Fatalf("upstream's listing finds %s", obj.Key)
				}
			}
		})
	}
}

// What a careless or hostile user leaves under events/ on a file:// prefix
// is skipped and reported, as the error readers skip it: links (to an event
// outside the prefix, a loop, dangling) are never followed, a FIFO is never
// opened (the read would block), and an event dated 1970 is no event.
func TestReadSkipsLinksSpecialFilesAnd1970(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	dir := filepath.Join(root, "attempt-0")
	b, err := kferrors.OpenPrefix(ctx, "file://"+dir, true)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if _, err := events.NewWriter(b).Append(ctx, events.Event{Time: t0, Pod: "job-worker-1", Kind: events.GroupStarted}); err != nil {
		t.Fatal(err)
	}
	outside := filepath.Join(root, "outside.json")
	os.WriteFile(outside, []byte(`{"v":1,"time":"2026-11-21T09:00:00Z","pod":"intruder","kind":"pod-failed"}`), 0o644)
	evDir := filepath.Join(dir, strings.TrimSuffix(events.Prefix, "/"))
	for name, target := range map[string]string{"link.json": outside, "loop.json": "loop.json", "dangling.json": "/nonexistent.json"} {
		if err := os.Symlink(target, filepath.Join(evDir, name)); err != nil {
			t.Fatal(err)
		}
	}
	if err := syscall.Mkfifo(filepath.Join(evDir, "fifo.json"), 0o644); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(evDir, "epoch.json"), []byte(`{"v":1,"time":"1970-01-01T00:00:00.5Z","pod":"p","kind":"restart"}`), 0o644)
	if _, err := events.Encode(events.Event{Time: time.Unix(1, 0), Pod: "p", Kind: events.Restart}); !goerrors.Is(err, events.ErrCorrupt) {
		t.Errorf("Encode of a 1970 event: %v, want ErrCorrupt", err)
	}

	done := make(chan struct{})
	var log *events.Log
	go func() {
		defer close(done)
		log, err = events.Read(ctx, b, nil)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Read blocked")
	}
	if err != nil {
		t.Fatal(err)
	}
	if len(log.Events) != 1 || log.Events[0].Pod != "job-worker-1" {
		t.Fatalf("events %+v", log.Events)
	}
	want := map[string]error{"link.json": events.ErrUnreadable, "loop.json": events.ErrUnreadable, "dangling.json": events.ErrUnreadable,
		"fifo.json": events.ErrUnreadable, "epoch.json": events.ErrCorrupt}
	for _, s := range log.Skipped {
		name := strings.TrimPrefix(s.Key, events.Prefix)
		if w, ok := want[name]; !ok || !goerrors.Is(s.Err, w) {
			t.Errorf("skipped %s: %v", s.Key, s.Err)
		}
		delete(want, name)
	}
	if len(want) != 0 {
		t.Errorf("not skipped: %v", want)
	}
}

// A store that accepts connections and never answers fails Read within
// CallTimeout; it does not hang it.
func TestReadSilentStoreWithinCallTimeout(t *testing.T) {
	silent := testenv.Silent(t)
	testenv.SetCredentialEnv()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second) // the test's own bound
	defer cancel()
	b, err := kferrors.OpenPrefix(ctx, silent.URL("flyte", "metadata/attempt-0"), false)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	start := time.Now()
	_, err = events.Read(ctx, b, &events.ReadOptions{CallTimeout: 300 * time.Millisecond})
	if took := time.Since(start); err == nil || took > 5*time.Second {
		t.Fatalf("Read: %v after %v, want a failure within about 300ms", err, took)
	}
}

// A reader lists a file:// prefix while a writer appends: each write's
// temporary file, renamed into place while fileblob walks the folder, used
// to fail the whole listing ("list events: … .tmp: no such file"); the
// page is listed again instead.
func TestReadWhileAppending(t *testing.T) {
	ctx := context.Background()
	b, err := kferrors.OpenPrefix(ctx, "file://"+t.TempDir(), true)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	const n = 300
	w := events.NewWriter(b)
	done := make(chan error, 1)
	go func() {
		for i := range n {
			if _, err := w.Append(ctx, events.Event{Time: t0.Add(time.Duration(i) * time.Millisecond), Pod: "job-worker-1", Kind: events.GroupStarted}); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	for writing := true; writing; {
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
			writing = false
		default:
		}
		if _, err := events.Read(ctx, b, nil); err != nil {
			t.Fatalf("read while appending: %v", err)
		}
	}
	log, err := events.Read(ctx, b, nil)
	if err != nil || len(log.Events) != n {
		t.Fatalf("%d events (%v), want %d", len(log.Events), err, n)
	}
}

package outputreader_test

import (
	"bytes"
	"context"
	goerrors "errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/flyteorg/flyte/flyteidl/gen/pb-go/flyteidl/core"
	"github.com/flyteorg/flyte/flytestdlib/contextutils"
	"github.com/flyteorg/flyte/flytestdlib/promutils"
	"github.com/flyteorg/flyte/flytestdlib/promutils/labeled"
	"github.com/flyteorg/flyte/flytestdlib/storage"
	"gocloud.dev/blob"
	"gocloud.dev/blob/memblob"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	kferrors "github.com/kfelastic/kfelastic/errors"
	"github.com/kfelastic/kfelastic/internal/test/kubeenv"
	"github.com/kfelastic/kfelastic/internal/test/testenv"
	"github.com/kfelastic/kfelastic/outputreader"
	"github.com/kfelastic/kfelastic/outputreader/flyteio"
)

func TestMain(m *testing.M) {
	// flytestdlib's DataStore metrics need the label keys set once per
	// process, as propeller does at start.
	labeled.SetMetricKeys(contextutils.AppNameKey)
	testenv.Main(m)
}

// t0 lies in the past of every test run, so upload times are after it.
var t0 = time.Date(2026, 1, 2, 10, 0, 0, 123456789, time.UTC)

// store is one backend under test: put writes raw bytes under a key relative
// to the output prefix; src reads that prefix.
type store struct {
	put func(t testing.TB, key string, data []byte)
	src outputreader.Source
}

type backend struct {
	name string
	open func(t testing.TB) store
}

func bucketStore(b *blob.Bucket) store {
	return store{
		put: func(t testing.TB, key string, data []byte) {
			t.Helper()
			if err := b.WriteAll(context.Background(), key, data, nil); err != nil {
				t.Fatalf("put %s: %v", key, err)
			}
		},
		src: outputreader.NewBucketSource(b),
	}
}

// backends are the five the reader must behave the same on: gocloud.dev's
// mem:// and file://, a real MinIO server through s3blob, and flytestdlib's
// in-memory DataStore, and that DataStore on MinIO through stow (what
// propeller hands a plugin in a cluster).
func backends() []backend {
	return []backend{
		{"mem", func(t testing.TB) store {
			b := memblob.OpenBucket(nil)
			t.Cleanup(func() { b.Close() })
			return bucketStore(b)
		}},
		{"file", func(t testing.TB) store {
			url := "file://" + filepath.Join(t.TempDir(), "metadata", "attempt-0")
			b, err := kferrors.OpenPrefix(context.Background(), url, true)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { b.Close() })
			return bucketStore(b)
		}},
		{"minio", func(t testing.TB) store {
			s := testenv.MinIO(t)
			b, err := kferrors.OpenPrefix(context.Background(), s.MinIOProcess.URL(s.Bucket, "metadata/n0/attempt-0"), false)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { b.Close() })
			return bucketStore(b)
		}},
		{"datastore-mem", func(t testing.TB) store {
			ds, err := storage.NewDataStore(&storage.Config{Type: storage.TypeMemory}, promutils.NewTestScope())
			if err != nil {
				t.Fatal(err)
			}
			// flytestdlib's InMemoryStore.List iterates its map without taking
			// its own lock (an upstream race, seen by -race when a document
			// lands during WaitFor), so this test backend orders writes and
			// listings with a lock of its own.
			s := dataStoreStore(ds, "s3://flyte/metadata/n0/attempt-0")
			var mu sync.RWMutex
			put := s.put
			s.put = func(t testing.TB, key string, data []byte) {
				mu.Lock()
				defer mu.Unlock()
				put(t, key, data)
			}
			s.src = lockedSource{Source: s.src, mu: &mu}
			return s
		}},
		// What a plugin runs on in a cluster: flytestdlib's stow S3 client.
		{"datastore-minio", func(t testing.TB) store {
			s := testenv.MinIO(t)
			ds, err := storage.NewDataStore(kubeenv.DataStoreConfig(s.MinIOProcess, s.Bucket), promutils.NewTestScope())
			if err != nil {
				t.Fatal(err)
			}
			return dataStoreStore(ds, storage.DataReference("s3://"+s.Bucket+"/metadata/n0/attempt-0"))
		}},
	}
}

type lockedSource struct {
	outputreader.Source
	mu *sync.RWMutex
}

func (l lockedSource) List(ctx context.Context, yield func(outputreader.Object) error) error {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.Source.List(ctx, yield)
}

func dataStoreStore(ds *storage.DataStore, prefix storage.DataReference) store {
	return store{
		put: func(t testing.TB, key string, data []byte) {
			t.Helper()
			if err := ds.WriteRaw(context.Background(), prefix+"/"+storage.DataReference(key), int64(len(data)), storage.Options{}, bytes.NewReader(data)); err != nil {
				t.Fatalf("put %s: %v", key, err)
			}
		},
		src: flyteio.NewDataStoreSource(ds, prefix),
	}
}

func encode(t testing.TB, f kferrors.Failure) []byte {
	t.Helper()
	data, err := kferrors.Encode(f.Document(0))
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// ours stores f as our writers name it.
func ours(t testing.TB, s store, f kferrors.Failure) string {
	key := kferrors.NewKey(f.Time, f.Worker, kferrors.RandomSuffix())
	s.put(t, key, encode(t, f))
	return key
}

// flytekit stores f as flytekit ≥1.14 does with _F_DES set: error-<uuid hex>.pb.
func flytekit(t testing.TB, s store, f kferrors.Failure, uuidHex string) string {
	key := "error-" + uuidHex + ".pb"
	s.put(t, key, encode(t, f))
	return key
}

// read is Read, checked against Summarize (the plugin's read) on the same
// documents: every conformance case holds for both.
func read(t testing.TB, s store, extra ...kferrors.Failure) *outputreader.Report {
	t.Helper()
	r, err := outputreader.Read(context.Background(), s.src, nil, extra...)
	if err != nil {
		t.Fatalf("Read: %v", err)
	}
	sum, err := outputreader.Summarize(context.Background(), s.src, nil, extra...)
	if err != nil {
		t.Fatalf("Summarize: %v", err)
	}
	sameSummary(t, r, sum)
	return r
}

// sameSummary checks that a Summary says what the Report says.
func sameSummary(t testing.TB, r *outputreader.Report, s *outputreader.Summary) {
	t.Helper()
	switch {
	case (r.RootCause == nil) != (s.RootCause == nil):
		t.Fatalf("Read root %+v, Summarize root %+v", r.RootCause, s.RootCause)
	case r.RootCause != nil && (r.RootCause.Key != s.RootCause.Key || r.RootCause.Failure != s.RootCause.Failure ||
		!r.RootCause.At.Equal(s.RootCause.At) && r.RootCause.AtSource != outputreader.TimeFromListing):
		t.Fatalf("Read root %+v, Summarize root %+v", r.RootCause, s.RootCause)
	case (r.Displaced == nil) != (s.Displaced == nil) || r.Displaced != nil && r.Displaced.Key != s.Displaced.Key:
		t.Fatalf("Read displaced %+v, Summarize displaced %+v", r.Displaced, s.Displaced)
	case r.Opened != s.Opened || len(r.Skipped) != s.Skipped || r.Workers() != s.Workers():
		t.Fatalf("Read opened %d skipped %d workers %d; Summarize %d %d %d", r.Opened, len(r.Skipped), r.Workers(), s.Opened, s.Skipped, s.Workers())
	case r.RootCause != nil && r.RootCause.AtSource != outputreader.TimeFromListing && r.Message() != s.Message():
		t.Fatalf("messages differ:\nRead:      %s\nSummarize: %s", r.Message(), s.Message())
	}
	for i, sk := range s.SkippedSample {
		if sk.Key != r.Skipped[i].Key {
			t.Fatalf("skipped sample %d: %s, Read %s", i, sk.Key, r.Skipped[i].Key)
		}
	}
}

func TestConformance(t *testing.T) {
	for _, be := range backends() {
		t.Run(be.name, func(t *testing.T) {
			t.Run("no documents is a distinct result", func(t *testing.T) {
				s := be.open(t)
				s.put(t, "outputs.pb", []byte("not an error document"))
				s.put(t, "errors/error-nested.pb", []byte("nested: not ours"))
				r := read(t, s)
				if r.RootCause != nil || len(r.Others) != 0 || len(r.Skipped) != 0 || r.Message() != "" || flyteio.ExecutionError(r.Summary()) != nil {
					t.Fatalf("want the empty report, got %+v", r)
				}
				if ok, err := outputreader.HasDocuments(context.Background(), s.src); ok || err != nil {
					t.Fatalf("HasDocuments = %v, %v", ok, err)
				}
			})

			t.Run("sub-second secondary failure does not win", func(t *testing.T) {
				s := be.open(t)
				// The peer's "connection closed" is written first but happened later.
				ours(t, s, kferrors.UserError("torch.distributed.DistNetworkError", "Connection closed by peer", "job-worker-0", t0.Add(300*time.Millisecond)))
				ours(t, s, kferrors.UserError("RuntimeError", "CUDA error: device-side assert", "job-worker-1", t0))
				ours(t, s, kferrors.SystemFailure(kferrors.CodePreempted, "terminated", "job-worker-2", t0.Add(900*time.Millisecond)))
				r := read(t, s)
				if r.RootCause == nil || r.RootCause.Failure.Code != "RuntimeError" || r.RootCause.Failure.Worker != "job-worker-1" || !r.RootCause.At.Equal(t0) {
					t.Fatalf("root cause: %+v", r.RootCause)
				}
				if r.RootCause.Failure.Message != "CUDA error: device-side assert" {
					t.Fatalf("root message: %q", r.RootCause.Failure.Message)
				}
				if len(r.Others) != 2 || r.Others[0].Failure.Worker != "job-worker-0" || r.Others[0].Failure.Message != "" {
					t.Fatalf("others: %+v", r.Others)
				}
				if r.Workers() != 3 {
					t.Fatalf("workers %d", r.Workers())
				}
				ee := flyteio.ExecutionError(r.Summary())
				if ee == nil || ee.IsRecoverable || ee.Code != "RuntimeError" || ee.Kind != core.ExecutionError_USER || ee.Worker != "job-worker-1" || !ee.Timestamp.AsTime().Equal(t0) {
					t.Fatalf("execution error: %+v", ee)
				}
			})

			t.Run("ties go to worker then key", func(t *testing.T) {
				s := be.open(t)
				ours(t, s, kferrors.UserError("B", "b", "w-b", t0))
				ours(t, s, kferrors.UserError("A", "a", "w-a", t0))
				k1 := flytekit(t, s, kferrors.UserError("C1", "c", "w-a", t0), "0000000000000000000000000000000f")
				k2 := flytekit(t, s, kferrors.UserError("C2", "c", "w-a", t0), "00000000000000000000000000000001")
				r := read(t, s)
				// Same time, same worker "w-a": the smallest key wins; ours
				// starts "error-1…", flytekit's "error-0…".
				if r.RootCause.Key != k2 || r.Others[0].Key != k1 {
					t.Fatalf("root %s, first other %s", r.RootCause.Key, r.Others[0].Key)
				}
			})

			t.Run("flytekit and legacy documents are read and ranked", func(t *testing.T) {
				s := be.open(t)
				for i := range 40 {
					ours(t, s, kferrors.UserError("DistNetworkError", "peer gone", fmt.Sprintf("job-worker-%d", i+2), t0.Add(time.Duration(i+1)*time.Second)))
				}
				flytekit(t, s, kferrors.UserError("ValueError", "bad shape", "job-worker-1", t0.Add(500*time.Millisecond)), "3f2a9c0d1e6b4a5f8c7d9e0f1a2b3c4d")
				// Legacy error.pb: no timestamp, no worker. Its upload time is
				// now, long after t0: it must not win as 1970 would.
				s.put(t, kferrors.LegacyKey, encode(t, kferrors.UserError("OldError", "legacy", "", time.Time{})))
				r := read(t, s)
				if r.RootCause.Failure.Code != "ValueError" || r.RootCause.Failure.Worker != "job-worker-1" {
					t.Fatalf("root cause: %+v", r.RootCause)
				}
				last := r.Others[len(r.Others)-1]
				if last.Key != kferrors.LegacyKey || last.At.Year() < 2026 || last.AtSource == outputreader.TimeFromDocument {
					t.Fatalf("legacy document ranked %+v", last)
				}
				if len(r.Others) != 41 || r.Workers() != 42 {
					t.Fatalf("others %d workers %d", len(r.Others), r.Workers())
				}
			})

			t.Run("a document without timestamp ranks by its object time", func(t *testing.T) {
				s := be.open(t)
				// The future document is written after the untimed one: its
				// time is bounded by its write time (issue 27), which is later.
				s.put(t, "error-0123456789abcdef0123456789abcdef.pb", encode(t, kferrors.UserError("Untimed", "x", "w-untimed", time.Time{})))
				time.Sleep(20 * time.Millisecond)
				ours(t, s, kferrors.UserError("Future", "clock ahead", "w-future", time.Now().Add(time.Hour)))
				r := read(t, s)
				if r.RootCause.Failure.Code != "Untimed" || r.RootCause.AtSource == outputreader.TimeFromDocument {
					t.Fatalf("root cause %+v", r.RootCause)
				}
				if d := time.Since(r.RootCause.At); d < -time.Minute || d > 5*time.Minute {
					t.Fatalf("object time %v is not the upload or read time", r.RootCause.At)
				}
				if !strings.Contains(r.Message(), "(upload time)") && !strings.Contains(r.Message(), "(read time)") {
					t.Fatalf("message does not say where the time comes from: %s", r.Message())
				}
			})

			t.Run("a timestamp present but empty zero or out of range never ranks as 1970", func(t *testing.T) {
				s := be.open(t)
				root := ours(t, s, kferrors.UserError("RuntimeError", "first", "job-worker-1", t0))
				for i, ts := range []*timestamppb.Timestamp{
					{},                              // present but empty: 1970 to a careless reader
					{Seconds: 0, Nanos: 1},          // 1970 and a nanosecond
					{Seconds: -62135596800},         // year 1
					{Seconds: 253402300800},         // after 9999
					{Seconds: t0.Unix(), Nanos: -1}, // invalid
					{Seconds: t0.UnixMilli()},       // milliseconds as seconds
				} {
					data, err := proto.Marshal(&core.ErrorDocument{Error: &core.ContainerError{
						Code: fmt.Sprintf("Bad%d", i), Message: "m", Worker: fmt.Sprintf("job-worker-%d", i+2), Timestamp: ts}})
					if err != nil {
						t.Fatal(err)
					}
					s.put(t, fmt.Sprintf("error-%032x.pb", i), data)
				}
				r := read(t, s)
				if r.RootCause == nil || r.RootCause.Key != root || len(r.Others) != 6 || len(r.Skipped) != 0 {
					t.Fatalf("root %+v, others %d, skipped %v", r.RootCause, len(r.Others), r.Skipped)
				}
				for _, d := range r.Others {
					if d.AtSource == outputreader.TimeFromDocument || d.At.Before(t0) || d.Failure.Code == "" {
						t.Errorf("%s ranked at %v (%s)", d.Key, d.At, d.AtSource)
					}
				}
			})

			t.Run("a message that is not UTF-8 is repaired not skipped", func(t *testing.T) {
				s := be.open(t)
				ours(t, s, kferrors.UserError("DistNetworkError", "peer gone", "job-worker-0", t0.Add(time.Second)))
				// proto3 refuses to encode invalid UTF-8: encode "caf#" and put
				// a Latin-1 "é" in the place of "#", as an old writer would.
				data := encode(t, kferrors.UserError("UnicodeError", "caf# au lait", "job-worker-1", t0))
				data[bytes.IndexByte(data, '#')] = 0xe9
				s.put(t, "error-00000000000000000000000000000001.pb", data)
				r := read(t, s)
				if r.RootCause == nil || r.RootCause.Failure.Code != "UnicodeError" || r.RootCause.Failure.Worker != "job-worker-1" ||
					!r.RootCause.At.Equal(t0) || r.RootCause.Failure.Message != "caf\uFFFD au lait" || len(r.Skipped) != 0 {
					t.Fatalf("root %+v, skipped %v", r.RootCause, r.Skipped)
				}
			})

			t.Run("corrupt empty oversized documents are skipped and count as failures", func(t *testing.T) {
				s := be.open(t)
				ours(t, s, kferrors.UserError("RuntimeError", "boom", "job-worker-3", t0.Add(time.Second)))
				s.put(t, "error-corrupt.pb", []byte{0xff, 0xff, 0xff})
				s.put(t, "error-empty.pb", []byte{})
				s.put(t, "error-noerror.pb", []byte{0x10, 0x01})
				s.put(t, "error-huge.pb", bytes.Repeat([]byte{'x'}, kferrors.DefaultMaxDocumentBytes+10))
				// A time-named corrupt document before the root cause.
				s.put(t, kferrors.NewKey(t0, "job-worker-9", "0000000000000000"), []byte("garbage"))
				r := read(t, s)
				if r.RootCause == nil || r.RootCause.Failure.Worker != "job-worker-3" {
					t.Fatalf("root cause: %+v", r.RootCause)
				}
				want := map[string]error{
					"error-corrupt.pb": kferrors.ErrCorrupt, "error-empty.pb": kferrors.ErrEmpty,
					"error-noerror.pb": kferrors.ErrMissingError, "error-huge.pb": kferrors.ErrTooLarge,
					kferrors.NewKey(t0, "job-worker-9", "0000000000000000"): kferrors.ErrCorrupt,
				}
				if len(r.Skipped) != len(want) {
					t.Fatalf("skipped: %v", r.Skipped)
				}
				for _, sk := range r.Skipped {
					if !goerrors.Is(sk.Err, want[sk.Key]) {
						t.Errorf("%s skipped with %v, want %v", sk.Key, sk.Err, want[sk.Key])
					}
				}
				if msg := r.Message(); !strings.Contains(msg, "5× "+kferrors.CodeUnreadableDocument) || strings.Contains(msg, "Skipped") {
					t.Fatalf("message: %s", msg)
				}
				// Each is a failure too, after the readable root cause (each was
				// written after it happened), with what could be read of it.
				unreadable := map[string]outputreader.Document{}
				for _, d := range r.Others {
					if d.Unreadable != nil {
						unreadable[d.Key] = d
					}
				}
				if len(unreadable) != len(want) {
					t.Fatalf("%d unreadable documents among the failures, want %d", len(unreadable), len(want))
				}
				for k, d := range unreadable {
					if d.Failure.Code != kferrors.CodeUnreadableDocument || !d.Failure.Recoverable || !goerrors.Is(d.Unreadable, want[k]) {
						t.Errorf("%s: %+v", k, d)
					}
				}
				if w := unreadable[kferrors.NewKey(t0, "job-worker-9", "0000000000000000")].Failure.Worker; w != "job-worker-9" {
					t.Errorf("a corrupt document named by its worker is that worker's failure, got %q", w)
				}
			})

			t.Run("only corrupt documents: the root cause is their failure", func(t *testing.T) {
				s := be.open(t)
				s.put(t, "error.pb", []byte("junk"))
				r := read(t, s)
				if r.RootCause == nil || r.RootCause.Unreadable == nil || len(r.Skipped) != 1 ||
					r.RootCause.Failure.Code != kferrors.CodeUnreadableDocument || !r.RootCause.Failure.Recoverable {
					t.Fatalf("%+v", r)
				}
				if msg := r.Message(); !strings.Contains(msg, "error document error.pb (4 bytes) could not be read: corrupt error document") ||
					!strings.HasSuffix(msg, "Its first bytes:\n\njunk") {
					t.Errorf("message:\n%s", msg)
				}
				if ok, err := outputreader.HasDocuments(context.Background(), s.src); !ok || err != nil {
					t.Fatalf("HasDocuments = %v, %v", ok, err)
				}
			})

			t.Run("many documents: only the earliest are opened", func(t *testing.T) {
				s := be.open(t)
				const n = 200
				var wg sync.WaitGroup
				for i := range n {
					wg.Add(1)
					go func() {
						defer wg.Done()
						// Reverse: the earliest is written last.
						ours(t, s, kferrors.SystemFailure(kferrors.CodePreempted, "terminated", fmt.Sprintf("job-worker-%d", n-i), t0.Add(time.Duration(n-i)*time.Millisecond)))
					}()
				}
				wg.Wait()
				// One of ours whose stored time is later than its name claims.
				late := kferrors.UserError("LateStamp", "x", "job-worker-0", t0.Add(time.Hour))
				s.put(t, kferrors.NewKey(t0, "job-worker-0", "ffffffffffffffff"), encode(t, late))
				r := read(t, s)
				if r.RootCause.Failure.Worker != "job-worker-1" || !r.RootCause.At.Equal(t0.Add(time.Millisecond)) {
					t.Fatalf("root cause %+v", r.RootCause)
				}
				if r.Opened >= n/2 {
					t.Fatalf("opened %d of %d documents", r.Opened, n+1)
				}
				if len(r.Others) != n || r.Workers() != n+1 {
					t.Fatalf("others %d workers %d", len(r.Others), r.Workers())
				}
				// The late-stamped one was opened and ranked by its own time: last.
				if last := r.Others[len(r.Others)-1]; last.Failure.Code != "LateStamp" || !last.Opened() {
					t.Fatalf("last other %+v", last)
				}
				if !strings.Contains(r.Message(), "later, not opened") {
					t.Fatalf("message: %s", r.Message())
				}
			})

			t.Run("paged listing", func(t *testing.T) {
				defer outputreader.SetListPageSize(7)()
				s := be.open(t)
				for i := range 40 {
					ours(t, s, kferrors.UserError("E", "m", fmt.Sprintf("job-worker-%d", i), t0.Add(time.Duration(40-i)*time.Millisecond)))
				}
				flytekit(t, s, kferrors.UserError("First", "m", "job-worker-40", t0), "00000000000000000000000000000abc")
				r := read(t, s)
				if r.RootCause.Failure.Code != "First" || len(r.Others) != 40 {
					t.Fatalf("root %+v, %d others", r.RootCause, len(r.Others))
				}
			})

			t.Run("synthesized failures merge", func(t *testing.T) {
				s := be.open(t)
				ours(t, s, kferrors.UserError("DistNetworkError", "peer gone", "job-worker-0", t0.Add(2*time.Second)))
				oom := kferrors.SystemFailure(kferrors.CodeOOMKilled, "pod job-worker-1 OOMKilled (exit 137)", "job-worker-1", t0.Add(time.Second))
				r := read(t, s, oom)
				if !r.RootCause.Synthesized || r.RootCause.Failure.Code != kferrors.CodeOOMKilled || !flyteio.ExecutionError(r.Summary()).IsRecoverable {
					t.Fatalf("root cause %+v", r.RootCause)
				}
				if flyteio.ExecutionError(r.Summary()).Kind != core.ExecutionError_SYSTEM {
					t.Fatal("kind")
				}
			})

			t.Run("wait for a late document", func(t *testing.T) {
				s := be.open(t)
				ours(t, s, kferrors.UserError("DistNetworkError", "peer gone", "job-worker-0", t0.Add(time.Second)))
				go func() {
					time.Sleep(300 * time.Millisecond)
					ours(t, s, kferrors.UserError("RuntimeError", "first", "job-worker-1", t0))
				}()
				start := time.Now()
				r, err := outputreader.WaitFor(context.Background(), s.src, &outputreader.Options{PollInterval: 50 * time.Millisecond}, 2, time.Now().Add(10*time.Second))
				if err != nil {
					t.Fatal(err)
				}
				if r.RootCause.Failure.Code != "RuntimeError" || time.Since(start) > 5*time.Second {
					t.Fatalf("root %+v after %v", r.RootCause, time.Since(start))
				}
				// The grace ends: decide with what there is.
				r, err = outputreader.WaitFor(context.Background(), s.src, &outputreader.Options{PollInterval: 50 * time.Millisecond}, 5, time.Now().Add(200*time.Millisecond))
				if err != nil || r.Workers() != 2 {
					t.Fatalf("after grace: %v %v", r, err)
				}
			})
		})
	}
}

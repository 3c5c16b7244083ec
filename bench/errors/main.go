// Command errors benchmarks root-cause selection over N error documents:
// kfelastic's outputreader against upstream flyteplugins' earliest-error
// reader (ioutils.NewRemoteFileOutputReaderWithErrorAggregationStrategy with
// k8s.EarliestErrorAggregationStrategy), on the same data, in one run, on
// file:// and on a real MinIO server it starts itself.
//
// Both sides do what propeller does with an output reader: IsError, then
// ReadError, through flytestdlib's DataStore (stow). Ours there is the
// plugin's path (Summarize: root cause and tally, no per-document state).
// Ours also runs the full list over gocloud.dev's blob (Read: the CLI's and
// the report's path). Peak memory is the peak RSS of a fresh process that
// runs one reader once (the program re-executes itself per run; VmHWM);
// "listing only" is a process that only lists the same DataStore prefix, the
// floor any reader pays for its storage client's listing; "retained" is the
// heap the reader's result (Summary or Report) holds: live heap after a GC
// with it, less without it.
//
//	go run ./bench/errors [-cases "file:1000,10000,100000 minio:1000,10000"] [-upstream-max 10000]
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/metrics"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/flyteorg/flyte/flyteplugins/go/tasks/pluginmachinery/ioutils"
	"github.com/flyteorg/flyte/flyteplugins/go/tasks/pluginmachinery/k8s"
	"github.com/flyteorg/flyte/flytestdlib/contextutils"
	"github.com/flyteorg/flyte/flytestdlib/logger"
	"github.com/flyteorg/flyte/flytestdlib/promutils"
	"github.com/flyteorg/flyte/flytestdlib/promutils/labeled"
	"github.com/flyteorg/flyte/flytestdlib/storage"
	"gocloud.dev/blob"

	kferrors "github.com/kfelastic/kfelastic/errors"
	"github.com/kfelastic/kfelastic/internal/test/kubeenv"
	"github.com/kfelastic/kfelastic/internal/test/testenv"
	"github.com/kfelastic/kfelastic/outputreader"
	"github.com/kfelastic/kfelastic/outputreader/flyteio"
)

func main() {
	cases := flag.String("cases", "file:1000,10000,100000 minio:1000,10000", "backend:counts, space-separated")
	upstreamMax := flag.Int("upstream-max", 10000, "run upstream's reader up to this many documents (beyond, stow's local store re-reads the whole tree for each 1000-key page: minutes)")
	oursRuns := flag.Int("runs", 3, "runs of ours per case (the median is shown); upstream runs once")
	childSpec := flag.String("child", "", "internal: run one reader as described and report JSON")
	flag.Parse()
	if *childSpec != "" {
		if err := child(context.Background(), *childSpec); err != nil {
			fmt.Fprintln(os.Stderr, "bench-errors child:", err)
			os.Exit(1)
		}
		return
	}
	if err := run(context.Background(), *cases, *upstreamMax, *oursRuns); err != nil {
		fmt.Fprintln(os.Stderr, "bench-errors:", err)
		os.Exit(1)
	}
}

// doc is one generated document.
type doc struct {
	key  string
	data []byte
}

// generate makes n documents as a failed job leaves them: mostly ours
// (error-<ns>-<worker>-<rand>.pb), one in 20 flytekit's (error-<uuid>.pb),
// and a legacy error.pb. Every document has a distinct timestamp so that
// upstream's reader is well-defined and both must agree. The earliest is not
// the first written.
func generate(n int) ([]doc, error) {
	rng := rand.New(rand.NewPCG(uint64(n), 7))
	base := time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC)
	docs := make([]doc, 0, n)
	used := map[int64]bool{}
	for i := range n - 1 {
		var off int64
		for off = rng.Int64N(int64(30 * time.Second)); used[off]; off = rng.Int64N(int64(30 * time.Second)) {
		}
		used[off] = true
		at := base.Add(time.Duration(off))
		worker := fmt.Sprintf("train-worker-%d", i)
		var f kferrors.Failure
		switch i % 4 {
		case 0:
			f = kferrors.UserError("torch.distributed.DistNetworkError", "Connection closed by peer\n"+strings.Repeat("  frame\n", 40), worker, at)
		case 1:
			f = kferrors.SystemFailure(kferrors.CodePreempted, "terminated from outside", worker, at)
		default:
			f = kferrors.UserError(kferrors.CodeNonZeroExit, "exited with code 1", worker, at)
		}
		key := kferrors.NewKey(at, worker, fmt.Sprintf("%016x", rng.Uint64()))
		if i%20 == 7 {
			key = fmt.Sprintf("error-%016x%016x.pb", rng.Uint64(), rng.Uint64())
		}
		data, err := kferrors.Encode(f.Document(0))
		if err != nil {
			return nil, err
		}
		docs = append(docs, doc{key, data})
	}
	legacy, err := kferrors.Encode(kferrors.UserError("LegacyError", "from error.pb", "train-master-0", base.Add(31*time.Second)).Document(0))
	if err != nil {
		return nil, err
	}
	return append(docs, doc{kferrors.LegacyKey, legacy}), nil
}

// writeAll writes docs with 32 writers.
func writeAll(ctx context.Context, docs []doc, put func(ctx context.Context, d doc) error) error {
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 32)
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := next.Add(1) - 1; i < int64(len(docs)); i = next.Add(1) - 1 {
				if err := put(ctx, docs[i]); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// spec tells a child process what to read.
type spec struct {
	Mode      string          `json:"mode"` // upstream | plugin | list | full
	Storage   *storage.Config `json:"storage"`
	Prefix    string          `json:"prefix"`
	BucketURL string          `json:"bucketURL"`
}

// childResult is what a child reports on stdout, one JSON line.
type childResult struct {
	Took     time.Duration `json:"took"`
	MaxRSSKB int64         `json:"maxRSSKB"`
	Retained int64         `json:"retained"`
	Opened   int           `json:"opened"`
	Docs     int           `json:"docs"`
	Worker   string        `json:"worker"`
	Code     string        `json:"code"`
	Time     time.Time     `json:"time"`
	Message  string        `json:"message"`
}

// child runs one reader once in this fresh process, so that its peak RSS
// (getrusage ru_maxrss) is its own, and reports.
func child(ctx context.Context, raw string) error {
	var sp spec
	if err := json.Unmarshal([]byte(raw), &sp); err != nil {
		return err
	}
	labeled.SetMetricKeys(contextutils.AppNameKey)
	if err := logger.SetConfig(&logger.Config{Level: logger.ErrorLevel}); err != nil {
		return err
	}
	ds, err := storage.NewDataStore(sp.Storage, promutils.NewTestScope())
	if err != nil {
		return err
	}
	paths := ioutils.NewReadOnlyOutputFilePaths(ctx, ds, storage.DataReference(sp.Prefix))
	var bucket *blob.Bucket
	if sp.Mode == "full" {
		if bucket, err = kferrors.OpenPrefix(ctx, sp.BucketURL, false); err != nil {
			return err
		}
		defer bucket.Close()
	}
	var res childResult
	var report *outputreader.Report
	var summary *outputreader.Summary
	start := time.Now()
	switch sp.Mode {
	case "upstream":
		// As propeller drives an output reader: IsError, then ReadError.
		up, err := ioutils.NewRemoteFileOutputReaderWithErrorAggregationStrategy(ctx, ds, paths, 0, k8s.EarliestErrorAggregationStrategy)
		if err != nil {
			return err
		}
		if ok, err := up.IsError(ctx); err != nil || !ok {
			return fmt.Errorf("upstream IsError = %v, %v", ok, err)
		}
		ee, err := up.ReadError(ctx)
		if err != nil {
			return err
		}
		res.Took = time.Since(start)
		res.Worker, res.Code, res.Time, res.Message = ee.Worker, ee.Code, ee.Timestamp.AsTime(), ee.Message
	case "plugin":
		// The same calls on our OutputReader (Summarize inside), then
		// Summarize again for the check: the same memory profile.
		ours, err := flyteio.NewOutputReader(ctx, ds, paths, 0, nil)
		if err != nil {
			return err
		}
		if ok, err := ours.IsError(ctx); err != nil || !ok {
			return fmt.Errorf("ours IsError = %v, %v", ok, err)
		}
		if _, err := ours.ReadError(ctx); err != nil {
			return err
		}
		res.Took = time.Since(start)
		if summary, err = outputreader.Summarize(ctx, ours.Source(), nil); err != nil {
			return err
		}
	case "list":
		// The floor: one listing of the same prefix, nothing kept.
		src := flyteio.NewDataStoreSource(ds, storage.DataReference(sp.Prefix))
		if err := src.List(ctx, func(outputreader.Object) error { res.Docs++; return nil }); err != nil {
			return err
		}
		res.Took = time.Since(start)
	case "full":
		if report, err = outputreader.Read(ctx, outputreader.NewBucketSource(bucket), nil); err != nil {
			return err
		}
		res.Took = time.Since(start)
	default:
		return fmt.Errorf("unknown mode %q", sp.Mode)
	}
	if report != nil {
		summary = report.Summary()
		res.Docs = 1 + len(report.Others) + len(report.Skipped)
	} else if summary != nil {
		res.Docs = summary.Documents() + summary.Skipped
	}
	if summary != nil {
		root := summary.RootCause
		res.Worker, res.Code, res.Time, res.Message = root.Failure.Worker, root.Failure.Code, root.Time(), root.Failure.Message
		res.Opened = summary.Opened
	}
	// The result's own heap: live heap with it, then without it.
	runtime.GC()
	with := heapObjects()
	runtime.KeepAlive(report)
	runtime.KeepAlive(summary)
	report, summary = nil, nil
	runtime.GC()
	res.Retained = int64(with) - int64(heapObjects())
	if res.MaxRSSKB, err = peakRSSKB(); err != nil {
		return err
	}
	return json.NewEncoder(os.Stdout).Encode(res)
}

// peakRSSKB is this process's VmHWM. Not getrusage's ru_maxrss: Linux keeps
// that across execve, and a child forked with CLONE_VM inherits the parent's
// high-water mark.
func peakRSSKB() (int64, error) {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			return strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
		}
	}
	return 0, fmt.Errorf("no VmHWM in /proc/self/status")
}

func heapObjects() uint64 {
	s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// runChild re-executes this program in child mode.
func runChild(ctx context.Context, sp spec) (childResult, error) {
	raw, err := json.Marshal(sp)
	if err != nil {
		return childResult{}, err
	}
	self, err := os.Executable()
	if err != nil {
		return childResult{}, err
	}
	cmd := exec.CommandContext(ctx, self, "-child", string(raw))
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return childResult{}, fmt.Errorf("%s: %w", sp.Mode, err)
	}
	var res childResult
	if err := json.Unmarshal(out, &res); err != nil {
		return childResult{}, fmt.Errorf("%s: %w: %q", sp.Mode, err, out)
	}
	return res, nil
}

type result struct {
	backend                      string
	n                            int
	upstream, plugin, list, full childResult
	ranUpstream                  bool
	agree                        string
}

// benchCase is one backend and its document counts.
type benchCase struct {
	backend string
	counts  []int
}

func parseCases(s string) ([]benchCase, error) {
	var out []benchCase
	for _, f := range strings.Fields(s) {
		be, list, ok := strings.Cut(f, ":")
		if !ok || (be != "file" && be != "minio") {
			return nil, fmt.Errorf("bad case %q: want file:N,N… or minio:N,N…", f)
		}
		c := benchCase{backend: be}
		for _, x := range strings.Split(list, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(x))
			if err != nil || n < 2 {
				return nil, fmt.Errorf("bad count %q in %q", x, f)
			}
			c.counts = append(c.counts, n)
		}
		out = append(out, c)
	}
	return out, nil
}

func run(ctx context.Context, casesFlag string, upstreamMax, oursRuns int) error {
	cases, err := parseCases(casesFlag)
	if err != nil {
		return err
	}
	var mio *testenv.MinIOProcess
	if strings.Contains(casesFlag, "minio") {
		testenv.SetCredentialEnv() // inherited by the children
		mio, err = testenv.StartMinIO(ctx, testenv.MinIOBinary())
		if err != nil {
			return err
		}
		defer mio.Stop()
	}
	var results []result
	for _, c := range cases {
		for _, n := range c.counts {
			docs, err := generate(n)
			if err != nil {
				return err
			}
			sp, cleanup, err := setup(ctx, c.backend, n, docs, mio)
			if errors.Is(err, errNoTopLevelDir) {
				cleanup()
				slog.Warn("file backend skipped", "err", err)
				break
			}
			if err != nil {
				cleanup()
				return err
			}
			r, err := measure(ctx, c.backend, n, sp, oursRuns, n <= upstreamMax)
			cleanup()
			if err != nil {
				return fmt.Errorf("%s N=%d: %w", c.backend, n, err)
			}
			results = append(results, r)
			slog.Info("bench case done", "backend", c.backend, "n", n, "upstream", r.upstream.Took, "plugin", r.plugin.Took)
		}
	}
	print(results, upstreamMax)
	return nil
}

// errNoTopLevelDir: the file backend cannot run here (see setup).
var errNoTopLevelDir = errors.New("upstream's stow local store needs a fresh top-level directory")

func setup(ctx context.Context, backend string, n int, docs []doc, mio *testenv.MinIOProcess) (spec, func(), error) {
	var sp spec
	cleanup := func() {}
	start := time.Now()
	switch backend {
	case "file":
		// stow's "local" kind names listed items by absolute file URL, which
		// upstream then reads with container "" — that resolves only with
		// path "/" and dynamic containers, and the container is the first
		// path element. So the data lives in a fresh top-level directory.
		dir, err := os.MkdirTemp("/", "kfelastic-bench-")
		if err != nil {
			return sp, cleanup, fmt.Errorf("%w: %v", errNoTopLevelDir, err)
		}
		cleanup = func() { os.RemoveAll(dir) }
		rel := fmt.Sprintf("n%d/attempt-0", n)
		if err := os.MkdirAll(filepath.Join(dir, rel), 0o755); err != nil {
			return sp, cleanup, err
		}
		if err := writeAll(ctx, docs, func(_ context.Context, d doc) error {
			return os.WriteFile(filepath.Join(dir, rel, d.key), d.data, 0o644)
		}); err != nil {
			return sp, cleanup, err
		}
		container := filepath.Base(dir)
		sp.Storage = &storage.Config{Type: storage.TypeStow, InitContainer: container, MultiContainerEnabled: true,
			Stow: storage.StowConfig{Kind: "local", Config: map[string]string{"path": "/"}}}
		sp.Prefix = "file://" + container + "/" + rel
		sp.BucketURL = "file://" + filepath.Join(dir, rel)
	case "minio":
		bucket := fmt.Sprintf("bench-%d-%d", n, time.Now().UnixNano())
		if err := mio.CreateBucket(ctx, bucket); err != nil {
			return sp, cleanup, err
		}
		rel := "metadata/propeller/n0/attempt-0"
		b, err := kferrors.OpenPrefix(ctx, mio.URL(bucket, rel), false)
		if err != nil {
			return sp, cleanup, err
		}
		err = writeAll(ctx, docs, func(ctx context.Context, d doc) error { return b.WriteAll(ctx, d.key, d.data, nil) })
		b.Close()
		if err != nil {
			return sp, cleanup, err
		}
		sp.Storage = kubeenv.DataStoreConfig(mio, bucket)
		sp.Prefix = "s3://" + bucket + "/" + rel
		sp.BucketURL = mio.URL(bucket, rel)
	default:
		return sp, cleanup, fmt.Errorf("unknown backend %q", backend)
	}
	slog.Info("documents written", "backend", backend, "n", n, "took", time.Since(start).Round(time.Millisecond))
	return sp, cleanup, nil
}

func measure(ctx context.Context, backend string, n int, sp spec, oursRuns int, withUpstream bool) (result, error) {
	r := result{backend: backend, n: n, ranUpstream: withUpstream}
	var err error
	if withUpstream {
		sp.Mode = "upstream"
		if r.upstream, err = runChild(ctx, sp); err != nil {
			return r, err
		}
	}
	pick := func(mode string, runs int) (childResult, error) {
		sp.Mode = mode
		var all []childResult
		for range runs {
			res, err := runChild(ctx, sp)
			if err != nil {
				return res, err
			}
			all = append(all, res)
		}
		slices.SortFunc(all, func(a, b childResult) int { return int(a.Took - b.Took) })
		return all[len(all)/2], nil
	}
	if r.list, err = pick("list", 1); err != nil {
		return r, err
	}
	if r.plugin, err = pick("plugin", oursRuns); err != nil {
		return r, err
	}
	if r.full, err = pick("full", oursRuns); err != nil {
		return r, err
	}
	want, wantName := r.upstream, "upstream"
	if !withUpstream {
		want, wantName = r.full, "full list"
	}
	r.agree = "yes"
	if !withUpstream {
		r.agree = "yes (plugin = full list)"
	}
	for _, got := range []childResult{r.plugin, r.full} {
		if got.Worker != want.Worker || got.Code != want.Code || !got.Time.Equal(want.Time) || got.Message != want.Message {
			r.agree = fmt.Sprintf("NO: %s %s %s %s, ours %s %s %s", wantName, want.Worker, want.Time, want.Code, got.Worker, got.Time, got.Code)
		}
		if got.Docs != n {
			return r, fmt.Errorf("ours accounted for %d documents of %d", got.Docs, n)
		}
	}
	if r.list.Docs != n {
		return r, fmt.Errorf("the listing found %d documents of %d", r.list.Docs, n)
	}
	return r, nil
}

func print(results []result, upstreamMax int) {
	var b bytes.Buffer
	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "backend\tN\tupstream\tplugin path (DataStore)\tupstream/ours\tfull list (blob)\tupstream/ours\topened\tsame root cause\t")
	for _, r := range results {
		up, r1, r2 := "–", "–", "–"
		if r.ranUpstream {
			up = r.upstream.Took.Round(time.Millisecond).String()
			r1 = fmt.Sprintf("%.1f×", float64(r.upstream.Took)/float64(r.plugin.Took))
			r2 = fmt.Sprintf("%.1f×", float64(r.upstream.Took)/float64(r.full.Took))
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%v\t%s\t%v\t%s\t%d\t%s\t\n", r.backend, r.n, up,
			r.plugin.Took.Round(100*time.Microsecond), r1, r.full.Took.Round(100*time.Microsecond), r2, r.plugin.Opened, r.agree)
	}
	tw.Flush()
	fmt.Print(b.String())
	fmt.Println()
	b.Reset()
	tw = tabwriter.NewWriter(&b, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "peak RSS:\tN\tupstream\tlisting only (DataStore)\tplugin path (DataStore)\tplugin − listing\tfull list (blob)\tretained: plugin\tretained: full list\t")
	for _, r := range results {
		up := "–"
		if r.ranUpstream {
			up = mib(r.upstream.MaxRSSKB << 10)
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", r.backend, r.n, up, mib(r.list.MaxRSSKB<<10), mib(r.plugin.MaxRSSKB<<10),
			mib((r.plugin.MaxRSSKB-r.list.MaxRSSKB)<<10), mib(r.full.MaxRSSKB<<10), kib(r.plugin.Retained), kib(r.full.Retained))
	}
	tw.Flush()
	fmt.Print(b.String())
	if len(results) > 0 {
		last := results[len(results)-1].plugin
		fmt.Printf("root cause (all): %s %s %s\n", last.Worker, last.Time.Format(time.RFC3339Nano), last.Code)
	}
	fmt.Println("upstream = IsError + ReadError of flyteplugins' earliest reader over flytestdlib storage (stow), one run;")
	fmt.Printf("  – = not run above %d documents (stow's local store re-reads the whole tree for each 1000-key page);\n", upstreamMax)
	fmt.Println("plugin path = our OutputReader's IsError + ReadError (outputreader.Summarize) over the same DataStore;")
	fmt.Println("full list = outputreader.Read over gocloud.dev blob (the CLI's and the report's path); median of the runs;")
	fmt.Println("each run is a fresh process: peak RSS is its VmHWM; listing only = one listing of the same DataStore prefix, nothing kept;")
	fmt.Println("retained = heap held by the reader's result after GC.")
}

func kib(b int64) string { return fmt.Sprintf("%.0f KiB", float64(b)/(1<<10)) }

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

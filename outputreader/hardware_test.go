package outputreader_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"gocloud.dev/blob"
	"gocloud.dev/blob/memblob"

	kferrors "github.com/kfelastic/kfelastic/errors"
	"github.com/kfelastic/kfelastic/outputreader"
)

// Issue 31, item 2: a hardware fault stands for its peers' earlier
// secondary failures. When worker 1's GPU falls off the bus, worker 0 and 2
// report NCCL's remote error within a second, and the node daemon's event
// (the master's GpuFallenOffBus document) comes 20 s later: the root cause
// is the hardware fault, and the UI line names the earliest failure it
// explains. Beyond HardwareWindow, or when the earliest failure is not a
// secondary one, the earliest failure stands. Read and Summarize agree.
func TestHardwareFaultExplainsEarlierSecondaryFailures(t *testing.T) {
	t0 := time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC)
	nccl := func(worker string, at time.Time) kferrors.Failure {
		return kferrors.SystemFailure(kferrors.CodeNcclRemoteError, "ncclRemoteError: remote process exited", worker, at)
	}
	gpu := func(at time.Time) kferrors.Failure {
		return kferrors.SystemFailure(kferrors.CodeGpuFallenOffBus, "GPU 3 has fallen off the bus (Xid 79) on node gpu-7",
			"job-worker-1", at)
	}
	for _, tc := range []struct {
		name      string
		docs      []kferrors.Failure
		root      string // code of the root cause
		displaced string // code of the failure it stands for; "" for none
	}{
		{"a peer's NCCL error, the fault 20 s later", []kferrors.Failure{nccl("job-worker-0", t0), nccl("job-worker-2", t0.Add(300*time.Millisecond)),
			gpu(t0.Add(20 * time.Second))}, kferrors.CodeGpuFallenOffBus, kferrors.CodeNcclRemoteError},
		{"the fault first", []kferrors.Failure{gpu(t0), nccl("job-worker-0", t0.Add(time.Second))}, kferrors.CodeGpuFallenOffBus, ""},
		{"the fault past the window", []kferrors.Failure{nccl("job-worker-0", t0), gpu(t0.Add(outputreader.HardwareWindow + time.Second))},
			kferrors.CodeNcclRemoteError, ""},
		{"a user's exception first", []kferrors.Failure{kferrors.UserError("ValueError", "loss is NaN", "job-worker-2", t0),
			nccl("job-worker-0", t0.Add(time.Second)), gpu(t0.Add(5 * time.Second))}, "ValueError", ""},
		{"a watchdog timeout first, then a user's exception, then the fault", []kferrors.Failure{
			kferrors.SystemFailure(kferrors.CodeNcclTimeout, "Watchdog caught collective operation timeout", "job-worker-0", t0),
			kferrors.UserError("RuntimeError", "[gloo] Connection closed by peer", "job-worker-2", t0.Add(time.Second)),
			gpu(t0.Add(2 * time.Second))}, kferrors.CodeGpuFallenOffBus, kferrors.CodeNcclTimeout},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := memblob.OpenBucket(nil)
			defer b.Close()
			for _, f := range tc.docs {
				if _, err := kferrors.NewWriter(b, nil).Write(t.Context(), f); err != nil {
					t.Fatal(err)
				}
			}
			r, _ := readBoth(t, b, 4)
			if r.RootCause == nil || r.RootCause.Failure.Code != tc.root {
				t.Fatalf("root cause %+v, want %s", r.RootCause, tc.root)
			}
			switch {
			case tc.displaced == "" && r.Displaced != nil:
				t.Errorf("displaced %+v, want none", r.Displaced)
			case tc.displaced != "" && (r.Displaced == nil || r.Displaced.Failure.Code != tc.displaced):
				t.Errorf("displaced %+v, want the earliest %s", r.Displaced, tc.displaced)
			}
			line := r.Message()[strings.LastIndexByte(r.Message(), '\n')+1:]
			if want := "Hardware fault shown: it explains the earlier " + tc.displaced + " of job-worker-0 at 2026-12-06T10:00:00"; (tc.displaced != "") != strings.Contains(line, want) {
				t.Errorf("UI message's last line %q, want %q: %v", line, want, tc.displaced != "")
			}
			if tc.displaced == "" && !strings.HasSuffix(line, "Earliest failure shown.") {
				t.Errorf("UI message's last line %q", line)
			}
			if !r.IsRecoverable() != (tc.root == "ValueError") {
				t.Errorf("recoverable %v with root %s", r.IsRecoverable(), tc.root)
			}
		})
	}
}

// A storm of secondary failures (every peer's NCCL watchdog, 300
// documents within 3 s, as many as Read opens in its first rounds many
// times over) does not hide the hardware fault that came later: its name
// is marked (kferrors.DocumentKey), so the reader opens it whatever its
// time, where it would otherwise stop at the earliest names.
func TestHardwareFaultFoundPastASecondaryStorm(t *testing.T) {
	t0 := time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC)
	b := memblob.OpenBucket(nil)
	defer b.Close()
	w := kferrors.NewWriter(b, nil)
	for i := range 300 {
		f := kferrors.SystemFailure(kferrors.CodeNcclTimeout, "Watchdog caught collective operation timeout",
			fmt.Sprintf("job-worker-%d", i), t0.Add(time.Duration(i)*10*time.Millisecond))
		if _, err := w.Write(t.Context(), f); err != nil {
			t.Fatal(err)
		}
	}
	gpu := kferrors.SystemFailure(kferrors.CodeGpuEccUncorrectable, "uncorrectable ECC error (Xid 48) on GPU 0", "job-worker-301", t0.Add(40*time.Second))
	key, err := w.Write(t.Context(), gpu)
	if err != nil {
		t.Fatal(err)
	}
	if !kferrors.IsHardwareKey(key) {
		t.Fatalf("the hardware fault's document %s is not marked", key)
	}
	r, s := readBoth(t, b, 8)
	if r.RootCause == nil || r.RootCause.Key != key || s.RootCause.Key != key {
		t.Fatalf("root cause %+v, want the hardware fault %s", r.RootCause, key)
	}
	if r.Displaced == nil || r.Displaced.Failure.Worker != "job-worker-0" {
		t.Errorf("displaced %+v, want job-worker-0's watchdog timeout", r.Displaced)
	}
	if r.Opened >= 300 {
		t.Errorf("opened %d of 301 documents: the names of the storm should still spare most reads", r.Opened)
	}
}

// A failure merged in (the plugin's synthesized pod failures) is ranked by
// the same rule: an earlier one that is not secondary stands, as it would
// among the documents.
func TestMergeDecidesTheHardwareRuleAgain(t *testing.T) {
	t0 := time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC)
	b := memblob.OpenBucket(nil)
	defer b.Close()
	for _, f := range []kferrors.Failure{
		kferrors.SystemFailure(kferrors.CodeNcclRemoteError, "ncclRemoteError", "job-worker-0", t0.Add(time.Second)),
		kferrors.SystemFailure(kferrors.CodeGpuFallenOffBus, "Xid 79", "job-worker-1", t0.Add(3*time.Second)),
	} {
		if _, err := kferrors.NewWriter(b, nil).Write(t.Context(), f); err != nil {
			t.Fatal(err)
		}
	}
	_, s := readBoth(t, b, 2)
	if s.RootCause.Failure.Code != kferrors.CodeGpuFallenOffBus {
		t.Fatalf("root %+v", s.RootCause)
	}
	later := s.Merge(kferrors.SystemFailure("OOMKilled", "", "job-worker-2", t0.Add(2*time.Second)))
	if later.RootCause.Failure.Code != kferrors.CodeGpuFallenOffBus || later.Displaced == nil {
		t.Errorf("a later failure merged in: root %+v displaced %+v", later.RootCause, later.Displaced)
	}
	earlier := s.Merge(kferrors.SystemFailure("OOMKilled", "", "job-worker-2", t0))
	if earlier.RootCause.Failure.Code != "OOMKilled" || earlier.Displaced != nil {
		t.Errorf("an earlier failure merged in: root %+v displaced %+v", earlier.RootCause, earlier.Displaced)
	}
	if s.RootCause.Failure.Code != kferrors.CodeGpuFallenOffBus {
		t.Errorf("Merge changed its receiver: %+v", s.RootCause)
	}
}

// readBoth reads b with Read and Summarize at concurrency n and checks
// that they agree.
func readBoth(t *testing.T, b *blob.Bucket, n int) (*outputreader.Report, *outputreader.Summary) {
	t.Helper()
	ctx := context.Background()
	opts := &outputreader.Options{Concurrency: n}
	r, err := outputreader.Read(ctx, outputreader.NewBucketSource(b), opts)
	if err != nil {
		t.Fatal(err)
	}
	s, err := outputreader.Summarize(ctx, outputreader.NewBucketSource(b), opts)
	if err != nil {
		t.Fatal(err)
	}
	sameSummary(t, r, s)
	return r, s
}

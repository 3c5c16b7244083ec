package outputreader_test

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"gocloud.dev/blob/memblob"

	kferrors "github.com/kfelastic/kfelastic/errors"
	"github.com/kfelastic/kfelastic/outputreader"
)

// More distinct workers and codes than a tally keeps: the counts stay
// bounded and the message says "at least" rather than a wrong number.
func TestSummaryTallyIsBounded(t *testing.T) {
	at := time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC)
	n := outputreader.MaxTallyWorkers + 3000
	root := outputreader.Document{Key: "k", Failure: kferrors.UserError("RuntimeError", "first", "job-worker-0", at), At: at}
	r := &outputreader.Report{RootCause: &root}
	for i := 1; i <= n; i++ {
		code := "DistNetworkError"
		if i <= 40 {
			code = fmt.Sprintf("E%02d", i) // 40 distinct rare codes, beyond the bound
		}
		r.Others = append(r.Others, outputreader.Document{Failure: kferrors.UserError(code, "", fmt.Sprintf("job-worker-%d", i), at.Add(time.Second)), At: at.Add(time.Second)})
	}
	s := r.Summary()
	msg := s.Message()
	if !strings.Contains(msg, fmt.Sprintf("Also failed: at least %d other workers, %d other documents (", outputreader.MaxTallyWorkers-1, n)) {
		t.Fatalf("message: %s", msg)
	}
	if !strings.Contains(msg, fmt.Sprintf("(%d× DistNetworkError, 1× E01, ", n-40)) || !strings.Contains(msg, "1× E07, 33× other codes).") {
		t.Fatalf("codes: %s", msg)
	}
	// Beyond the codes a tally names, the counts still add up.
	many := &outputreader.Report{RootCause: &root}
	for i := range 1000 {
		many.Others = append(many.Others, outputreader.Document{Failure: kferrors.UserError(fmt.Sprintf("E%04d-%s", i, strings.Repeat("x", 1<<10)), "", "w", at), At: at})
	}
	if msg := many.Summary().Message(); !strings.Contains(msg, "1× E0000-xxx") || !strings.Contains(msg, "…, 992× other codes).") || len(msg) > 1200 {
		t.Fatalf("many codes: %s", msg)
	}
	if s.Pods() != outputreader.MaxTallyWorkers || !s.HasPod("job-worker-0") || !s.HasPod("never-seen") {
		t.Fatalf("pods %d; a full tally must assume an unseen pod reported", s.Pods())
	}
	if s.Documents() != n+1 {
		t.Fatalf("documents %d", s.Documents())
	}
}

func TestSummaryMergeRanksSynthesizedFailures(t *testing.T) {
	at := time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC)
	root := outputreader.Document{Key: "k", Failure: kferrors.UserError("DistNetworkError", "peer gone", "job-worker-0/1", at.Add(time.Second)), At: at.Add(time.Second)}
	s := (&outputreader.Report{RootCause: &root}).Summary()
	if s.HasPod("job-worker-1") || !s.HasPod("job-worker-0") || s.Pods() != 1 {
		t.Fatal("pods of a worker document")
	}
	oom := kferrors.SystemFailure(kferrors.CodeOOMKilled, "worker job-worker-1 was killed by the OOM killer", "job-worker-1", at)
	m := s.Merge(oom)
	if m.RootCause.Failure.Code != kferrors.CodeOOMKilled || !m.RootCause.Synthesized || !m.IsRecoverable() {
		t.Fatalf("merged root %+v", m.RootCause)
	}
	if want := "Also failed: 1 other worker (1× DistNetworkError)."; !strings.Contains(m.Message(), want) {
		t.Fatalf("merged message %q lacks %q", m.Message(), want)
	}
	if s.RootCause.Failure.Code != "DistNetworkError" || s.Documents() != 1 || !m.HasPod("job-worker-1") || s.HasPod("job-worker-1") {
		t.Fatal("Merge modified its receiver")
	}
}

// Summarize opens what Read opens, and keeps a sample of the skipped keys.
func TestSummarizeSkippedSample(t *testing.T) {
	ctx := context.Background()
	b := memblob.OpenBucket(nil)
	defer b.Close()
	at := time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC)
	data, err := kferrors.Encode(kferrors.UserError("E", "m", "w", at).Document(0))
	if err != nil {
		t.Fatal(err)
	}
	b.WriteAll(ctx, kferrors.NewKey(at, "w", "0"), data, nil)
	for i := range 40 {
		b.WriteAll(ctx, fmt.Sprintf("error-bad%02d.pb", 39-i), []byte("junk"), nil)
	}
	src := outputreader.NewBucketSource(b)
	s, err := outputreader.Summarize(ctx, src, nil)
	if err != nil {
		t.Fatal(err)
	}
	r, err := outputreader.Read(ctx, src, nil)
	if err != nil {
		t.Fatal(err)
	}
	sameSummary(t, r, s)
	if s.Skipped != 40 || len(s.SkippedSample) != 16 || s.SkippedSample[0].Key != "error-bad00.pb" {
		t.Fatalf("skipped %d, sample %v", s.Skipped, s.SkippedSample)
	}
}

// docs/DESIGN.md §2.4, row by row: the UI message says each code once. Messages
// that already start with their code (torch's "Type: text", flytekit's)
// are not prefixed again.
func TestMessageSaysEachClassificationCodeOnce(t *testing.T) {
	at := time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC)
	w := "job-worker-1/0"
	te := func(msg, tb string) *kferrors.TorchError {
		return &kferrors.TorchError{Message: msg, Traceback: tb, Time: at}
	}
	recoverable := func(f kferrors.Failure) kferrors.Failure { f.Recoverable = true; return f }
	rows := []struct {
		row  string
		f    kferrors.Failure
		want string // the first line after "] "
	}{
		{"user exception, torch error file", kferrors.Classify(kferrors.WorkerExit{Worker: w, ExitCode: 1, ObservedAt: at, TorchError: te("ValueError: batch 17 has NaN labels", "")}),
			"ValueError: batch 17 has NaN labels"},
		{"user exception, flytekit document", kferrors.UserError("ValueError", "ValueError: batch 17 has NaN labels", w, at),
			"ValueError: batch 17 has NaN labels"},
		{"user exception, traceback", kferrors.Classify(kferrors.WorkerExit{Worker: w, ExitCode: 1, ObservedAt: at, TorchError: te("ValueError: x", "Traceback (most recent call last):\n  File \"t.py\"\nValueError: x\n")}),
			"ValueError: Traceback (most recent call last):"},
		{"user exception, qualified code", kferrors.UserError("USER:ValueError", "ValueError: batch 17", w, at), "USER:ValueError: batch 17"},
		{"non-zero exit", kferrors.Classify(kferrors.WorkerExit{Worker: w, ExitCode: 3, ObservedAt: at}), "NonZeroExit: worker job-worker-1/0 exited with code 3"},
		{"flytekit recoverable", kferrors.Classify(kferrors.WorkerExit{Worker: w, ExitCode: 1, ObservedAt: at, RecoverableMarker: true, TorchError: te("FlyteRecoverableException: retry me", "")}),
			"USER:Recoverable: FlyteRecoverableException: retry me"},
		{"flytekit recoverable, flytekit document", recoverable(kferrors.UserError(kferrors.CodeRecoverable, "USER:Recoverable: retry me", w, at)), "USER:Recoverable: retry me"},
		{"OOM", kferrors.Classify(kferrors.WorkerExit{Worker: w, Signal: syscall.SIGKILL, OOM: true, ObservedAt: at}), "OOMKilled: worker job-worker-1/0 was killed by the OOM killer"},
		{"preempted", kferrors.Classify(kferrors.WorkerExit{Worker: w, Signal: syscall.SIGTERM, Preempted: true, ObservedAt: at}),
			"Preempted: worker job-worker-1/0 was terminated from outside (preemption, eviction or node drain)"},
		{"other signal", kferrors.Classify(kferrors.WorkerExit{Worker: w, Signal: syscall.SIGSEGV, ObservedAt: at}), "SignalSIGSEGV: worker job-worker-1/0 was killed by signal 11 (SIGSEGV)"},
		{"node check failed", kferrors.SystemFailure(kferrors.CodeNodeCheckFailed, "NodeCheckFailed: node 1 failed both check rounds", w, at), "NodeCheckFailed: node 1 failed both check rounds"},
		{"straggler", kferrors.SystemFailure(kferrors.CodeStraggler, "node 1 took 2.4× the median", w, at), "Straggler: node 1 took 2.4× the median"},
		{"rendezvous timeout", kferrors.SystemFailure(kferrors.CodeRendezvousTimeout, "RendezvousTimeout: 2 of 3 nodes joined", w, at), "RendezvousTimeout: 2 of 3 nodes joined"},
		{"hang", kferrors.SystemFailure(kferrors.CodeHang, "Hang", w, at), "Hang"},
	}
	for _, c := range rows {
		t.Run(c.row, func(t *testing.T) {
			d := outputreader.Document{Key: "k", Failure: c.f, At: at}
			msg := (&outputreader.Report{RootCause: &d}).Message()
			first, _, _ := strings.Cut(msg, "\n")
			_, got, _ := strings.Cut(first, "] ")
			if got != c.want {
				t.Fatalf("got  %q\nwant %q", got, c.want)
			}
			if code := c.f.Code; strings.Count(got, code+":") > 1 || strings.HasPrefix(got, code+": "+code) {
				t.Fatalf("code %s said twice: %q", code, got)
			}
		})
	}
}

package report_test

import (
	"fmt"
	"time"

	kferrors "github.com/kfelastic/kfelastic/errors"
	"github.com/kfelastic/kfelastic/events"
	"github.com/kfelastic/kfelastic/outputreader"
	"github.com/kfelastic/kfelastic/report"
)

// t0 is the root cause's time in every fixture.
var t0 = time.Date(2026, 11, 21, 10, 0, 1, 123456789, time.UTC)

func doc(key string, f kferrors.Failure) outputreader.Document {
	return outputreader.Document{Key: key, Failure: f, At: f.Time}
}

func code(n int) *int { return &n }

// fourPods is the story of a small job: worker-1's rank 1 was kill -9'ed and
// restarted in place (a recovered failure, superseded), then rank 0 raised a
// ValueError, the peers failed a second later, worker-3 was preempted and
// relaunched as worker-4. One document is corrupt and one event unreadable.
func fourPods() report.Input {
	root := doc("error-1795254401123456789-job-worker-1.0-00000000000000a1.pb",
		kferrors.UserError("ValueError", "Traceback (most recent call last):\n  File \"train.py\", line 17, in <module>\nValueError: batch 17 has NaN labels\n", "job-worker-1/0", t0))
	cur := &outputreader.Report{
		RootCause: &root,
		Others: []outputreader.Document{
			doc("error-1795254402143456789-job-worker-0.0-00000000000000b1.pb", kferrors.UserError("torch.distributed.DistNetworkError", "Connection closed by peer", "job-worker-0/0", t0.Add(1020*time.Millisecond))),
			doc("error-1795254402173456789-job-worker-2.0-00000000000000c1.pb", kferrors.UserError("torch.distributed.DistNetworkError", "Connection closed by peer", "job-worker-2/0", t0.Add(1050*time.Millisecond))),
			doc("error-1795254402623456789-job-worker-3-00000000000000d1.pb", kferrors.SystemFailure(kferrors.CodePreempted, "pod job-worker-3 got SIGTERM", "job-worker-3", t0.Add(1500*time.Millisecond))),
		},
		Skipped: []outputreader.Skipped{{Key: "error-0badc0de.pb", Err: kferrors.ErrCorrupt}},
		Opened:  5,
	}
	old := doc("error-1795254361123456789-job-worker-1.1-00000000000000e1.pb",
		kferrors.SystemFailure("SignalSIGKILL", "worker job-worker-1/1 was killed by signal 9 (SIGKILL)", "job-worker-1/1", t0.Add(-40*time.Second)))
	sup := &outputreader.Report{RootCause: &old, Opened: 1}
	ev := func(d time.Duration, pod string, kind events.Kind, e events.Event) events.Event {
		e.Version, e.Time, e.Pod, e.Kind = 1, t0.Add(d), pod, kind
		return e
	}
	log := &events.Log{Events: []events.Event{
		ev(-60*time.Second, "job-worker-0", events.GroupStarted, events.Event{Attempt: 1, WorldSize: 4}),
		ev(-60*time.Second, "job-worker-1", events.GroupStarted, events.Event{Attempt: 1, WorldSize: 4}),
		ev(-60*time.Second, "job-worker-2", events.GroupStarted, events.Event{Attempt: 1, WorldSize: 4}),
		ev(-60*time.Second, "job-worker-3", events.GroupStarted, events.Event{Attempt: 1, WorldSize: 4}),
		ev(-40*time.Second, "job-worker-1", events.WorkerExited, events.Event{Attempt: 1, Worker: "job-worker-1/1", Signal: "SIGKILL", Code: "SignalSIGKILL"}),
		ev(-39*time.Second, "job-worker-1", events.WorkerExited, events.Event{Attempt: 1, Worker: "job-worker-1/0", Signal: "SIGTERM", Code: "SignalSIGTERM", Stopped: true}),
		ev(-39*time.Second, "job-worker-1", events.Restart, events.Event{Attempt: 2, RestartCount: 1, Reason: "failure"}),
		ev(-38*time.Second, "job-worker-1", events.GroupStarted, events.Event{Attempt: 2, RestartCount: 1, WorldSize: 4}),
		ev(0, "job-worker-1", events.WorkerExited, events.Event{Attempt: 2, Worker: "job-worker-1/0", ExitCode: code(1), Code: "ValueError"}),
		ev(2*time.Second, "job-worker-1", events.PodFailed, events.Event{Attempt: 2, ExitCode: code(1), Code: "ValueError", Document: root.Key}),
		ev(3*time.Second, "job-worker-3", events.Relaunch, events.Event{Replacement: "job-worker-4", Reason: "Preempted"}),
		ev(5*time.Second, "job-worker-4", events.GroupStarted, events.Event{Attempt: 1, WorldSize: 4}),
	}, Skipped: []events.Skipped{{Key: "events/0000-bad.json", Err: events.ErrCorrupt}}}
	return report.Input{Prefix: "s3://flyte/metadata/propeller/job/n0/attempt-0", Current: cur, Superseded: sup, Events: log}
}

// hostile is a job whose texts try to be markup, script and terminal
// control sequences.
func hostile() report.Input {
	msg := "<script>alert(1)</script><img src=x onerror=alert(2)><b id=injected>bold</b>\x1b[31mRED\x1b[0m \u202eevil\u202c"
	root := doc("error-<script>.pb", kferrors.UserError("</title><script>alert(3)</script>", msg, `job-"><svg onload=alert(4)>/0`, t0))
	other := doc("error-x.pb", kferrors.UserError("E", "\x07bell & <i>italic</i>", "job-worker-1/0", t0.Add(time.Second)))
	cur := &outputreader.Report{RootCause: &root, Others: []outputreader.Document{other},
		Skipped: []outputreader.Skipped{{Key: "error-<img src=x onerror=alert(5)>.pb", Err: fmt.Errorf("%w: <b id=injected2>", kferrors.ErrCorrupt)}}}
	log := &events.Log{Events: []events.Event{{Version: 1, Time: t0.Add(-time.Second), Pod: "<style>body{display:none}</style>", Kind: "<script>", Message: "\x1b]0;title\x07"}}}
	return report.Input{Prefix: "file:///tmp/<script>alert(6)</script>", Current: cur, Events: log}
}

// manyPods is a 500-pod job: pod 250 fails first, every other pod a
// little later; each pod started one group.
func manyPods(n int) report.Input {
	rootPod := n / 2
	var root outputreader.Document
	var others []outputreader.Document
	var evs []events.Event
	for i := range n {
		pod := fmt.Sprintf("big-job-worker-%d", i)
		evs = append(evs, events.Event{Version: 1, Time: t0.Add(-10 * time.Minute), Pod: pod, Kind: events.GroupStarted, Attempt: 1, WorldSize: n})
		if i == rootPod {
			root = doc(fmt.Sprintf("error-r-%d.pb", i), kferrors.UserError("RuntimeError", "CUDA error: an illegal memory access was encountered", pod+"/0", t0))
			continue
		}
		at := t0.Add(time.Second + time.Duration(i)*3*time.Millisecond)
		others = append(others, doc(fmt.Sprintf("error-o-%03d.pb", i), kferrors.UserError("torch.distributed.DistNetworkError", "Connection closed by peer", pod+"/0", at)))
	}
	return report.Input{Prefix: "s3://flyte/metadata/big-job/n0/attempt-0",
		Current: &outputreader.Report{RootCause: &root, Others: others}, Events: &events.Log{Events: evs}}
}

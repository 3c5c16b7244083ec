package report_test

import (
	"strings"
	"testing"
	"time"

	kferrors "github.com/kfelastic/kfelastic/errors"
	"github.com/kfelastic/kfelastic/events"
	"github.com/kfelastic/kfelastic/internal/test/flytekitdoc"
	"github.com/kfelastic/kfelastic/outputreader"
	"github.com/kfelastic/kfelastic/report"
)

// A flytekit Elastic task under --launcher command: flytekit's documents
// name the pod (job-worker-1), the agent's events the command as worker
// "<pod>/0". One lane per pod holds both, and flytekit's USER:RuntimeError
// is shown as the exception it wraps.
func TestFlytekitDocumentsAndAgentEventsShareALane(t *testing.T) {
	at := time.Date(2026, 11, 25, 21, 33, 0, 300_000_000, time.UTC)
	rootF := flytekitdoc.Failure("job-worker-1", "ValueError: batch 17 has NaN labels", "/tmp/torchelastic_a/error.json", at)
	rootF.Time = at // refined by the agent
	otherF := flytekitdoc.Failure("job-worker-0", "RuntimeError: [gloo] Connection closed by peer [10.0.0.7]:33155", "/tmp/torchelastic_b/error.json", at)
	otherF.Time = at.Add(400 * time.Millisecond)
	root := doc("error-1795642380300000000-job-worker-1-00000000000000a1.pb", rootF)
	other := doc("error-1795642380700000000-job-worker-0-00000000000000b1.pb", otherF)
	other.Exception, other.Failure.Message = "RuntimeError", "" // as Read keeps a document that is not the root cause
	zero := 0
	var evs []events.Event
	for _, pod := range []string{"job-worker-0", "job-worker-1"} {
		evs = append(evs,
			events.Event{Version: 1, Time: at.Add(-20 * time.Second), Pod: pod, Kind: events.GroupStarted, Attempt: 1, WorldSize: 2},
			events.Event{Version: 1, Time: at.Add(time.Second), Pod: pod, Kind: events.WorkerExited, Attempt: 1, Worker: pod + "/0", ExitCode: &zero},
			events.Event{Version: 1, Time: at.Add(time.Second), Pod: pod, Kind: events.PodFailed, Attempt: 1, Worker: pod, ExitCode: &zero,
				Code: flytekitdoc.Code})
	}
	in := report.Input{Prefix: "file:///out", Current: &outputreader.Report{RootCause: &root, Others: []outputreader.Document{other}, Opened: 2},
		Events: &events.Log{Events: evs}}
	page, doc := parse(t, in)
	if pods := lanes(doc); strings.Join(pods, " ") != "job-worker-1 job-worker-0" {
		t.Fatalf("lanes %v, want one per pod", pods)
	}
	if got := text(byID(doc, "root-lane")); !strings.Contains(got, "ROOT CAUSE · ValueError: batch 17 has NaN labels") {
		t.Errorf("root lane %q", got)
	}
	if got := text(byID(doc, "ui-message")); !strings.HasPrefix(got, "[job-worker-1, 2026-11-25T21:33:00.300000000Z] ValueError: batch 17 has NaN labels") ||
		!strings.Contains(got, "1× RuntimeError") {
		t.Errorf("UI message %q", got)
	}
	for _, want := range []string{"code <b>ValueError</b>", `<td class="mono">ValueError: batch 17 has NaN labels</td>`,
		`<td class="mono">RuntimeError</td>`, "2 pods"} {
		if !strings.Contains(page, want) {
			t.Errorf("page lacks %s", want)
		}
	}
	if strings.Contains(page, "USER:RuntimeError: Trace") {
		t.Error("flytekit's wrapper code shown with its message's first line")
	}
}

// Issue 27: a flytekit document whose "Message:" section names the user's
// exception (a task that is not Elastic) is shown with that exception as
// its code, as the UI message shows it.
func TestFlytekitTaskExceptionShownAsCode(t *testing.T) {
	trace := "Traceback (most recent call last):\n  File \"/app/train.py\", line 41, in train\n    raise ValueError(\"loss is NaN at step 20\")\nValueError: loss is NaN at step 20\n"
	rootF := kferrors.UserError(flytekitdoc.Code, flytekitdoc.TaskMessage(trace, "ValueError: loss is NaN at step 20"), "job-worker-1", t0)
	root := doc("error-"+strings.Repeat("a1", 16)+".pb", rootF)
	in := report.Input{Prefix: "file:///out", Current: &outputreader.Report{RootCause: &root, Opened: 1}}
	page, d := parse(t, in)
	if got := text(byID(d, "root-lane")); !strings.Contains(got, "ROOT CAUSE · ValueError: loss is NaN at step 20") {
		t.Errorf("root lane %q", got)
	}
	if got := text(byID(d, "ui-message")); !strings.HasPrefix(got, "[job-worker-1, 2026-11-21T10:00:01.123456789Z] ValueError: loss is NaN at step 20") {
		t.Errorf("UI message %q", got)
	}
	if !strings.Contains(page, "code <b>ValueError</b>") || strings.Contains(page, "USER:RuntimeError: Trace") {
		t.Error("flytekit's wrapper code shown instead of the exception it wraps")
	}
}

package kfoperator

import (
	"fmt"
	"strings"

	"time"

	flyteerr "github.com/flyteorg/flyte/flyteplugins/go/tasks/errors"
	pluginsCore "github.com/flyteorg/flyte/flyteplugins/go/tasks/pluginmachinery/core"
	kubeflowv1 "github.com/kubeflow/training-operator/pkg/apis/kubeflow.org/v1"
	corev1 "k8s.io/api/core/v1"

	kferrors "github.com/kfelastic/kfelastic/errors"
	"github.com/kfelastic/kfelastic/outputreader"
	"github.com/kfelastic/kfelastic/outputreader/flyteio"
)

// PhaseConfig tunes the phase mapping.
type PhaseConfig struct {
	// LateDocumentGrace is how long after the job turned terminal the
	// mapping waits for failed pods' documents before deciding without them.
	LateDocumentGrace time.Duration
	// OperatorTimeout: a job the operator has not started this long after
	// its creation is an error (as upstream's kf-operator timeout).
	OperatorTimeout time.Duration
}

// primaryContainer is the container the operator requires in each replica.
func primaryContainer(kind string) string {
	if kind == kubeflowv1.TFJobKind {
		return kubeflowv1.TFJobDefaultContainerName
	}
	return kubeflowv1.PyTorchJobDefaultContainerName
}

// Phase maps a job, its pods and the error documents read for it to a Flyte
// phase, at time now. It is pure.
//
// pods are the job's pods; nil means they could not be listed, and the
// failed-pod count then comes from the job status. report is the outcome of
// outputreader.Summarize over the task's output prefix (or a full
// Report.Summary); it is only looked at when the job is terminal (nil then
// means no documents).
//
// On Failed: while fewer failed pods have a document than failed (listed
// pods, or the job status's count when that is larger), or a listed pod
// that runs the agent has not ended yet (it may still be uploading the
// earliest document: the job fails at the first pod the master stopped),
// and the grace since the terminal transition has not passed, the phase
// stays Running with a reason saying so. After that, failed pods without a document get one
// synthesized from their status. On Succeeded only the documents count
// (flytekit pods exit 0 after writing one). A document nobody could read
// is a failure of the pod that wrote it (outputreader's
// kferrors.CodeUnreadableDocument, ranked by its write time, and counted
// as that pod's document when its name carries the pod): a pod that wrote
// a document never counts as succeeded, whatever its exit code. Then the
// earliest failure (outputreader.Less) decides: a recoverable root cause
// is a retryable failure (its kind, SYSTEM or USER, on the ExecutionError),
// a non-recoverable one a permanent failure. No failure at all: Succeeded
// is a success, Failed a retryable failure with the operator's reason
// (upstream's behaviour). Documents that vanished while read (moved aside
// by an agent between the listing and the read) count for nothing, but a
// Succeeded job with such documents and no failure waits until the grace
// has passed to be read again, and then fails (UnreadableDocumentCode):
// a failed task never reads as a success.
func Phase(job Job, pods []corev1.Pod, report *outputreader.Summary, now time.Time, cfg PhaseConfig, info pluginsCore.TaskInfo) (pluginsCore.PhaseInfo, error) {
	info.OccurredAt = &now
	suspended := job.RunPolicy.Suspend != nil && *job.RunPolicy.Suspend
	if !suspended && cfg.OperatorTimeout > 0 && job.Status.StartTime == nil && len(job.Status.Conditions) == 0 &&
		!job.Meta.CreationTimestamp.IsZero() && job.Meta.CreationTimestamp.Add(cfg.OperatorTimeout).Before(now) {
		return pluginsCore.PhaseInfoUndefined, fmt.Errorf("kubeflow training operator has not updated %s %s/%s since its creation at %s",
			job.Kind, job.Meta.Namespace, job.Meta.Name, job.Meta.CreationTimestamp.UTC().Format(time.RFC3339))
	}
	cond, ok := job.CurrentCondition()
	if !ok {
		if len(job.Status.Conditions) > 0 {
			return pluginsCore.PhaseInfoUndefined, fmt.Errorf("%s %s/%s has no current condition among %d", job.Kind, job.Meta.Namespace, job.Meta.Name, len(job.Status.Conditions))
		}
		return pluginsCore.PhaseInfoQueuedWithTaskInfo(pluginsCore.DefaultPhaseVersion, "JobCreated", &info), nil
	}
	switch cond.Type {
	case kubeflowv1.JobCreated:
		return pluginsCore.PhaseInfoQueuedWithTaskInfo(pluginsCore.DefaultPhaseVersion, "JobCreated", &info), nil
	case kubeflowv1.JobSuspended:
		return pluginsCore.PhaseInfoQueuedWithTaskInfo(pluginsCore.DefaultPhaseVersion, "Suspended", &info), nil
	case kubeflowv1.JobRunning, kubeflowv1.JobRestarting:
		return pluginsCore.PhaseInfoRunning(pluginsCore.DefaultPhaseVersion, &info), nil
	case kubeflowv1.JobSucceeded, kubeflowv1.JobFailed:
		return terminalPhase(job, cond, pods, report, now, cfg, info), nil
	}
	return pluginsCore.PhaseInfoUndefined, nil
}

func terminalPhase(job Job, cond kubeflowv1.JobCondition, pods []corev1.Pod, report *outputreader.Summary, now time.Time, cfg PhaseConfig, info pluginsCore.TaskInfo) pluginsCore.PhaseInfo {
	if report == nil {
		report = &outputreader.Summary{}
	}
	// Which failed pods have a document. The job status counts failed pods
	// too; it is the only count left when the pods are gone (a clean-pod
	// policy deleted them) or could not be listed.
	//
	// On Succeeded the operator judged the pods that count: a pod that
	// failed on the way (scaled down, replaced) neither delays the answer
	// nor gets a document; documents written by the pods still decide.
	var missing []*corev1.Pod
	listedFailed, have := 0, 0
	if cond.Type == kubeflowv1.JobSucceeded {
		pods = nil
	}
	// A pod that runs the agent and has not ended may still be writing its
	// document: the job turns Failed at the first pod that exits 1 (one the
	// master stopped), while the pod that raised first may still be
	// refining its command's document, whose whole second would otherwise
	// decide (docs/DESIGN.md §3).
	writing, ended := 0, 0
	for i := range pods {
		p := &pods[i]
		switch {
		case !runsAgent(p):
		case PodFailed(p) || p.Status.Phase == corev1.PodSucceeded:
			ended++
		default:
			writing++
		}
	}
	for i := range pods {
		p := &pods[i]
		if !PodFailed(p) {
			continue
		}
		listedFailed++
		if report.HasPod(p.Name) {
			have++
		} else {
			missing = append(missing, p)
		}
	}
	expected := listedFailed
	if cond.Type == kubeflowv1.JobFailed {
		expected = max(listedFailed, job.FailedInStatus())
	}
	// Pods with documents that were not listed (deleted by a clean-pod
	// policy) count towards the status's failed pods.
	have += max(0, min(report.Pods()-have, expected-listedFailed))
	deadline := cond.LastTransitionTime.Add(cfg.LateDocumentGrace)
	if (have < expected || writing > 0) && now.Before(deadline) {
		still := ""
		if writing > 0 {
			still = fmt.Sprintf(", %d pods still running", writing)
		}
		msg := fmt.Sprintf("waiting for error documents: %d of %d failed pods have reported%s (deciding at %s at the latest)",
			have, expected, still, deadline.UTC().Format(time.RFC3339))
		info.AdditionalReasons = append(info.AdditionalReasons, pluginsCore.ReasonInfo{Reason: msg, OccurredAt: &now})
		// A new version per arriving document or ended pod, so propeller
		// records it.
		return pluginsCore.PhaseInfoRunning(pluginsCore.DefaultPhaseVersion+uint32(have+ended)+1, &info)
	}
	var synthesized []kferrors.Failure
	primary := primaryContainer(job.Kind)
	for _, p := range missing {
		if f, ok := Synthesize(p, primary, cond.LastTransitionTime.Time); ok {
			synthesized = append(synthesized, f)
		}
	}
	ee := flyteio.ExecutionError(report.Merge(synthesized...))
	if ee == nil {
		if cond.Type == kubeflowv1.JobSucceeded && report.Skipped == 0 {
			return pluginsCore.PhaseInfoSuccess(&info)
		}
		if cond.Type == kubeflowv1.JobSucceeded {
			// Every skipped document vanished while read (a document
			// nobody could read would be the root cause): read again
			// until the grace has passed, then fail with what is known.
			// A failed task never reads as a success.
			details := fmt.Sprintf("the job's pods exited 0, but %d error documents vanished while read: %s",
				report.Skipped, skippedText(report.SkippedSample))
			if now.Before(deadline) {
				info.AdditionalReasons = append(info.AdditionalReasons, pluginsCore.ReasonInfo{
					Reason: details + fmt.Sprintf(" (reading again, deciding at %s at the latest)", deadline.UTC().Format(time.RFC3339)), OccurredAt: &now})
				return pluginsCore.PhaseInfoRunning(pluginsCore.DefaultPhaseVersion+1, &info)
			}
			return pluginsCore.PhaseInfoFailure(UnreadableDocumentCode, details, &info)
		}
		details := fmt.Sprintf("Job failed:\n\t%v - %v", cond.Reason, cond.Message)
		if n := report.Skipped; n > 0 {
			details += fmt.Sprintf("\n\t%d error documents vanished while read", n)
		}
		return pluginsCore.PhaseInfoRetryableFailure(string(flyteerr.DownstreamSystemError), details, &info)
	}
	phase := pluginsCore.PhasePermanentFailure
	if ee.IsRecoverable {
		phase = pluginsCore.PhaseRetryableFailure
	}
	return pluginsCore.PhaseInfoFailed(phase, ee.ExecutionError, &info)
}

// runsAgent reports whether p runs kfelastic's agent (an elastic job's
// worker: the agent's install container), which uploads the pod's document
// before it exits.
func runsAgent(p *corev1.Pod) bool {
	for _, c := range p.Spec.InitContainers {
		if c.Name == initContainer {
			return true
		}
	}
	return false
}

// UnreadableDocumentCode is the failure of a document nobody could read
// (outputreader makes it the failure of the pod that wrote it), and of a
// job that succeeded by its pods' exit codes but whose error documents
// vanished while read until the grace passed.
const UnreadableDocumentCode = kferrors.CodeUnreadableDocument

// skippedText names the skipped documents and why each was skipped.
func skippedText(sample []outputreader.Skipped) string {
	parts := make([]string, 0, len(sample))
	for _, s := range sample {
		parts = append(parts, fmt.Sprintf("%s (%v)", s.Key, s.Err))
	}
	return strings.Join(parts, "; ")
}

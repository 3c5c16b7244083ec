// Package flytekitdoc builds error documents shaped exactly as flytekit's
// pyflyte-execute writes them for a failed Elastic task (flytekit 1.16:
// flytekit/bin/entrypoint.py, _dispatch_execute and get_traceback_str;
// flytekitplugins-kfpytorch's PytorchElasticFunctionTask._execute), for the
// tests of the agent, the reader and the report. The stand-in
// testdata/flytekit/elastic_task.py writes the same from real torch.
package flytekitdoc

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"
	"time"

	kferrors "github.com/kfelastic/kfelastic/errors"
)

// Code is flytekit's code for what a task raised, whatever the worker
// raised: FlyteUserRuntimeException's.
const Code = "USER:RuntimeError"

// Failure is one pod's document: worker = the pod name (_F_WN as given),
// code USER:RuntimeError, NON_RECOVERABLE, USER, the time torch's
// ProcessFailure.timestamp in whole seconds (nanos 0), and the message
// flytekit writes around torch's ChildFailedError: its root cause names
// the worker's error file and ends in the exception's line, excLine
// ("ValueError: batch 17 has NaN labels").
func Failure(pod, excLine, errorFile string, failed time.Time) kferrors.Failure {
	at := failed.Truncate(time.Second)
	return kferrors.UserError(Code, Message(excLine, errorFile, at), pod, at)
}

// Key is a flytekit document's name with _F_DES set: error-<uuid4 hex>.pb.
func Key() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return "error-" + hex.EncodeToString(b[:]) + ".pb"
}

// Message is flytekit's "Trace: … Message: …" around torch's failure table.
func Message(excLine, errorFile string, at time.Time) string {
	rule := strings.Repeat("=", 60)
	dash := strings.Repeat("-", 60)
	table := fmt.Sprintf(`
%[1]s
run_task FAILED
%[2]s
Failures:
  <NO_OTHER_FAILURES>
%[2]s
Root Cause (first observed failure):
[0]:
  time      : %[3]s
  host      : pod
  rank      : 1 (local_rank: 0)
  exitcode  : 1 (pid: 4242)
  error_file: %[4]s
  traceback : Traceback (most recent call last):
    File "/usr/lib/python3/dist-packages/torch/distributed/elastic/multiprocessing/errors/__init__.py", line 346, in wrapper
      return f(*args, **kwargs)
    File "/app/train.py", line 17, in train
      raise exc
  %[5]s

%[1]s`, rule, dash, at.UTC().Format("2006-01-02_15:04:05"), errorFile, excLine)
	trace := `Traceback (most recent call last):
  File "/usr/lib/python3/dist-packages/flytekitplugins/kfpytorch/task.py", line 463, in _execute
    out = elastic_launch(
  File "/usr/lib/python3/dist-packages/torch/distributed/launcher/api.py", line 246, in launch_agent
    raise ChildFailedError(
torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ` + table + `

During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "/usr/lib/python3/dist-packages/flytekitplugins/kfpytorch/task.py", line 476, in _execute
    raise FlyteUserRuntimeException(e, timestamp=first_failure.timestamp)
flytekit.exceptions.user.FlyteUserRuntimeException: USER:RuntimeError: error=` + table + "\n"
	value := "FlyteUserRuntimeException: USER:RuntimeError: error=" + table
	return "Trace:\n\n" + indent(trace) + "\nMessage:\n\n" + indent(value)
}

func indent(s string) string {
	lines := strings.SplitAfter(s, "\n")
	for i, l := range lines {
		if strings.TrimSpace(l) != "" {
			lines[i] = "    " + l
		}
	}
	return strings.Join(lines, "")
}

// TaskMessage is flytekit's message (get_traceback_str) for an exception a
// task raised outside torch's elastic launch, as a task that is not
// Elastic raises it: the exception's traceback and its "<type>: <value>",
// each indented by four spaces.
func TaskMessage(trace, value string) string {
	return "Trace:\n\n" + indent(trace) + "\nMessage:\n\n" + indent(value)
}

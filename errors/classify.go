package errors

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// RecoverableMarkerName is the file flytekit's elastic launcher creates next
// to TORCHELASTIC_ERROR_FILE when a worker raised FlyteRecoverableException.
const RecoverableMarkerName = "recoverable_error"

// Exit is what a supervisor observed of one worker's end. Classify turns it
// into a Failure; it holds no I/O so that the mapping is testable as a table.
type Exit struct {
	Worker string
	// ExitCode is the process's exit status; ignored when Signal is set.
	ExitCode int
	// Signal is the signal that ended the process, 0 if it exited.
	Signal syscall.Signal
	// ObservedAt is when the supervisor saw the exit; the fallback timestamp.
	ObservedAt time.Time
	// OOM is evidence of the kernel OOM killer (cgroup oom_kill count rose,
	// or the pod status says OOMKilled).
	OOM bool
	// Preempted means the SIGTERM came from outside (eviction, node drain,
	// preemption), not from the supervisor's own stop.
	Preempted bool
	// TorchError is the worker's parsed TORCHELASTIC_ERROR_FILE, if any.
	TorchError *TorchError
	// RecoverableMarker is true if flytekit's recoverable_error file exists.
	RecoverableMarker bool
}

// Classify maps an observed exit to a Failure following DESIGN.md §2. The
// order matters: platform causes (OOM, preemption) win over what the dying
// process managed to write, and an exception named in the error file wins
// over a bare exit status or signal.
func Classify(e Exit) Failure {
	at := e.ObservedAt
	switch {
	case e.OOM:
		return SystemFailure(CodeOOMKilled, fmt.Sprintf("worker %s was killed by the OOM killer", e.Worker), e.Worker, at)
	case e.Preempted:
		return SystemFailure(CodePreempted, fmt.Sprintf("worker %s was terminated from outside (preemption, eviction or node drain)", e.Worker), e.Worker, at)
	case e.TorchError != nil:
		te := e.TorchError
		if !te.Time.IsZero() {
			at = te.Time
		}
		msg := te.Message
		if te.Traceback != "" {
			msg = te.Traceback
		}
		if e.RecoverableMarker {
			f := UserError(CodeRecoverable, msg, e.Worker, at)
			f.Recoverable = true
			return f
		}
		return UserError(te.ExceptionType(), msg, e.Worker, at)
	case e.Signal != 0:
		name := unix.SignalName(e.Signal)
		if name == "" {
			name = "SIG" + strconv.Itoa(int(e.Signal))
		}
		return SystemFailure("Signal"+name, fmt.Sprintf("worker %s was killed by signal %d (%s)", e.Worker, int(e.Signal), name), e.Worker, at)
	case e.RecoverableMarker:
		f := UserError(CodeRecoverable, fmt.Sprintf("worker %s exited with code %d after a recoverable error", e.Worker, e.ExitCode), e.Worker, at)
		f.Recoverable = true
		return f
	default:
		return UserError(CodeNonZeroExit, fmt.Sprintf("worker %s exited with code %d", e.Worker, e.ExitCode), e.Worker, at)
	}
}

// TorchError is the content of a TORCHELASTIC_ERROR_FILE as torch's @record
// writes it: {"message": {"message": "Type: text", "extraInfo":
// {"py_callstack": "...", "timestamp": "<epoch s>"}}}, or {"message": "text"}.
type TorchError struct {
	Message   string
	Traceback string
	// Time is the error's time: torch's whole second refined by the file's
	// modification time when that falls inside the same second.
	Time time.Time
}

var exceptionType = regexp.MustCompile(`^([A-Za-z_][A-Za-z0-9_.]*)(:|$)`)

// ExceptionType is the leading "Type" of "Type: text", or "UserError".
func (t TorchError) ExceptionType() string {
	if m := exceptionType.FindStringSubmatch(t.Message); m != nil {
		return m[1]
	}
	return "UserError"
}

// ParseTorchError decodes the error file's bytes; mtime is the file's
// modification time (zero if unknown), used to refine torch's whole-second
// timestamp to sub-second precision.
func ParseTorchError(data []byte, mtime time.Time) (*TorchError, error) {
	var raw struct {
		Message json.RawMessage `json:"message"`
	}
	if err := json.Unmarshal(data, &raw); err != nil {
		return nil, fmt.Errorf("torch error file: %w", err)
	}
	if len(raw.Message) == 0 {
		return nil, fmt.Errorf("torch error file: no \"message\"")
	}
	te := &TorchError{}
	var text string
	if err := json.Unmarshal(raw.Message, &text); err == nil {
		te.Message = text
		te.Time = mtime
		return te, nil
	}
	var structured struct {
		Message   string `json:"message"`
		ExtraInfo struct {
			PyCallstack string `json:"py_callstack"`
			Timestamp   string `json:"timestamp"`
		} `json:"extraInfo"`
	}
	if err := json.Unmarshal(raw.Message, &structured); err != nil {
		return nil, fmt.Errorf("torch error file: %w", err)
	}
	te.Message = structured.Message
	te.Traceback = structured.ExtraInfo.PyCallstack
	te.Time = refineSeconds(structured.ExtraInfo.Timestamp, mtime)
	return te, nil
}

// refineSeconds combines torch's "<epoch seconds>" with the file's mtime: the
// mtime wins if it lies in [s, s+1s], the second the error was recorded in;
// otherwise (clock skew, file copied) the whole second stands.
func refineSeconds(seconds string, mtime time.Time) time.Time {
	s, err := strconv.ParseInt(seconds, 10, 64)
	if err != nil || s <= 0 {
		return mtime
	}
	whole := time.Unix(s, 0).UTC()
	if !mtime.IsZero() && !mtime.Before(whole) && mtime.Sub(whole) <= time.Second {
		return mtime.UTC()
	}
	return whole
}

// ReadTorchError reads and parses path, and reports whether flytekit's
// recoverable marker exists next to it. A missing file is (nil, false, nil).
func ReadTorchError(path string) (te *TorchError, recoverable bool, err error) {
	_, statErr := os.Stat(filepath.Join(filepath.Dir(path), RecoverableMarkerName))
	recoverable = statErr == nil
	fi, err := os.Stat(path)
	if os.IsNotExist(err) {
		return nil, recoverable, nil
	}
	if err != nil {
		return nil, recoverable, err
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, recoverable, err
	}
	te, err = ParseTorchError(data, fi.ModTime())
	return te, recoverable, err
}

package errors

import (
	"encoding/json"
	goerrors "errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// RecoverableMarkerName is the file flytekit's elastic launcher creates next
// to TORCHELASTIC_ERROR_FILE when a worker raised FlyteRecoverableException.
const RecoverableMarkerName = "recoverable_error"

// WorkerExit is what a supervisor observed of one worker's end. Classify
// turns it into a Failure; it holds no I/O so that the mapping is testable
// as a table.
type WorkerExit struct {
	Worker string
	// ExitCode is the process's exit status; ignored when Signal is set.
	ExitCode int
	// Signal is the signal that ended the process, 0 if it exited.
	Signal syscall.Signal
	// ObservedAt is when the supervisor saw the exit; the fallback timestamp.
	ObservedAt time.Time
	// StartedAt is when the worker started, zero if unknown. With
	// ObservedAt it bounds the time an error file may claim.
	StartedAt time.Time
	// OOM is evidence of the kernel OOM killer (cgroup oom_kill count rose,
	// or the pod status says OOMKilled).
	OOM bool
	// OOMSeenAt is when the supervisor first saw the cgroup's OOM-kill
	// count rise, if it watched it: the kill was no later, and the reaping
	// (ObservedAt) can come much later in a pod short of memory.
	OOMSeenAt time.Time
	// Preempted means the SIGTERM came from outside (eviction, node drain,
	// preemption), not from the supervisor's own stop.
	Preempted bool
	// TorchError is the worker's parsed TORCHELASTIC_ERROR_FILE, if any.
	TorchError *TorchError
	// RecoverableMarker is true if flytekit's recoverable_error file exists.
	RecoverableMarker bool
	// ErrorFileProblem says why the worker's error file exists but could not
	// be used (too large, not JSON, not a regular file); Classify adds it to
	// the message of a failure classified without it.
	ErrorFileProblem string
}

// Classify maps an observed exit to a Failure following docs/DESIGN.md §2.4. The
// order matters: platform causes (OOM, preemption) win over what the dying
// process managed to write, and an exception named in the error file wins
// over a bare exit status or signal.
func Classify(e WorkerExit) Failure {
	f := classify(e)
	if e.ErrorFileProblem != "" && e.TorchError == nil {
		f.Message += fmt.Sprintf(" (its error file was not usable: %s)", e.ErrorFileProblem)
	}
	return f
}

func classify(e WorkerExit) Failure {
	at := e.ObservedAt
	switch {
	case e.OOM:
		if !e.OOMSeenAt.IsZero() && e.OOMSeenAt.Before(at) && e.plausible(e.OOMSeenAt) {
			at = e.OOMSeenAt
		}
		return SystemFailure(CodeOOMKilled, fmt.Sprintf("worker %s was killed by the OOM killer", e.Worker), e.Worker, at)
	case e.Preempted:
		return SystemFailure(CodePreempted, fmt.Sprintf("worker %s was terminated from outside (preemption, eviction or node drain)", e.Worker), e.Worker, at)
	case e.TorchError != nil:
		te := e.TorchError
		if e.plausible(te.Time) {
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
		// A known text (an ECC error, NCCL's watchdog) says more than the
		// exception's type.
		return Recognize(UserError(te.ExceptionType(), msg, e.Worker, at))
	case e.Signal != 0:
		return SystemFailure(SignalCode(e.Signal), fmt.Sprintf("worker %s was killed by signal %d (%s)", e.Worker, int(e.Signal), SignalName(e.Signal)), e.Worker, at)
	case e.RecoverableMarker:
		f := UserError(CodeRecoverable, fmt.Sprintf("worker %s exited with code %d after a recoverable error", e.Worker, e.ExitCode), e.Worker, at)
		f.Recoverable = true
		return f
	default:
		return UserError(CodeNonZeroExit, fmt.Sprintf("worker %s exited with code %d", e.Worker, e.ExitCode), e.Worker, at)
	}
}

// plausible reports whether an error file's time can be the failure's: it
// is usable and lies in the worker's life, [StartedAt, ObservedAt], give or
// take the second torch truncates to. Anything else (milliseconds taken for
// seconds, a file copied from another run, a clock that jumped) gives way to
// the observed exit time, as a missing time does.
func (e WorkerExit) plausible(t time.Time) bool {
	const slack = time.Second
	return UsableTime(t) &&
		(e.StartedAt.IsZero() || !t.Before(e.StartedAt.Add(-slack))) &&
		(e.ObservedAt.IsZero() || !t.After(e.ObservedAt.Add(slack)))
}

// TorchError is the content of a TORCHELASTIC_ERROR_FILE as torch's @record
// writes it: {"message": {"message": "Type: text", "extraInfo":
// {"py_callstack": "...", "timestamp": "<epoch s>"}}}, or {"message": "text"}.
type TorchError struct {
	Message   string
	Traceback string
	// Time is the error's time: torch's whole second refined by the file's
	// modification time when that falls inside the same second, or the
	// second's last nanosecond when the file was written within the next
	// (see refineSeconds).
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
		return nil, fmt.Errorf("torch error file: %w", jsonProblem(err))
	}
	if len(raw.Message) == 0 {
		return nil, fmt.Errorf("torch error file: no \"message\"")
	}
	te := &TorchError{}
	var text string
	if err := json.Unmarshal(raw.Message, &text); err == nil {
		te.Message = text
		te.Time = refineSeconds(time.Time{}, mtime)
		return te, nil
	}
	var structured struct {
		Message   string `json:"message"`
		ExtraInfo struct {
			PyCallstack string `json:"py_callstack"`
			// A string as torch writes it; a number is taken too. Any other
			// type, or none, counts as no time rather than a bad file.
			Timestamp json.RawMessage `json:"timestamp"`
		} `json:"extraInfo"`
	}
	if err := json.Unmarshal(raw.Message, &structured); err != nil {
		return nil, fmt.Errorf("torch error file: %w", jsonProblem(err))
	}
	te.Message = structured.Message
	te.Traceback = structured.ExtraInfo.PyCallstack
	te.Time = refineSeconds(epochSeconds(structured.ExtraInfo.Timestamp), mtime)
	return te, nil
}

// errNotJSON is a syntax error of an error file, said without its text:
// encoding/json quotes the offending character, and a file that is not
// torch's may hold anything.
var errNotJSON = goerrors.New("not JSON")

// jsonProblem is err without the content it quotes.
func jsonProblem(err error) error {
	var se *json.SyntaxError
	if goerrors.As(err, &se) {
		return fmt.Errorf("%w (syntax error at byte %d)", errNotJSON, se.Offset)
	}
	return err
}

// epochSeconds reads torch's "timestamp": "<epoch seconds>" (or a bare
// number, or a fraction) as a time; zero if it is none or not usable, e.g.
// milliseconds, which would lie beyond the year 58000.
func epochSeconds(raw json.RawMessage) time.Time {
	var text string
	if json.Unmarshal(raw, &text) != nil {
		text = string(raw)
	}
	s, err := strconv.ParseFloat(strings.TrimSpace(text), 64)
	// Checked before the conversion: a float beyond int64 has no defined
	// integer value.
	if err != nil || math.IsNaN(s) || s < float64(EarliestUsableTime.Unix()) || s > float64(LatestUsableTime.Unix()) {
		return time.Time{}
	}
	whole, frac := math.Modf(s)
	return time.Unix(int64(whole), int64(frac*1e9)).UTC()
}

// refineSeconds combines torch's time (whole seconds) with the file's mtime:
// the mtime wins if it lies in [t, t+1s], the second the error was recorded
// in. An mtime within the next second is a file written just after the
// recorded second ended (an exception at its very end): the failure was in
// that second and before the write, so the second's last nanosecond is its
// tightest bound, never the second's start, up to a second earlier than the
// truth, which would rank it before a peer's real earlier failure (the
// property test of the whole chain, agent/refine/chain_test.go, found that). An
// mtime further off (clock skew, file copied) is not trusted: torch's time
// stands. Without a usable torch time the usable mtime stands in, else
// zero.
func refineSeconds(whole, mtime time.Time) time.Time {
	if !UsableTime(mtime) {
		mtime = time.Time{}
	}
	if whole.IsZero() {
		return mtime.UTC()
	}
	switch {
	case mtime.IsZero() || mtime.Before(whole):
	case mtime.Sub(whole) <= time.Second:
		return mtime.UTC()
	case mtime.Sub(whole) <= 2*time.Second:
		return whole.Add(time.Second - time.Nanosecond)
	}
	return whole
}

// MaxTorchErrorBytes bounds what ReadTorchError reads of an error file. A
// traceback is kilobytes; a worker that wrote hundreds of megabytes there
// must not take the supervisor's memory with it (the document's message is
// capped to DefaultMessageCap anyway).
const MaxTorchErrorBytes = 4 << 20

// ReadTorchError reads and parses path, and reports whether flytekit's
// recoverable marker exists next to it. A missing file is (nil, false, nil).
// It reads only a regular file, without blocking (a FIFO left there by the
// worker is refused, not waited on), and at most MaxTorchErrorBytes of it:
// a larger one is an error wrapping ErrTooLarge. A symbolic link is not
// followed: the supervisor would read, and put in a document, a file the
// worker chose (a link to /etc/shadow was read, and its first byte quoted).
func ReadTorchError(path string) (te *TorchError, recoverable bool, err error) {
	_, statErr := os.Stat(filepath.Join(filepath.Dir(path), RecoverableMarkerName))
	recoverable = statErr == nil
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOFOLLOW, 0)
	if os.IsNotExist(err) {
		return nil, recoverable, nil
	}
	if goerrors.Is(err, syscall.ELOOP) {
		return nil, recoverable, fmt.Errorf("torch error file %s: a symbolic link, not followed", path)
	}
	if err != nil {
		return nil, recoverable, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, recoverable, err
	}
	if !fi.Mode().IsRegular() {
		return nil, recoverable, fmt.Errorf("torch error file %s: not a regular file (%s)", path, fi.Mode().Type())
	}
	if fi.Size() > MaxTorchErrorBytes {
		return nil, recoverable, fmt.Errorf("torch error file %s: %w: %d bytes, limit %d", path, ErrTooLarge, fi.Size(), MaxTorchErrorBytes)
	}
	// The size can grow between Stat and read: the limit holds regardless.
	data, err := io.ReadAll(io.LimitReader(f, MaxTorchErrorBytes+1))
	if err != nil {
		return nil, recoverable, err
	}
	if len(data) > MaxTorchErrorBytes {
		return nil, recoverable, fmt.Errorf("torch error file %s: %w: over %d bytes", path, ErrTooLarge, MaxTorchErrorBytes)
	}
	te, err = ParseTorchError(data, fi.ModTime())
	return te, recoverable, err
}

package errors

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/flyteorg/flyte/flyteidl/gen/pb-go/flyteidl/core"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// The failure codes of kfelastic, declared here and nowhere else: the
// agent, the master, the plugin and the local engine all speak this
// vocabulary (docs/DESIGN.md §2.4). User exceptions carry their exception type
// instead; a signal carries SignalCode's Signal<NAME>.
const (
	// Codes a supervisor recognises without the worker's help.
	CodeOOMKilled         = "OOMKilled"
	CodePreempted         = "Preempted"
	CodeNodeCheckFailed   = "NodeCheckFailed"
	CodeStraggler         = "Straggler"
	CodeRendezvousTimeout = "RendezvousTimeout"
	CodeHang              = "Hang"
	// CodeAuthenticationFailed: the master refused the pod's job token
	// (NON_RECOVERABLE, SYSTEM: the deployment gave the pod a token the
	// master does not hold; no retry fixes it).
	CodeAuthenticationFailed = "AuthenticationFailed"
	// CodeNodeRefused: the master refused the pod's own description of
	// itself (its rank outside --nnodes, a name or address too long), at
	// its join or on a heartbeat (NON_RECOVERABLE, SYSTEM: the pod would
	// describe itself the same way after any restart).
	CodeNodeRefused = "NodeRefused"
	// CodeRecoverable is flytekit's code for FlyteRecoverableException.
	CodeRecoverable = "USER:Recoverable"
	// CodeNonZeroExit is used for a worker that exited non-zero and left no
	// error file naming an exception.
	CodeNonZeroExit = "NonZeroExit"
	// CodeStartFailed: a worker's program or script does not exist or
	// cannot be read, so it was not started (NON_RECOVERABLE, USER).
	CodeStartFailed = "StartFailed"

	// Codes read from a dead pod's status (ClassifyPod).
	CodeEvicted  = "Evicted"
	CodeNodeLost = "NodeLost"
	// CodeDeadlineExceeded: the pod outlived its activeDeadlineSeconds.
	CodeDeadlineExceeded = "DeadlineExceeded"

	// Codes the master gives a node it excludes.
	CodeJobStopped = "JobStopped"
	// CodeReplaced: the node's rank is held by another pod now.
	CodeReplaced = "Replaced"
	// CodeRankHeld: a replacement pod waited the pend timeout for its rank,
	// and the pod it was to replace still held it (alive, calling).
	CodeRankHeld = "RankHeld"
	// CodeJobSucceeded: the job's workers succeeded while this node waited
	// for a round; it has nothing left to do (torch: RendezvousClosedError).
	CodeJobSucceeded = "JobSucceeded"
	// CodeRendezvousClosed: a member of the latest round joined again to
	// restart its workers after another node's workers succeeded; no round
	// can form any more (torch: RendezvousClosedError). The agent documents
	// its workers' own error instead when they failed.
	CodeRendezvousClosed = "RendezvousClosed"
)

// signalCodePrefix heads the code of a death by signal: SignalSIGSEGV.
const signalCodePrefix = "Signal"

// SignalName is the Linux name of a signal (golang.org/x/sys/unix's
// SignalName: SIGKILL), or SIG<n> for one it does not name (the real-time
// signals SIGRTMIN…SIGRTMAX, 34–64).
func SignalName(sig syscall.Signal) string {
	if name := unix.SignalName(sig); name != "" {
		return name
	}
	return "SIG" + strconv.Itoa(int(sig))
}

// SignalCode is the failure code of a death by sig: Signal<NAME>, e.g.
// SignalSIGSEGV. (A SIGTERM from outside is CodePreempted instead, and an
// OOM kill CodeOOMKilled; the callers that know tell them apart.)
func SignalCode(sig syscall.Signal) string { return signalCodePrefix + SignalName(sig) }

// signalOfCode is SignalCode's inverse: the signal a Signal<NAME> code
// names, 0 if code names none.
func signalOfCode(code string) syscall.Signal {
	name, ok := strings.CutPrefix(code, signalCodePrefix)
	if !ok {
		return 0
	}
	if sig := unix.SignalNum(name); sig != 0 {
		return sig
	}
	if n, err := strconv.Atoi(strings.TrimPrefix(name, "SIG")); err == nil && strings.HasPrefix(name, "SIG") && n > 0 && n <= maxSignal {
		return syscall.Signal(n)
	}
	return 0
}

// DefaultMessageCap is the message size, in bytes, documents are capped to
// unless a caller asks for another; flytekit tracebacks rarely exceed it.
const DefaultMessageCap = 64 << 10

// Failure is one pod's (or worker's) failure, as the document carries it.
// The zero Time means "unknown", never 1970; so does any time UsableTime
// refuses, which Document leaves out and FromDocument reads as zero.
type Failure struct {
	Code        string
	Message     string
	Recoverable bool
	// Origin is USER or SYSTEM (flyteidl's ExecutionError.ErrorKind).
	Origin core.ExecutionError_ErrorKind
	Time   time.Time
	Worker string
}

// UserError is a failure of the user's code that a retry will not fix.
func UserError(code, message, worker string, at time.Time) Failure {
	return Failure{Code: code, Message: message, Origin: core.ExecutionError_USER, Time: at, Worker: worker}
}

// SystemFailure is a recoverable failure caused by the platform (node,
// network, scheduler), which a retry elsewhere can fix.
func SystemFailure(code, message, worker string, at time.Time) Failure {
	return Failure{Code: code, Message: message, Recoverable: true, Origin: core.ExecutionError_SYSTEM, Time: at, Worker: worker}
}

// Kind is the document's recoverability.
func (f Failure) Kind() core.ContainerError_Kind {
	if f.Recoverable {
		return core.ContainerError_RECOVERABLE
	}
	return core.ContainerError_NON_RECOVERABLE
}

// Document returns the failure as the wire document, its message capped to
// maxMessage bytes (DefaultMessageCap when ≤ 0).
func (f Failure) Document(maxMessage int) *core.ErrorDocument {
	if maxMessage <= 0 {
		maxMessage = DefaultMessageCap
	}
	ce := &core.ContainerError{
		Code:    ValidUTF8(f.Code),
		Message: CapMessage(f.Message, maxMessage),
		Kind:    f.Kind(),
		Origin:  f.Origin,
		Worker:  ValidUTF8(f.Worker),
	}
	if UsableTime(f.Time) {
		ce.Timestamp = timestamppb.New(f.Time)
	}
	return &core.ErrorDocument{Error: ce}
}

// The range of times a failure can carry: from 2000-01-01 (no failure of
// this system is older, and a clock that was never set reads 1970 plus the
// uptime) to the last nanosecond an int64 counts from the epoch (our keys
// carry the time as 19-digit nanoseconds; time.Time.UnixNano is undefined
// beyond it).
var (
	EarliestUsableTime = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)
	LatestUsableTime   = time.Unix(0, math.MaxInt64).UTC()
)

// UsableTime reports whether t can rank a failure: it lies within
// [EarliestUsableTime, LatestUsableTime]. Everything else — the zero Time, a
// present but empty protobuf Timestamp (which decodes as exactly 1970), a
// negative one, milliseconds mistaken for seconds (year 58000) — means
// "unknown" and is replaced by an observed time, never ranked as 1970.
func UsableTime(t time.Time) bool {
	return !t.Before(EarliestUsableTime) && !t.After(LatestUsableTime)
}

// FromDocument is the inverse of Document. A document without a usable
// timestamp — absent, present but empty or zero, invalid (nanos out of
// range), or outside UsableTime — gives a zero Time, and the rest of the
// document stands: the caller decides what time stands in for it (the
// object's modification time, docs/DESIGN.md §3), never 1970.
func FromDocument(doc *core.ErrorDocument) (Failure, error) {
	ce := doc.GetError()
	if ce == nil {
		return Failure{}, fmt.Errorf("%w: document has no error", ErrMissingError)
	}
	f := Failure{
		Code:        ce.GetCode(),
		Message:     ce.GetMessage(),
		Recoverable: ce.GetKind() == core.ContainerError_RECOVERABLE,
		Origin:      ce.GetOrigin(),
		Worker:      ce.GetWorker(),
	}
	if ts := ce.GetTimestamp(); ts != nil && ts.CheckValid() == nil {
		if t := ts.AsTime(); UsableTime(t) {
			f.Time = t
		}
	}
	return f, nil
}

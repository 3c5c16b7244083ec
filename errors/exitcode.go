package errors

import (
	"syscall"
)

// The exit-code contract of the agent, in both directions: ExitCode says
// how the agent exits for its pod's root cause, CodeOfExit reads an exit
// status back (the local engine naming its agents' exits, ClassifyPod a
// pod that left no document).
//
// The training operator's ExitCode restart policy restarts a pod iff its
// exit code is ≥ 128 (training-operator pkg/util/train.IsRetryableExitCode),
// so every recoverable cause exits ≥ 128 and every permanent one exits 1.
// The agent's own causes lie above 128+maxSignal, so that they are never
// mistaken for "killed by signal N".
const (
	ExitNodeCheckFailed   = 200
	ExitStraggler         = 201
	ExitRendezvousTimeout = 202
	ExitHang              = 203
	ExitRecoverable       = 204 // flytekit's FlyteRecoverableException, other recoverable causes
)

// maxSignal is the highest signal number on Linux (SIGRTMAX): 128+N for
// N in 1…maxSignal (129–192) is how a shell or a container runtime
// reports death by signal N.
const maxSignal = 64

// agentExits names the agent's own exit statuses.
var agentExits = map[int]string{
	ExitNodeCheckFailed:   CodeNodeCheckFailed,
	ExitStraggler:         CodeStraggler,
	ExitRendezvousTimeout: CodeRendezvousTimeout,
	ExitHang:              CodeHang,
	ExitRecoverable:       CodeRecoverable,
}

// ExitCode maps the pod's root cause to the agent's exit status:
//
//	no failure (zero Failure)         0
//	permanent (NON_RECOVERABLE)       1    (AuthenticationFailed among them)
//	Preempted                         143  (128+SIGTERM, as a SIGTERMed process)
//	OOMKilled                         137  (128+SIGKILL, as the kubelet reports it)
//	Signal<NAME>                      128+signal number
//	NodeCheckFailed                   200
//	Straggler                         201
//	RendezvousTimeout                 202
//	Hang                              203
//	other recoverable                 204
func ExitCode(f Failure) int {
	if f == (Failure{}) {
		return 0
	}
	if !f.Recoverable {
		return 1
	}
	switch f.Code {
	case CodePreempted:
		return 128 + int(syscall.SIGTERM)
	case CodeOOMKilled:
		return 128 + int(syscall.SIGKILL)
	}
	for status, code := range agentExits {
		if code == f.Code && status != ExitRecoverable {
			return status
		}
	}
	if sig := signalOfCode(f.Code); sig != 0 {
		return 128 + int(sig)
	}
	return ExitRecoverable
}

// CodeOfExit is ExitCode's inverse: the failure code an exit status stands
// for, "" for 0. Decided once for every reader of exit statuses:
//   - 200–204 are the agent's own causes and read back as their codes
//     (NodeCheckFailed, Straggler, RendezvousTimeout, Hang, and
//     USER:Recoverable for 204), never as signals;
//   - 129–192 is 128+N for N a Linux signal: SIGTERM (143) is Preempted
//     (the agent's own exit for it, and a container SIGTERMed from outside),
//     any other N is Signal<NAME>; 137 reads as SignalSIGKILL, since only
//     the runtime's word (reason OOMKilled) or the cgroup tells an OOM kill
//     from any other SIGKILL;
//   - everything else, 1–128 and 193–255 but for the agent's, is the
//     user's NonZeroExit.
func CodeOfExit(status int) string {
	switch {
	case status == 0:
		return ""
	case status > 128 && status <= 128+maxSignal:
		if sig := syscall.Signal(status - 128); sig != syscall.SIGTERM {
			return SignalCode(sig)
		}
		return CodePreempted
	}
	if code, ok := agentExits[status]; ok {
		return code
	}
	return CodeNonZeroExit
}

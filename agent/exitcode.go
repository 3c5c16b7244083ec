package agent

import (
	"strings"

	kferrors "github.com/kfelastic/kfelastic/errors"
	"golang.org/x/sys/unix"
)

// Exit codes of the agent for causes that are not a signal. They lie above
// 128+64 so that they are never mistaken for "killed by signal N".
const (
	ExitNodeCheckFailed   = 200
	ExitStraggler         = 201
	ExitRendezvousTimeout = 202
	ExitHang              = 203
	ExitRecoverable       = 204 // flytekit's FlyteRecoverableException, other recoverable causes
)

// ExitCode maps the pod's root cause to the agent's exit status. The
// training operator's ExitCode restart policy restarts a pod iff its exit
// code is ≥ 128 (training-operator pkg/util/train.IsRetryableExitCode), so
// every recoverable cause exits ≥ 128 and every permanent one exits 1:
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
func ExitCode(f kferrors.Failure) int {
	if f == (kferrors.Failure{}) {
		return 0
	}
	if !f.Recoverable {
		return 1
	}
	switch f.Code {
	case kferrors.CodePreempted:
		return 128 + int(unix.SIGTERM)
	case kferrors.CodeOOMKilled:
		return 128 + int(unix.SIGKILL)
	case kferrors.CodeNodeCheckFailed:
		return ExitNodeCheckFailed
	case kferrors.CodeStraggler:
		return ExitStraggler
	case kferrors.CodeRendezvousTimeout:
		return ExitRendezvousTimeout
	case kferrors.CodeHang:
		return ExitHang
	}
	if name, ok := strings.CutPrefix(f.Code, "Signal"); ok {
		if sig := unix.SignalNum(name); sig != 0 {
			return 128 + int(sig)
		}
	}
	return ExitRecoverable
}

package errors_test

import (
	"strings"
	"syscall"
	"testing"
	"time"

	kferrors "github.com/kfelastic/kfelastic/errors"
)

// TestExitCode is the mapping documented on ExitCode, with the training
// operator's rule (retryable iff ≥ 128) checked on every row, and its
// inverse CodeOfExit read back where the status names one code.
func TestExitCode(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, tc := range []struct {
		f    kferrors.Failure
		want int
		back string // CodeOfExit(want)
	}{
		{kferrors.Failure{}, 0, ""},
		{kferrors.UserError("RuntimeError", "boom", "p/0", now), 1, kferrors.CodeNonZeroExit},
		{kferrors.UserError(kferrors.CodeNonZeroExit, "exit 3", "p/0", now), 1, kferrors.CodeNonZeroExit},
		{kferrors.Classify(kferrors.WorkerExit{Worker: "p/0", ExitCode: 1, RecoverableMarker: true}), kferrors.ExitRecoverable, kferrors.CodeRecoverable},
		{kferrors.SystemFailure(kferrors.CodePreempted, "", "p", now), 143, kferrors.CodePreempted},
		{kferrors.SystemFailure(kferrors.CodeOOMKilled, "", "p/0", now), 137, "SignalSIGKILL"},
		{kferrors.Classify(kferrors.WorkerExit{Worker: "p/0", Signal: syscall.SIGKILL}), 137, "SignalSIGKILL"},
		{kferrors.Classify(kferrors.WorkerExit{Worker: "p/0", Signal: syscall.SIGSEGV}), 139, "SignalSIGSEGV"},
		{kferrors.Classify(kferrors.WorkerExit{Worker: "p/0", Signal: syscall.SIGABRT}), 134, "SignalSIGABRT"},
		{kferrors.Classify(kferrors.WorkerExit{Worker: "p/0", Signal: syscall.Signal(34)}), 162, "SignalSIG34"},
		{kferrors.SystemFailure(kferrors.CodeNodeCheckFailed, "", "p", now), kferrors.ExitNodeCheckFailed, kferrors.CodeNodeCheckFailed},
		{kferrors.SystemFailure(kferrors.CodeStraggler, "", "p", now), kferrors.ExitStraggler, kferrors.CodeStraggler},
		{kferrors.SystemFailure(kferrors.CodeRendezvousTimeout, "", "p", now), kferrors.ExitRendezvousTimeout, kferrors.CodeRendezvousTimeout},
		{kferrors.SystemFailure(kferrors.CodeHang, "", "p/0", now), kferrors.ExitHang, kferrors.CodeHang},
		{kferrors.SystemFailure("SomethingNew", "", "p", now), kferrors.ExitRecoverable, kferrors.CodeRecoverable},
	} {
		got := kferrors.ExitCode(tc.f)
		if got != tc.want {
			t.Errorf("ExitCode(%s recoverable=%t) = %d, want %d", tc.f.Code, tc.f.Recoverable, got, tc.want)
		}
		if tc.f.Code != "" && (got >= 128) != tc.f.Recoverable {
			t.Errorf("ExitCode(%s): %d, but recoverable=%t (operator retries iff ≥ 128)", tc.f.Code, got, tc.f.Recoverable)
		}
		if back := kferrors.CodeOfExit(tc.want); back != tc.back {
			t.Errorf("CodeOfExit(%d) = %q, want %q", tc.want, back, tc.back)
		}
	}
}

// The statuses that are neither the agent's nor 128+signal are the user's;
// 129–192 are signals and never NonZeroExit.
func TestCodeOfExitRanges(t *testing.T) {
	for status := 1; status < 256; status++ {
		code := kferrors.CodeOfExit(status)
		switch {
		case status > 128 && status <= 192:
			if code == kferrors.CodeNonZeroExit {
				t.Errorf("CodeOfExit(%d) = %s, want a signal", status, code)
			}
		case status >= kferrors.ExitNodeCheckFailed && status <= kferrors.ExitRecoverable:
			if code == kferrors.CodeNonZeroExit || strings.HasPrefix(code, "Signal") {
				t.Errorf("CodeOfExit(%d) = %s, want the agent's code", status, code)
			}
		default:
			if code != kferrors.CodeNonZeroExit {
				t.Errorf("CodeOfExit(%d) = %s, want %s", status, code, kferrors.CodeNonZeroExit)
			}
		}
	}
}

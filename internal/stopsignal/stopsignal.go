// Package stopsignal turns the signals that stop the binary (SIGTERM,
// SIGINT, SIGHUP, SIGQUIT) into the cause of a context, so that the agent
// tells a preemption from an interruption and `kfelastic local` exits
// 128+N as a shell would.
package stopsignal

import (
	"context"
	goerrors "errors"
	"os"
	"os/signal"
	"syscall"

	"golang.org/x/sys/unix"
)

// What each signal to the agent does (README, "Signals"):
//
//	SIGTERM           preemption: --dump-signal to the workers and
//	                  --dump-timeout, then SIGTERM, --stop-grace, SIGKILL;
//	                  a Preempted document (recoverable), exit 143.
//	SIGINT, SIGHUP,   a person or a session ends the run (Ctrl-C, a closed
//	SIGQUIT           terminal, Ctrl-\): no dump; SIGTERM, --stop-grace,
//	                  SIGKILL; a Signal<NAME> document (recoverable,
//	                  SYSTEM), exit 128+N (130, 129, 131).
//	the same again    ignored: the stop under way is bounded (dump timeout
//	                  plus stop grace); SIGKILL ends the agent at once.
//	SIGPIPE           ignored: a closed stdout or stderr is given up
//	                  (internal/nonblocking), training goes on.
//	SIGUSR1, SIGUSR2, ignored (Go's default for them).
//	others Go ignores
//	SIGKILL           cannot be caught: the workers die with the agent
//	                  (their parent-death signal) and the guardian kills
//	                  whatever they started (agent/guardian); no
//	                  document, the pod's status says 137.
//
// Crash signals (SIGSEGV, SIGABRT, …) keep Go's default, a stack dump; the
// guardian cleans up after them as after SIGKILL.
var stopSignals = []os.Signal{syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT}

// Signaled is the cancellation cause NotifyContext gives its context: the
// agent's Run reads it to tell a preemption (SIGTERM) from an interruption.
type Signaled struct{ Signal syscall.Signal }

func (s Signaled) Error() string { return "got " + unix.SignalName(s.Signal) }

// NotifyContext returns a context canceled with cause Signaled when the
// process gets one of the stop signals (SIGTERM, SIGINT, SIGHUP, SIGQUIT).
// Later stop signals are caught and dropped, so that a second Ctrl-C does
// not kill the agent in the middle of its stop; stop releases them.
func NotifyContext(parent context.Context) (ctx context.Context, stop context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(parent)
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, stopSignals...)
	go func() {
		select {
		case s := <-ch:
			cancel(Signaled{Signal: s.(syscall.Signal)})
		case <-ctx.Done():
		}
	}()
	return ctx, func() {
		signal.Stop(ch)
		cancel(context.Canceled)
	}
}

// Of is the signal that ended ctx: its Signaled cause, else SIGTERM (a
// context canceled otherwise, as the local engine and tests stop an agent,
// is a preemption).
func Of(ctx context.Context) syscall.Signal {
	var s Signaled
	if goerrors.As(context.Cause(ctx), &s) && s.Signal != 0 {
		return s.Signal
	}
	return syscall.SIGTERM
}

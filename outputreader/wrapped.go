package outputreader

import (
	"regexp"
	"strings"
)

// flytekit writes the documents of an Elastic task's failures itself
// (pyflyte-execute, docs/DESIGN.md §4.4): torch's ChildFailedError wrapped in
// FlyteUserRuntimeException, whose code is "USER:RuntimeError" whatever the
// worker raised (or, for a FlyteRecoverableException, that class's
// "RecoverableFlyteException"), and whose message is flytekit's
// "Trace: … Message: …" around torch's failure table. The exception that
// users raised is in the table's root cause, the last line of its
// traceback:
//
//	Root Cause (first observed failure):
//	[0]:
//	  time      : 2026-11-25_21:33:00
//	  …
//	  error_file: /tmp/torchelastic_…/attempt_0/1/error.json
//	  traceback : Traceback (most recent call last):
//	    …
//	  ValueError: batch 17 has NaN labels
//	=====
//
// or, for a worker killed by a signal, "traceback : Signal 9 (SIGKILL)
// received by PID 1234".

// flytekitWrapperCodes are the codes flytekit gives torch's failure.
var flytekitWrapperCodes = map[string]bool{"USER:RuntimeError": true, "RecoverableFlyteException": true}

var (
	pythonException = regexp.MustCompile(`^([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)(?::|$)`)
	torchSignal     = regexp.MustCompile(`^Signal \d+ \((SIG[A-Z0-9]+)\) received by PID \d+`)
)

// maxWrappedScan bounds how much of a message is searched for the root
// cause: torch's table comes early in flytekit's message; a hostile
// megabyte is not scanned twice.
const maxWrappedScan = 64 << 10

// WrappedException is the exception a flytekit document's wrapper code
// stands for: its class name as the code users expect (ValueError, the last
// part of a dotted name; Signal<NAME> for a worker killed by a signal) and
// its line ("ValueError: batch 17 has NaN labels"). ok is false for any
// other code or message, whose code is shown as it is.
func WrappedException(code, message string) (exception, line string, ok bool) {
	if !flytekitWrapperCodes[code] {
		return "", "", false
	}
	if len(message) > maxWrappedScan {
		message = message[:maxWrappedScan]
	}
	_, rest, found := strings.Cut(message, "Root Cause (first observed failure):")
	if !found {
		return "", "", false
	}
	_, tb, found := strings.Cut(rest, "traceback :")
	if !found {
		return "", "", false
	}
	if i := strings.Index(tb, "====="); i >= 0 {
		tb = tb[:i]
	}
	lines := strings.Split(tb, "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		l := strings.TrimSpace(lines[i])
		if l == "" {
			continue
		}
		if m := torchSignal.FindStringSubmatch(l); m != nil {
			return "Signal" + m[1], l, true
		}
		m := pythonException.FindStringSubmatch(l)
		if m == nil || strings.HasPrefix(l, "File ") {
			return "", "", false
		}
		name := m[1]
		if j := strings.LastIndexByte(name, '.'); j >= 0 {
			name = name[j+1:]
		}
		return name, l, true
	}
	return "", "", false
}

// Shown is a document's code and message as people read them: for a
// flytekit wrapper code, the exception it stands for (WrappedException) and
// that exception's line before flytekit's message ("ValueError: batch 17
// has NaN labels", a blank line, "Trace: …"); any other code and message as
// they are. The document itself, and the retry decision, keep flytekit's
// code.
func Shown(code, message string) (string, string) {
	if exc, line, ok := WrappedException(code, message); ok {
		return exc, line + "\n\n" + message
	}
	return code, message
}

// shownCode is the code a document is counted under in the tally (Shown).
func shownCode(d Document) string {
	if d.Exception != "" {
		return d.Exception
	}
	code, _ := Shown(d.Failure.Code, d.Failure.Message)
	return code
}

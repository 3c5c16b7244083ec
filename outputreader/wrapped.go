package outputreader

import (
	"regexp"
	"strings"

	kferrors "github.com/kfelastic/kfelastic/errors"
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
//
// flytekit's message (get_traceback_str) ends in a "Message:" section, the
// value it wrapped, indented:
//
//	Trace:
//
//	    Traceback (most recent call last):
//	      …
//	    ValueError: loss is NaN
//
//	Message:
//
//	    ValueError: loss is NaN
//
// That value is the exception when it is the user's own (a task that is
// not Elastic, or that raised before or after torch ran). For an Elastic
// task it is flytekit's own wrapper again (FlyteUserRuntimeException,
// FlyteRecoverableException around torch's ChildFailedError), and the
// exception is the root cause of torch's failure table (see above).
func WrappedException(code, message string) (exception, line string, ok bool) {
	if !flytekitWrapperCodes[code] {
		return "", "", false
	}
	if exc, line, ok := messageSection(message); ok {
		return exc, line, true
	}
	if len(message) > maxWrappedScan {
		message = message[:maxWrappedScan]
	}
	return torchRootCause(message)
}

// flytekitWrapperTypes are the classes a "Message:" section names that
// wrap the exception rather than being it.
var flytekitWrapperTypes = map[string]bool{
	"FlyteUserRuntimeException": true, "FlyteRecoverableException": true, "FlyteException": true,
	"FlyteUserException": true, "ChildFailedError": true,
}

// messageSection is the exception of flytekit's last "Message:" section:
// its first line, indented as flytekit indents it, when it names a class
// that is not one of flytekit's wrappers. Only the message's tail is
// searched: the section ends the message, and a capped message keeps its
// tail.
func messageSection(message string) (exception, line string, ok bool) {
	tail := message
	if len(tail) > maxWrappedScan {
		tail = tail[len(tail)-maxWrappedScan:]
	}
	const header = "Message:\n\n"
	i := strings.LastIndex(tail, "\n"+header)
	switch {
	case i >= 0:
		tail = tail[i+1+len(header):]
	case strings.HasPrefix(tail, header):
		tail = tail[len(header):]
	default:
		return "", "", false
	}
	first, _, _ := strings.Cut(tail, "\n")
	if !strings.HasPrefix(first, "    ") {
		return "", "", false
	}
	l := strings.TrimSpace(first)
	m := pythonException.FindStringSubmatch(l)
	if m == nil {
		return "", "", false
	}
	name := m[1]
	if j := strings.LastIndexByte(name, '.'); j >= 0 {
		name = name[j+1:]
	}
	if flytekitWrapperTypes[name] {
		return "", "", false
	}
	return name, l, true
}

// torchRootCause is the exception of torch's failure table in message.
func torchRootCause(message string) (exception, line string, ok bool) {
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
	if exc, line, ok := lastException(tb); ok {
		return exc, line, true
	}
	// A message capped inside the exception's own text (an exception of a
	// megabyte, kferrors.CapMessage): its line starts before the marker.
	if i := strings.Index(tb, "\n… ["); i >= 0 && strings.HasPrefix(strings.TrimLeft(tb[i+len("\n… ["):], "0123456789"), " bytes elided] …") {
		if exc, line, ok := lastException(tb[:i]); ok {
			return exc, kferrors.CapMessage(line, maxWrappedLine), true
		}
	}
	return "", "", false
}

// maxWrappedLine caps an exception line cut out of a capped message.
const maxWrappedLine = 1 << 10

// lastException is the exception of a traceback's last line: a Python
// exception ("ValueError: …") or torch's signal line.
func lastException(tb string) (exception, line string, ok bool) {
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

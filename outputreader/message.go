package outputreader

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	kferrors "github.com/kfelastic/kfelastic/errors"
)

// TimeLayout is how failure times are shown: RFC 3339 with all nine
// fractional digits, so that times line up and sub-second order is visible.
const TimeLayout = "2006-01-02T15:04:05.000000000Z07:00"

// Codes of the ExecutionErrors made when there is no root cause; they are
// upstream's codes for the same situations, so propeller-side handling does
// not change.
const ()

// Message is the Flyte UI message of DESIGN.md §3: the root cause headed by
// its worker and time, then one line tallying the other failures, e.g.
//
//	[job-worker-1, 2026-11-21T10:00:01.123456789Z] RuntimeError: boom
//	Also failed: 3 other workers (2× Preempted, 1× NonZeroExit). Earliest failure shown.
//
// A time that is not the document's own says so: "(upload time)" for the
// object's modification time, "(read time)" for the listing time. It is ""
// when there is no root cause.
func (r *Report) Message() string {
	if r.RootCause == nil {
		return ""
	}
	root := r.RootCause
	var b strings.Builder
	who := root.Failure.Worker
	if who == "" {
		who = root.Key
	}
	if who == "" {
		who = "unknown worker"
	}
	fmt.Fprintf(&b, "[%s, %s%s] %s", who, root.Time().UTC().Format(TimeLayout), timeNote(root.AtSource), root.Failure.Code)
	// Tracebacks end in a newline; the tally goes right under the message.
	if msg := strings.TrimRight(root.Failure.Message, " \t\r\n"); msg != "" {
		b.WriteString(": ")
		b.WriteString(msg)
	}
	if tally := r.tally(); tally != "" {
		b.WriteString("\n")
		b.WriteString(tally)
	}
	return b.String()
}

func timeNote(s TimeSource) string {
	switch s {
	case TimeFromModified:
		return " (upload time)"
	case TimeFromListing:
		return " (read time)"
	}
	return ""
}

// tally is the one line about everything but the root cause.
func (r *Report) tally() string {
	var parts []string
	if len(r.Others) > 0 {
		rootWorker := kferrors.SanitizeWorker(r.RootCause.Failure.Worker)
		workers := map[string]struct{}{}
		codes := map[string]int{}
		notOpened := 0
		for _, d := range r.Others {
			if w := kferrors.SanitizeWorker(d.Failure.Worker); w != rootWorker {
				workers[w] = struct{}{}
			}
			if !d.Opened() {
				notOpened++
				continue
			}
			code := d.Failure.Code
			if code == "" {
				code = "no code"
			}
			codes[code]++
		}
		type count struct {
			code string
			n    int
		}
		var counts []count
		for c, n := range codes {
			counts = append(counts, count{c, n})
		}
		slices.SortFunc(counts, func(a, b count) int {
			return cmp.Or(cmp.Compare(b.n, a.n), strings.Compare(a.code, b.code))
		})
		var items []string
		for _, c := range counts {
			items = append(items, fmt.Sprintf("%d× %s", c.n, c.code))
		}
		if notOpened > 0 {
			items = append(items, fmt.Sprintf("%d later, not opened", notOpened))
		}
		what := plural(len(workers), "other worker", "other workers")
		if len(r.Others) != len(workers) {
			what += ", " + plural(len(r.Others), "other document", "other documents")
		}
		parts = append(parts, fmt.Sprintf("Also failed: %s (%s).", what, strings.Join(items, ", ")))
	}
	if n := len(r.Skipped); n > 0 {
		parts = append(parts, fmt.Sprintf("Skipped %s.", plural(n, "unreadable document", "unreadable documents")))
	}
	if len(parts) == 0 {
		return ""
	}
	return strings.Join(parts, " ") + " Earliest failure shown."
}

func plural(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}

// IsRecoverable follows the root cause's kind; false without a root cause.
func (r *Report) IsRecoverable() bool {
	return r.RootCause != nil && r.RootCause.Failure.Recoverable
}

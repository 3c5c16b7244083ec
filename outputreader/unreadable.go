package outputreader

import (
	"fmt"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	kferrors "github.com/kfelastic/kfelastic/errors"
)

// Bounds on what an unreadable document's failure quotes of it.
const (
	// unreadableHeadBytes is how much of a document too large to read is
	// read after all, for what it says (kferrors.PartialFailure).
	unreadableHeadBytes = 4 << 10
	// unreadableQuoteBytes caps the part of its message, or of its bytes,
	// that the failure quotes.
	unreadableQuoteBytes = 1 << 10
)

// unreadableDocument is the failure an error document stands for that
// could not be read (docs/DESIGN.md §3): its pod wrote it, so its pod
// failed, whatever its exit code. Made from what could be read:
//
//   - the worker: the one its name carries (our error-<ns>-<worker>-….pb),
//     else the one its bytes name before they became unreadable, else none;
//   - the time: its object's modification time, an upper bound of the
//     failure (TimeFromModified), else the listing time (TimeFromListing);
//     never a time the document claims: its bytes cannot be trusted;
//   - code CodeUnreadableDocument, RECOVERABLE, SYSTEM, as upstream's
//     reader takes an error file it cannot parse (ErrorFileBadFormat): the
//     pod's own failure is unknown, and a retry may fix what storage or a
//     writer mangled;
//   - a message naming the key, its size and why it was unreadable, and
//     what its bytes said: the code, worker and head of the message they
//     hold, else their head when it is printable text.
//
// why is the reason it was skipped; size is its size in bytes (-1 when
// unknown), head its first bytes, if any were read.
func unreadableDocument(l listed, size int64, head []byte, why error, listedAt time.Time) Document {
	f := kferrors.SystemFailure(kferrors.CodeUnreadableDocument, "", kferrors.WorkerFromKey(l.key), time.Time{})
	var b strings.Builder
	fmt.Fprintf(&b, "error document %s", l.key)
	if size >= 0 {
		fmt.Fprintf(&b, " (%d bytes)", size)
	}
	fmt.Fprintf(&b, " could not be read: %v.", why)
	if p, ok := kferrors.PartialFailure(head); ok {
		if f.Worker == "" {
			f.Worker = p.Worker
		}
		b.WriteString(" What could be read of it:")
		if p.Code != "" {
			fmt.Fprintf(&b, " code %s.", quoteCut(p.Code, 128))
		}
		if p.Worker != "" {
			fmt.Fprintf(&b, " worker %s.", quoteCut(p.Worker, 128))
		}
		if p.Message != "" {
			fmt.Fprintf(&b, " Its message began:\n\n%s", kferrors.CapMessage(p.Message, unreadableQuoteBytes))
		}
	} else if text := printableHead(head); text != "" {
		fmt.Fprintf(&b, " Its first bytes:\n\n%s", text)
	}
	f.Message = b.String()
	d := Document{Key: l.key, Failure: f, Modified: l.modified, At: listedAt, AtSource: TimeFromListing, Unreadable: why}
	if kferrors.UsableTime(l.modified) {
		d.At, d.AtSource = l.modified.UTC(), TimeFromModified
	}
	return d
}

// quoteCut is s quoted, cut to n bytes.
func quoteCut(s string, n int) string {
	if len(s) > n {
		return fmt.Sprintf("%q…", kferrors.CapMessage(s, n))
	}
	return fmt.Sprintf("%q", s)
}

// printableHead is the head of data when it is printable text (a document
// someone wrote as text), "" otherwise.
func printableHead(data []byte) string {
	data = data[:min(len(data), unreadableQuoteBytes)]
	for rest := data; len(rest) > 0; {
		r, n := utf8.DecodeRune(rest)
		if r == utf8.RuneError && n <= 1 {
			if !utf8.FullRune(rest) {
				data = data[:len(data)-len(rest)] // a character the cut split
				break
			}
			return ""
		}
		if !unicode.IsPrint(r) && r != '\n' && r != '\t' && r != '\r' {
			return ""
		}
		rest = rest[n:]
	}
	return strings.TrimRightFunc(string(data), unicode.IsSpace)
}

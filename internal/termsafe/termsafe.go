// Package termsafe makes untrusted text safe to print on a terminal. Pod
// names, codes, keys and messages come from whoever wrote a document or ran
// a worker: an escape sequence among them could clear the screen, move the
// cursor, or fake a line of the report; a newline in a pod name would break
// a table's row. Every human-readable output of the binary passes what it
// did not write itself through Line or Text (JSON output escapes on its own).
package termsafe

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Line returns s for one line of output, a table cell: every control
// character (newline and tab included), every format character (bidi
// overrides, zero-width characters), line and paragraph separators and every
// byte that is not UTF-8 are written as Go escapes (\x1b, \u202e, \xff);
// the rest is kept as is.
func Line(s string) string { return escape(s, false) }

// Text is Line for text of several lines (a traceback): newlines and tabs
// stay, everything else Line escapes is escaped (a carriage return
// included: it would let a line overwrite the one before).
func Text(s string) string { return escape(s, true) }

func escape(s string, multiline bool) string {
	if safe(s, multiline) {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 16)
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case !unsafeRune(r, multiline):
			b.WriteString(s[i : i+size])
		case r < 0x80:
			fmt.Fprintf(&b, `\x%02x`, r)
		case r <= 0xffff:
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			fmt.Fprintf(&b, `\U%08x`, r)
		}
		i += size
	}
	return b.String()
}

func safe(s string, multiline bool) bool {
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		if (r == utf8.RuneError && size == 1) || unsafeRune(r, multiline) {
			return false
		}
		i += size
	}
	return true
}

func unsafeRune(r rune, multiline bool) bool {
	if multiline && (r == '\n' || r == '\t') {
		return false
	}
	return unicode.IsControl(r) || unicode.In(r, unicode.Cf, unicode.Zl, unicode.Zp)
}

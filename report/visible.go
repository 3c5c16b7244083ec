package report

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// visible makes text from documents and events safe to show as text, before
// html/template escapes it for HTML: control characters (terminal escape
// sequences start with ESC) and the invisible characters that reorder or
// hide text (bidirectional overrides, zero-width marks) become visible
// escapes like \x1b and \u202e, and invalid UTF-8 becomes U+FFFD. Newlines
// and tabs stay, unless oneLine, which turns each line break into " ⏎ ".
func visible(s string, oneLine bool) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	var b strings.Builder
	for _, r := range s {
		switch {
		case r == '\n' && oneLine:
			b.WriteString(" ⏎ ")
		case r == '\r' && oneLine:
		case r == '\n' || r == '\t':
			b.WriteRune(r)
		case r < 0x20 || r == 0x7f:
			fmt.Fprintf(&b, `\x%02x`, r)
		case hidden(r):
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// hidden reports whether r changes how the text around it reads without
// being seen itself: C1 controls, bidirectional controls (Trojan Source),
// zero-width and other format characters, line and paragraph separators.
func hidden(r rune) bool {
	return (r >= 0x80 && r <= 0x9f) || unicode.Is(unicode.Cf, r) || r == 0x2028 || r == 0x2029
}

// cut shortens s (already visible) to at most n characters, ending in "…".
func cut(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	i, count := 0, 0
	for i = range s {
		if count == n-1 {
			break
		}
		count++
	}
	return s[:i] + "…"
}

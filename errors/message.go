package errors

import (
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// CapMessage returns msg unchanged if it fits in max bytes; otherwise its head
// and its tail (where tracebacks keep the exception line) joined by a marker
// saying how many bytes were left out. The result is at most max bytes and is
// valid UTF-8 even if msg was not, and never splits a character.
func CapMessage(msg string, max int) string {
	msg = ValidUTF8(msg)
	if len(msg) <= max {
		return msg
	}
	if max <= 0 {
		return ""
	}
	// Size the marker for the largest count it could print (len(msg)), so the
	// real one, with no more digits, always fits.
	room := max - len(elisionMarker(len(msg)))
	if room < 2 {
		return truncateRunes(msg, max)
	}
	head := truncateRunes(msg, room/2)
	tail := tailRunes(msg, room-len(head))
	return head + elisionMarker(len(msg)-len(head)-len(tail)) + tail
}

func elisionMarker(n int) string {
	return "\n… [" + strconv.Itoa(n) + " bytes elided] …\n"
}

// truncateRunes returns the longest prefix of s of at most n bytes that ends on
// a character boundary.
func truncateRunes(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// tailRunes returns the longest suffix of s of at most n bytes that starts on
// a character boundary.
func tailRunes(s string, n int) string {
	if n <= 0 {
		return ""
	}
	if len(s) <= n {
		return s
	}
	i := len(s) - n
	for i < len(s) && !utf8.RuneStart(s[i]) {
		i++
	}
	return s[i:]
}

// ValidUTF8 replaces invalid bytes with U+FFFD; proto3 strings must be UTF-8.
func ValidUTF8(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	return strings.ToValidUTF8(s, "\uFFFD")
}

// oneLineMax is the most bytes OneLine keeps: a log line's or a lane's worth.
const oneLineMax = 300

// OneLine shortens a failure message to the one line that names the failure,
// for a log attribute, a report's lane or a note: a Python traceback's last
// line, where the exception is named; otherwise the first line with a
// letter or digit in it (torch's ChildFailedError text opens with a rule of
// "="). It keeps at most 300 bytes, marking a cut with "…".
func OneLine(msg string) string {
	lines := strings.Split(ValidUTF8(msg), "\n")
	if strings.Contains(msg, "Traceback (most recent call last)") {
		slices.Reverse(lines)
	}
	line := ""
	for _, l := range lines {
		if l = strings.TrimSpace(l); l != "" && strings.IndexFunc(l, isWordRune) >= 0 {
			line = l
			break
		}
	}
	if len(line) > oneLineMax {
		line = truncateRunes(line, oneLineMax) + "…"
	}
	return line
}

func isWordRune(r rune) bool { return unicode.IsLetter(r) || unicode.IsDigit(r) }

package termsafe_test

import (
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/kfelastic/kfelastic/internal/termsafe"
)

func TestEscapes(t *testing.T) {
	for in, want := range map[string][2]string{
		"job-worker-0":                  {"job-worker-0", "job-worker-0"},
		"héllo 日本":                      {"héllo 日本", "héllo 日本"},
		"\x1b[2J\x1b[Hcleared":          {`\x1b[2J\x1b[Hcleared`, `\x1b[2J\x1b[Hcleared`},
		"pod\n*  fake row":              {`pod\x0a*  fake row`, "pod\n*  fake row"},
		"a\tb\rc":                       {`a\x09b\x0dc`, "a\tb\\x0dc"},
		"\u202egnp.exe":                 {`\u202egnp.exe`, `\u202egnp.exe`},
		"zero\u200bwidth\u2028line":     {`zero\u200bwidth\u2028line`, `zero\u200bwidth\u2028line`},
		"bad \xff byte \x7f del \u0085": {`bad \xff byte \x7f del \u0085`, `bad \xff byte \x7f del \u0085`},
	} {
		if got := termsafe.Line(in); got != want[0] {
			t.Errorf("Line(%q) = %q, want %q", in, got, want[0])
		}
		if got := termsafe.Text(in); got != want[1] {
			t.Errorf("Text(%q) = %q, want %q", in, got, want[1])
		}
	}
}

func FuzzLine(f *testing.F) {
	f.Add("\x1b]0;title\x07pod\n")
	f.Add("\xff\u202e")
	f.Fuzz(func(t *testing.T, s string) {
		for _, out := range []string{termsafe.Line(s), termsafe.Text(s)} {
			if !utf8.ValidString(out) {
				t.Fatalf("invalid UTF-8 from %q: %q", s, out)
			}
			for _, r := range out {
				if (unicode.IsControl(r) && r != '\n' && r != '\t') || unicode.In(r, unicode.Cf, unicode.Zl, unicode.Zp) {
					t.Fatalf("%q kept %U", s, r)
				}
			}
		}
		if strings.ContainsAny(termsafe.Line(s), "\n\t") {
			t.Fatalf("Line(%q) kept a newline or tab", s)
		}
	})
}

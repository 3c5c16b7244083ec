package report_test

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/net/html"

	"github.com/kfelastic/kfelastic/report"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// golden compares got with testdata/name, or writes it there with -update.
func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./report -run %s -update)", err, t.Name())
	}
	if got != string(want) {
		gotPath := filepath.Join(t.TempDir(), name)
		_ = os.WriteFile(gotPath, []byte(got), 0o644)
		t.Fatalf("%s differs from the golden file; got is in %s (diff them, or -update if the change is meant)", path, gotPath)
	}
}

func TestTimelineGolden(t *testing.T) {
	for name, in := range map[string]report.Input{"four-pods.svg": fourPods(), "hostile.svg": hostile()} {
		t.Run(name, func(t *testing.T) {
			svg, err := report.SVG(in)
			if err != nil {
				t.Fatal(err)
			}
			golden(t, name, svg)
		})
	}
}

// parse builds the report and parses it as a browser would.
func parse(t *testing.T, in report.Input) (string, *html.Node) {
	t.Helper()
	var b bytes.Buffer
	if err := report.Build(&b, in); err != nil {
		t.Fatal(err)
	}
	doc, err := html.Parse(bytes.NewReader(b.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	return b.String(), doc
}

// lanes are the pods of the page's lanes, in order.
func lanes(doc *html.Node) []string {
	var pods []string
	walk(doc, func(n *html.Node) {
		for _, a := range n.Attr {
			if a.Key == "data-pod" {
				pods = append(pods, a.Val)
			}
		}
	})
	return pods
}

func walk(n *html.Node, f func(*html.Node)) {
	f(n)
	for c := n.FirstChild; c != nil; c = c.NextSibling {
		walk(c, f)
	}
}

func text(n *html.Node) string {
	var b strings.Builder
	walk(n, func(n *html.Node) {
		if n.Type == html.TextNode {
			b.WriteString(n.Data)
		}
	})
	return b.String()
}

func byID(doc *html.Node, id string) *html.Node {
	var found *html.Node
	walk(doc, func(n *html.Node) {
		for _, a := range n.Attr {
			if a.Key == "id" && a.Val == id && found == nil {
				found = n
			}
		}
	})
	return found
}

// Whatever the documents and events say, the page has no script, no
// element or attribute that came from them, and shows their text as text:
// markup literally, control characters as \x1b, bidi overrides as \u202e.
func TestEverythingIsEscaped(t *testing.T) {
	page, doc := parse(t, hostile())
	walk(doc, func(n *html.Node) {
		if n.Type != html.ElementNode {
			return
		}
		switch n.Data {
		case "script", "img", "i", "iframe", "object", "embed", "link":
			t.Errorf("element <%s> in the page", n.Data)
		case "b":
			if text(n) == "bold" {
				t.Error("a message's <b> became an element")
			}
		case "style":
			if strings.Contains(text(n), "display:none") {
				t.Error("a pod name became a style sheet")
			}
		}
		for _, a := range n.Attr {
			if strings.HasPrefix(a.Key, "on") || a.Key == "src" || a.Key == "href" {
				t.Errorf("attribute %s=%q on <%s>", a.Key, a.Val, n.Data)
			}
			if a.Key == "id" && strings.HasPrefix(a.Val, "injected") {
				t.Errorf("injected element <%s id=%s>", n.Data, a.Val)
			}
		}
	})
	body := text(doc)
	for _, want := range []string{
		"<script>alert(1)</script><img src=x onerror=alert(2)><b id=injected>bold</b>",
		`\x1b[31mRED\x1b[0m`, `\u202eevil\u202c`, `\x07bell & <i>italic</i>`,
		`job-"><svg onload=alert(4)>`, "error-<img src=x onerror=alert(5)>.pb", "<b id=injected2>",
		"file:///tmp/<script>alert(6)</script>", `\x1b]0;title\x07`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("the page does not show %q as text", want)
		}
	}
	if strings.ContainsAny(page, "\x1b\x07\u202e") {
		t.Error("a control or bidi character reached the page as itself")
	}
	if !strings.Contains(page, `content="default-src 'none'; style-src 'unsafe-inline'"`) {
		t.Error("no Content-Security-Policy: the page must not run scripts or fetch")
	}
}

// The report's parts: the UI message as the summary, the root lane first
// and marked, secondary failures dimmed, recovered ones and events in their
// lanes, the skipped document and event listed.
func TestFourPods(t *testing.T) {
	in := fourPods()
	in.Message = "[job-worker-1/0, 2026-11-21T10:00:01.123456789Z] ValueError: the UI message"
	page, doc := parse(t, in)
	if got := text(byID(doc, "ui-message")); got != in.Message {
		t.Fatalf("summary %q, want the UI message", got)
	}
	lane := byID(doc, "root-lane")
	if lane == nil {
		t.Fatal("no root lane")
	}
	pods := lanes(doc)
	if strings.Join(pods, " ") != "job-worker-1 job-worker-0 job-worker-2 job-worker-3 job-worker-4" {
		t.Fatalf("lanes %v: the root cause's first, then by first failure, then the rest", pods)
	}
	if got := text(lane); !strings.Contains(got, "ROOT CAUSE · ValueError: batch 17 has NaN labels") {
		t.Fatalf("root lane text %q", got)
	}
	for _, want := range []string{`class="mark m-fail"`, `class="mark m-recovered"`, `class="mark m-restart"`, `class="mark m-relaunch"`,
		`class="mark m-podfail"`, `class="mark m-start"`, `<tr class="secondary">`, `<tr class="recovered">`, "error-0badc0de.pb", "events/0000-bad.json",
		"4 failure documents · 1 recovered (superseded) · 1 unreadable · 12 events · 5 pods"} {
		if !strings.Contains(page, want) {
			t.Errorf("page lacks %s", want)
		}
	}
	// Without a message given, the report's own list says it. (The corrupt
	// document is listed as skipped; only a vanished one is tallied so.)
	in.Message = ""
	_, doc = parse(t, in)
	if got := text(byID(doc, "ui-message")); !strings.HasPrefix(got, "[job-worker-1/0, 2026-11-21T10:00:01.123456789Z] ValueError: Traceback") ||
		!strings.Contains(got, "Also failed: 3 other workers (2× torch.distributed.DistNetworkError, 1× Preempted). Earliest failure shown.") {
		t.Fatalf("default summary %q", got)
	}
}

// At 500 pods the first lanes show, the root cause's on top, the rest fold.
func TestManyPodsFold(t *testing.T) {
	page, doc := parse(t, manyPods(500))
	open, more := byID(doc, "lanes-open"), byID(doc, "lanes-more")
	if open == nil || more == nil {
		t.Fatal("no open or folded lanes")
	}
	count := func(n *html.Node) int {
		c := 0
		walk(n, func(n *html.Node) {
			for _, a := range n.Attr {
				if a.Key == "data-pod" {
					c++
				}
			}
		})
		return c
	}
	if count(open) != 30 || count(more) != 470 {
		t.Fatalf("open %d, folded %d", count(open), count(more))
	}
	if lane := byID(open, "root-lane"); lane == nil || !strings.Contains(text(lane), "big-job-worker-250") {
		t.Fatal("the root cause's lane is not among the open ones")
	}
	if len(page) > 2<<20 {
		t.Fatalf("a 500-pod page of %d bytes", len(page))
	}
	// Past MaxLanes the latest pods are left out, and the page says so.
	in := manyPods(500)
	in.MaxLanes = 100
	page, doc = parse(t, in)
	if count(doc) != 100 || !strings.Contains(page, "400 more pods, whose first failure came later, are not drawn") {
		t.Fatalf("%d lanes drawn of 500 with MaxLanes 100", count(doc))
	}
}

// No documents at all is a report too, and says so.
func TestNoDocuments(t *testing.T) {
	_, doc := parse(t, report.Input{Prefix: "file:///empty"})
	if got := text(byID(doc, "ui-message")); got != "no error documents under file:///empty" {
		t.Fatalf("summary %q", got)
	}
}

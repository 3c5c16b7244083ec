package report_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kfelastic/kfelastic/internal/test/testenv"
	"github.com/kfelastic/kfelastic/report"
)

// artifacts is where the browser test keeps its screenshots: out/report/
// at the module root (git ignores out/), or $KFELASTIC_ARTIFACTS.
func artifacts(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("KFELASTIC_ARTIFACTS")
	if dir == "" {
		root, err := filepath.Abs("..")
		if err != nil {
			t.Fatal(err)
		}
		dir = filepath.Join(root, "out")
	}
	dir = filepath.Join(dir, "report")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// visibility is what the page says of the root cause, measured in the
// browser after layout.
type visibility struct {
	LaneInView    bool     `json:"laneInView"`
	LaneOnTop     bool     `json:"laneOnTop"`
	LabelVisible  bool     `json:"labelVisible"`
	LabelText     string   `json:"labelText"`
	MessageInView bool     `json:"messageInView"`
	MessageText   string   `json:"messageText"`
	Scripts       int      `json:"scripts"`
	Injected      bool     `json:"injected"`
	BodyText      string   `json:"bodyText"`
	ScrollWidth   int      `json:"scrollWidth"`
	Width         int      `json:"width"`
	Problems      []string `json:"problems"`
}

// measure: is the root lane inside the viewport, and is it what is drawn
// at the root mark's place (nothing covers it)? Is the root's label
// rendered with a size, and the UI message in view? Did anything from the
// documents become an element?
const measure = `(() => {
  const inView = r => r.width > 0 && r.height > 0 && r.top >= 0 && r.left >= 0 && r.bottom <= innerHeight && r.right <= innerWidth;
  const lane = document.getElementById('root-lane');
  const mark = lane && lane.querySelector('.m-root path');
  const label = lane && lane.querySelector('.root-label');
  const msg = document.getElementById('ui-message');
  const v = {problems: []};
  if (!lane || !mark || !label || !msg) { v.problems.push('missing root lane, mark, label or message'); return v; }
  const lr = lane.getBoundingClientRect(), mr = mark.getBoundingClientRect();
  v.laneInView = inView(lr);
  const hit = document.elementFromPoint(mr.left + mr.width / 2, mr.top + mr.height / 2);
  v.laneOnTop = !!hit && lane.contains(hit);
  v.labelVisible = label.checkVisibility({checkOpacity: true, checkVisibilityCSS: true}) && inView(label.getBoundingClientRect());
  v.labelText = label.textContent;
  v.messageInView = msg.checkVisibility({checkOpacity: true, checkVisibilityCSS: true}) && inView(msg.getBoundingClientRect());
  v.messageText = msg.innerText;
  v.scripts = document.scripts.length;
  v.injected = !!document.getElementById('injected') || !!document.querySelector('[onerror],[onload],img,iframe');
  v.bodyText = document.body.innerText;
  v.scrollWidth = document.documentElement.scrollWidth;
  v.width = innerWidth;
  return v;
})()`

// The report in a real browser: headless Chromium from Debian loads each
// file, and the root cause's lane and text must be visible without
// scrolling, at 4 pods and at 500, on a laptop's screen and a narrow one.
// A hostile document's text shows as text. Screenshots are kept under
// out/report/.
func TestReportInChromium(t *testing.T) {
	b := testenv.Chromium(t)
	dir := t.TempDir()
	out := artifacts(t)
	cases := []struct {
		name   string
		in     report.Input
		label  string
		msg    string
		w, h   int
		extras []string
	}{
		{"four-pods", fourPods(), "ROOT CAUSE · ValueError: batch 17 has NaN labels", "[job-worker-1/0, 2026-11-21T10:00:01.123456789Z] ValueError: Traceback", 1280, 800, nil},
		{"four-pods-narrow", fourPods(), "ROOT CAUSE · ValueError", "ValueError: Traceback", 800, 600, nil},
		{"500-pods", manyPods(500), "ROOT CAUSE · RuntimeError: CUDA error: an illegal memory access", "[big-job-worker-250/0, 2026-11-21T10:00:01.123456789Z] RuntimeError: CUDA error", 1280, 800, nil},
		{"hostile", hostile(), "ROOT CAUSE", "<script>alert(1)</script>", 1280, 800,
			[]string{"<b id=injected>bold</b>", `\x1b[31mRED`, `\u202eevil`, `job-"><svg onload=alert(4)>`}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var page bytes.Buffer
			if err := report.Build(&page, c.in); err != nil {
				t.Fatal(err)
			}
			file := filepath.Join(dir, c.name+".html")
			if err := os.WriteFile(file, page.Bytes(), 0o644); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			p, err := b.Open(ctx, "file://"+file, c.w, c.h)
			if err != nil {
				t.Fatal(err)
			}
			png, err := p.Screenshot(ctx, false)
			if err != nil {
				t.Fatal(err)
			}
			shot := filepath.Join(out, c.name+".png")
			if err := os.WriteFile(shot, png, 0o644); err != nil {
				t.Fatal(err)
			}
			var v visibility
			if err := p.Eval(ctx, measure, &v); err != nil {
				t.Fatal(err)
			}
			var problems []string
			check := func(ok bool, format string, args ...any) {
				if !ok {
					problems = append(problems, fmt.Sprintf(format, args...))
				}
			}
			problems = append(problems, v.Problems...)
			check(v.LaneInView, "the root cause's lane is not in view")
			check(v.LaneOnTop, "the root cause's mark is covered")
			check(v.LabelVisible, "the root cause's label is not visible")
			check(strings.HasPrefix(v.LabelText, c.label), "label %q, want it to start %q", v.LabelText, c.label)
			check(v.MessageInView, "the UI message is not in view")
			check(strings.Contains(v.MessageText, c.msg), "UI message %q lacks %q", v.MessageText, c.msg)
			check(v.Scripts == 0 && !v.Injected, "%d scripts, injected elements %v", v.Scripts, v.Injected)
			check(v.ScrollWidth <= v.Width, "the page scrolls sideways: %d > %d", v.ScrollWidth, v.Width)
			for _, e := range c.extras {
				check(strings.Contains(v.BodyText, e), "the page does not show %q as text", e)
			}
			if len(problems) > 0 {
				t.Fatalf("%s (screenshot %s):\n  %s", c.name, shot, strings.Join(problems, "\n  "))
			}
			t.Logf("screenshot: %s", shot)
		})
	}
}

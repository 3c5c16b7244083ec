package local

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/kfelastic/kfelastic/internal/termsafe"
)

// view is the live view: on a terminal a table of the pods redrawn in
// place under the event lines; elsewhere the event lines alone, plus the
// training's progress now and then.
type view struct {
	w          io.Writer
	live       bool
	start      time.Time
	mu         sync.Mutex
	drawn      int    // lines of the table on screen
	drawnTable string // the table last drawn
	lastLog    time.Time
	lastStp    int64
}

func newView(w io.Writer, live bool) *view { return &view{w: w, live: live, start: time.Now()} }

// note is one event line (logged too).
func (e *Engine) note(kind, format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	e.log.Info(msg, "event", kind)
	e.view.line(msg)
}

func (v *view) line(msg string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.clear()
	fmt.Fprintf(v.w, "[%7.1fs] %s\n", time.Since(v.start).Seconds(), termsafe.Line(msg))
	v.draw()
}

func (v *view) clear() {
	if v.live && v.drawn > 0 {
		fmt.Fprintf(v.w, "\x1b[%dA\x1b[J", v.drawn)
		v.drawn = 0
	}
}

func (v *view) draw() {
	if v.live && v.drawnTable != "" {
		fmt.Fprint(v.w, v.drawnTable)
		v.drawn = strings.Count(v.drawnTable, "\n")
	}
}

// row is one pod in the table.
type row struct {
	pod, state, exit                   string
	rank                               int
	restarts, groupWorldSize, lastStep int64
}

// table redraws the pods (a terminal) or, elsewhere, writes a progress line
// when training moved on (at most every 5 s).
func (v *view) table(rows []row, round, step int64) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if !v.live {
		if step > v.lastStp && time.Since(v.lastLog) >= 5*time.Second {
			fmt.Fprintf(v.w, "[%7.1fs] progress: round %d, step %d\n", time.Since(v.start).Seconds(), round, step)
			v.lastLog, v.lastStp = time.Now(), step
		}
		return
	}
	var b strings.Builder
	fmt.Fprintf(&b, "── round %d · step %d ──\n", round, step)
	fmt.Fprintf(&b, "  %-24s %4s %-8s %8s %6s %8s  %s\n", "POD", "RANK", "STATE", "RESTARTS", "WORLD", "STEP", "EXIT")
	for _, r := range rows {
		fmt.Fprintf(&b, "  %-24s %4d %-8s %8d %6d %8d  %s\n", termsafe.Line(r.pod), r.rank, r.state, r.restarts, r.groupWorldSize, r.lastStep, termsafe.Line(r.exit))
	}
	v.clear()
	v.drawnTable = b.String()
	v.draw()
}

func (v *view) close() {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.clear()
	v.draw() // the last table stays on screen
	v.drawn = 0
}

package local

import (
	"bytes"
	"strings"
	"testing"
)

// On a terminal the pods' table is redrawn in place under the event lines
// (cursor up, clear); elsewhere only plain lines are written, and a pod
// name cannot smuggle a terminal escape in either.
func TestView(t *testing.T) {
	rows := []row{{pod: "job-worker-0", state: "running", rank: 0, restarts: 1, groupWorldSize: 2, lastStep: 42},
		{pod: "job-worker-1\x1b[2J", state: "exited", rank: 1, exit: "OOMKilled"}}
	var live bytes.Buffer
	v := newView(&live, true)
	v.table(rows, 3, 42)
	v.line("job-worker-2 started")
	v.table(rows, 4, 50)
	out := live.String()
	if strings.Count(out, "── round") != 3 || !strings.Contains(out, "\x1b[4A\x1b[J") {
		t.Errorf("live view not redrawn in place:\n%q", out)
	}
	if !strings.Contains(out, "job-worker-0                0 running         1      2       42") || strings.Contains(out, "\x1b[2J") {
		t.Errorf("table rows:\n%s", out)
	}
	if i, j := strings.Index(out, "job-worker-2 started"), strings.LastIndex(out, "── round 4"); i < 0 || j < i {
		t.Errorf("event line not above the table:\n%s", out)
	}

	var plain bytes.Buffer
	v = newView(&plain, false)
	v.table(rows, 1, 10)
	v.line("job-worker-2 started")
	if strings.Contains(plain.String(), "\x1b") || !strings.Contains(plain.String(), "progress: round 1, step 10") {
		t.Errorf("plain view:\n%q", plain.String())
	}
}

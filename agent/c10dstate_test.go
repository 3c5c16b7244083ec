package agent

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// States pickled by torch 1.13 (Python 3.11, protocol 4) and torch 2.14
// (Python 3.14, protocol 5): round 3, two participants with heartbeats at
// 22:00:00.123456 and 22:00:10.654321 UTC, a deadline at 21:00, one node
// waiting (agent/testdata/c10d). Aged at a 22:00:05 cutoff, only the first
// heartbeat is changed; the deadline stays; the length stays.
func TestAgedC10dState(t *testing.T) {
	files, _ := filepath.Glob("testdata/c10d/state-*.b64")
	if len(files) < 2 {
		t.Fatalf("recorded states: %v", files)
	}
	cutoff := time.Date(2026, 11, 25, 22, 0, 5, 0, time.UTC)
	aged := time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			in, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			in = []byte(string(in[:len(in)-1])) // the line's end
			out, n, ok := agedC10dState(in, cutoff, aged)
			if !ok || n != 1 || len(out) != len(in) || string(out) == string(in) {
				t.Fatalf("aged %d heartbeats (ok %t), length %d → %d", n, ok, len(in), len(out))
			}
			// Again: nothing more is before the cutoff but the aged one.
			if _, n, _ := agedC10dState(out, cutoff, aged); n != 1 {
				t.Errorf("second pass aged %d, want the 1 already aged", n)
			}
			if _, n, _ := agedC10dState(in, aged, aged); n != 0 {
				t.Errorf("a cutoff before every heartbeat aged %d", n)
			}
			if before, after, ok := c10dHeartbeats(in, cutoff); !ok || before != 1 || after != 1 {
				t.Errorf("heartbeats before/after the cutoff: %d/%d (ok %t), want 1/1", before, after, ok)
			}
		})
	}
	for _, bad := range []string{"", "not base64!", "eA==", "gASVAAAAAAAAAAD/"} {
		if _, _, ok := agedC10dState([]byte(bad), cutoff, aged); ok {
			t.Errorf("%q: read as a state", bad)
		}
	}
}

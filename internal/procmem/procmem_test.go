package procmem

import (
	"os"
	"testing"
)

// This process's own rollup: resident, and its PSS at most its RSS.
func TestRollupSelf(t *testing.T) {
	rss, pss, ok := Rollup(os.Getpid())
	if !ok || rss <= 0 || pss <= 0 || pss > rss {
		t.Errorf("Rollup(self) = rss %d, pss %d, ok %t", rss, pss, ok)
	}
	if _, _, ok := Rollup(-1); ok {
		t.Error("Rollup(-1): ok")
	}
}

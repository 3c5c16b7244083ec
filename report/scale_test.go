package report

import (
	"math/rand"
	"slices"
	"testing"
	"testing/quick"
	"time"
)

func TestOffset(t *testing.T) {
	for d, want := range map[time.Duration]string{
		0: "±0", 4404641: "+4.4ms", -250 * time.Millisecond: "-250ms", 1020 * time.Millisecond: "+1.02s",
		1234567891: "+1.235s", 120 * time.Microsecond: "+120µs", 123 * time.Second: "+2m03s",
		-(3*time.Hour + 4*time.Minute + 5*time.Second): "-3h04m05s",
	} {
		if got := offset(d); got != want {
			t.Errorf("offset(%v) = %q, want %q", d, got, want)
		}
	}
}

// Whatever the domain and the failures' window, the scale keeps time order,
// stays on the plot, and gives the failures at least half of it when cut.
func TestScaleKeepsOrder(t *testing.T) {
	base := time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC)
	check := func(seed int64) bool {
		r := rand.New(rand.NewSource(seed))
		var ts []time.Time
		for range 2 + r.Intn(6) {
			ts = append(ts, base.Add(time.Duration(r.Int63n(int64(48*time.Hour)))>>uint(r.Intn(30))))
		}
		slices.SortFunc(ts, func(a, b time.Time) int { return a.Compare(b) })
		from, to := ts[0], ts[len(ts)-1].Add(time.Second)
		i := r.Intn(len(ts))
		j := i + r.Intn(len(ts)-i)
		s := newScale(from, to, ts[i], ts[j])
		last := -1.0
		for k := range 200 {
			x := s.x(from.Add(time.Duration(float64(to.Sub(from)) * float64(k) / 199)))
			if x < last || x < plotLeft-0.01 || x > plotRight+0.01 {
				t.Logf("seed %d: x %.2f after %.2f", seed, x, last)
				return false
			}
			last = x
		}
		if len(s.segs) > 1 {
			if w := s.x(ts[j]) - s.x(ts[i]); w < 0 {
				return false
			}
			mid := s.segs[len(s.segs)/2]
			if len(s.segs) == 3 && mid.x1-mid.x0 < 0.5*(plotRight-plotLeft) {
				t.Logf("seed %d: failures get %.0f of the plot", seed, mid.x1-mid.x0)
				return false
			}
		}
		return len(s.ticks(ts[i])) > 0
	}
	if err := quick.Check(check, &quick.Config{MaxCount: 500}); err != nil {
		t.Fatal(err)
	}
}

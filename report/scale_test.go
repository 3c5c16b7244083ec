package report

import (
	"math"
	"math/rand"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"testing/quick"
	"time"
)

func TestOffset(t *testing.T) {
	for d, want := range map[time.Duration]string{
		0: "±0", 4404641: "+4.4ms", -250 * time.Millisecond: "-250ms", 1020 * time.Millisecond: "+1.02s",
		1234567891: "+1.235s", 120 * time.Microsecond: "+120µs", 123 * time.Second: "+2m03s",
		-(3*time.Hour + 4*time.Minute + 5*time.Second): "-3h04m05s",
		365 * 24 * time.Hour:                           "+365d", (14*24 + 12) * time.Hour: "+14d12h",
		3*24*time.Hour + 4*time.Hour + 5*time.Minute + 6*time.Second: "+3d04h05m06s",
		338610*time.Hour + 55*time.Minute + 32*time.Second:           "+14108d18h55m32s",
		-(2*24*time.Hour + 30*time.Minute):                           "-2d00h30m",
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

// The axis is labelled in round steps however far apart the documents lie:
// years apart (a clock that was wrong), the labels of a piece that long are
// whole days (they were fractions such as +338610h55m32s); the failures'
// own piece, seconds long, is labelled in whole seconds.
func TestTicksRoundAcrossYears(t *testing.T) {
	origin := time.Date(1987, 6, 1, 3, 4, 5, 0, time.UTC)
	days := regexp.MustCompile(`^[+-]\d+d$`)
	for _, span := range []time.Duration{400 * 24 * time.Hour, 338610*time.Hour + 55*time.Minute + 32*time.Second,
		time.Duration(math.MaxInt64)} {
		to := origin.Add(span)
		whole := newScale(origin, to, time.Time{}, time.Time{})
		cut := newScale(origin, to, to.Add(-2*time.Second), to.Add(-time.Second))
		for name, s := range map[string]scale{"whole": whole, "cut": cut} {
			ticks := s.ticks(origin)
			if len(ticks) < 2 {
				t.Errorf("%v %s: ticks %v", span, name, ticks)
			}
			for _, tk := range ticks {
				x, _ := strconv.ParseFloat(tk.X, 64)
				if x <= s.segs[0].x1 && tk.Label != "±0" && !days.MatchString(tk.Label) {
					t.Errorf("%v %s: label %q is not a whole number of days", span, name, tk.Label)
				}
				if strings.Contains(tk.Label, ".") {
					t.Errorf("%v %s: label %q has a fraction", span, name, tk.Label)
				}
			}
		}
	}
}

package report

import (
	"math"
	"time"
)

// scale maps times to x on the plot. The failures of a job fall within
// seconds of each other, after hours of training: on one linear axis they
// would sit on top of each other at its right end. So when the failures'
// window is a small part of the whole, the axis is cut into up to three
// linear pieces (before the failures, the failures, after them) and the
// failures get most of the width; a break is drawn between pieces.
type scale struct{ segs []segment }

type segment struct {
	from, to time.Time
	x0, x1   float64
}

// Shares of the plot width and the gap drawn between pieces.
const (
	sideShare = 0.2
	breakGap  = 12.0
)

// newScale covers [from, to] (from < to); failFrom..failTo is the window of
// the failures (zero when there are none).
func newScale(from, to, failFrom, failTo time.Time) scale {
	left, right := float64(plotLeft), float64(plotRight)
	whole := scale{segs: []segment{{from: from, to: to, x0: left, x1: right}}}
	if failFrom.IsZero() {
		return whole
	}
	pad := max((failTo.Sub(failFrom))/5, 250*time.Millisecond)
	ws, we := max64(failFrom.Add(-pad), from), min64(failTo.Add(pad), to)
	window := we.Sub(ws)
	// A side shorter than the window is drawn at the window's scale.
	if ws.Sub(from) < window {
		ws = from
	}
	if to.Sub(we) < window {
		we = to
	}
	window = we.Sub(ws)
	if float64(window) >= 0.4*float64(to.Sub(from)) {
		return whole
	}
	var s scale
	width := right - left
	x := left
	if ws.After(from) {
		s.segs = append(s.segs, segment{from: from, to: ws, x0: x, x1: x + sideShare*width - breakGap/2})
		x += sideShare * width
	}
	end := right
	if we.Before(to) {
		end = right - sideShare*width
	}
	s.segs = append(s.segs, segment{from: ws, to: we, x0: x + gapIf(ws.After(from)), x1: end - gapIf(we.Before(to))})
	if we.Before(to) {
		s.segs = append(s.segs, segment{from: we, to: to, x0: end + breakGap/2, x1: right})
	}
	return s
}

func gapIf(b bool) float64 {
	if b {
		return breakGap / 2
	}
	return 0
}

func max64(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func min64(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// x is where t is drawn.
func (s scale) x(t time.Time) float64 {
	for i, g := range s.segs {
		if !t.After(g.to) || i == len(s.segs)-1 {
			return g.x(t)
		}
	}
	return 0
}

func (g segment) x(t time.Time) float64 {
	return g.x0 + float64(t.Sub(g.from))/float64(g.to.Sub(g.from))*(g.x1-g.x0)
}

// breaks are the x of the cuts between pieces.
func (s scale) breaks() []float64 {
	var out []float64
	for i := 1; i < len(s.segs); i++ {
		out = append(out, (s.segs[i-1].x1+s.segs[i].x0)/2)
	}
	return out
}

// ticks are round offsets from origin: about one per 100 units of each
// piece, none closer than minTickGap to the last.
func (s scale) ticks(origin time.Time) []tickView {
	const minTickGap = 48
	var out []tickView
	last := math.Inf(-1)
	for _, g := range s.segs {
		want := max(1, math.Round((g.x1-g.x0)/100))
		span := g.to.Sub(g.from)
		step := tickSteps[len(tickSteps)-1]
		for _, st := range tickSteps {
			if float64(span/st) <= want {
				step = st
				break
			}
		}
		if float64(span/step) > want { // beyond the longest step: a plain fraction
			step = time.Duration(float64(span) / want)
		}
		k := g.from.Sub(origin) / step
		for t := origin.Add(k * step); !t.After(g.to); t = t.Add(step) {
			if t.Before(g.from) {
				continue
			}
			x := g.x(t)
			if x-last < minTickGap {
				continue
			}
			out = append(out, tickView{X: num(x), Label: offset(t.Sub(origin))})
			last = x
		}
	}
	return out
}

package report

import (
	"bytes"
	_ "embed"
	"fmt"
	"html/template"
	"io"
	"strconv"
	"strings"
	"time"

	kferrors "github.com/kfelastic/kfelastic/errors"
	"github.com/kfelastic/kfelastic/outputreader"
)

//go:embed report.html.tmpl
var pageTemplate string

var tmpl = template.Must(template.New("page").Parse(pageTemplate))

// Build writes the report of in as one self-contained HTML page: inline CSS
// and SVG, no script, no fetch (its Content-Security-Policy forbids both).
// Every text from documents and events is shown as text: html/template
// escapes it, and control and invisible characters are made visible first.
func Build(w io.Writer, in Input) error {
	return tmpl.ExecuteTemplate(w, "page", newPage(in))
}

// SVG is the timeline alone (the axis, the open lanes and the folded ones),
// as Build embeds it; golden tests compare it.
func SVG(in Input) (string, error) {
	var b bytes.Buffer
	err := tmpl.ExecuteTemplate(&b, "timeline", newPage(in))
	return b.String(), err
}

// page is what the template draws; every string in it is visible text.
type page struct {
	Prefix    string
	Message   string
	Root      *rootView
	Counts    string
	Axis      axisView
	Open      lanesView
	More      *lanesView
	LanesLeft int // lanes not drawn (beyond MaxLanes)
	Rows      []rowView
	RowsMore  int
	Skipped   []skipView
	Legend    []legendView
	Width     int
	NoFailure bool
}

type rootView struct {
	Pod, Worker, Time, Code, Kind, Source string
}

type axisView struct {
	Width, Height int
	Ticks         []tickView
	RootX         string
	Breaks        []string // x of the cuts in the axis
	Caption       string
}

type tickView struct{ X, Label string }

type lanesView struct {
	Width, Height, LaneHeight, PlotLeft, PlotRight int
	Lanes                                          []laneView
	RootX                                          string // "" without a root cause
	Breaks                                         []string
}

type laneView struct {
	Class                 string
	Root                  bool
	Pod, PodShort         string
	Y, Mid, TextY, Bottom string
	Marks                 []markView
	Label                 *labelView
}

type markView struct{ Class, D, Title string }

type labelView struct{ X, Y, Anchor, Text string }

type rowView struct {
	Class, Offset, Time, Pod, Worker, Code, Kind, Key string
}

type skipView struct{ What, Key, Reason string }

type legendView struct{ Class, D, Text string }

func newPage(in Input) page {
	if in.OpenLanes <= 0 {
		in.OpenLanes = defaultOpen
	}
	if in.TableRows <= 0 {
		in.TableRows = defaultRows
	}
	if in.MaxLanes <= 0 {
		in.MaxLanes = defaultLanes
	}
	m := newModel(in)
	p := page{Prefix: visible(in.Prefix, true), Width: svgWidth}
	msg := in.Message
	if msg == "" && in.Current != nil {
		msg = in.Current.Message()
	}
	switch {
	case msg != "":
	case in.Current != nil && len(in.Current.Skipped) > 0:
		msg = fmt.Sprintf("%d unreadable error documents under %s, none usable", len(in.Current.Skipped), in.Prefix)
	default:
		msg = "no error documents under " + in.Prefix
	}
	p.Message = visible(msg, false)
	p.NoFailure = m.root == nil
	if r := m.root; r != nil {
		rv := &rootView{Pod: visible(podOf(*r), true), Worker: visible(r.Failure.Worker, true),
			Time: r.Time().UTC().Format(outputreader.TimeLayout), Code: visible(shownCode(*r), true),
			Kind: fmt.Sprintf("%s, %s", r.Failure.Kind(), r.Failure.Origin), Source: visible(r.Key, true)}
		if r.Synthesized {
			rv.Source = "from the pod's status"
		}
		p.Root = rv
	}
	skippedDocs := 0
	if in.Current != nil {
		skippedDocs = len(in.Current.Skipped)
	}
	p.Counts = fmt.Sprintf("%s · %d recovered (superseded) · %d unreadable · %s · %s",
		outputreader.Plural(m.documents, "failure document", "failure documents"), m.recovered, skippedDocs,
		outputreader.Plural(m.eventCount, "event", "events"), outputreader.Plural(m.pods, "pod", "pods"))

	sc := newScale(m.from, m.to, m.failFrom, m.failTo)
	x := sc.x
	rootX := ""
	if m.root != nil {
		rootX = num(x(m.root.Time()))
	}
	var breaks []string
	for _, b := range sc.breaks() {
		breaks = append(breaks, num(b))
	}
	p.Axis = axisView{Width: svgWidth, Height: axisHeight, RootX: rootX, Ticks: sc.ticks(m.origin), Breaks: breaks}
	if m.root != nil {
		p.Axis.Caption = "time from the root cause, " + m.origin.UTC().Format(outputreader.TimeLayout)
	} else {
		p.Axis.Caption = "time from the first event, " + m.origin.UTC().Format(outputreader.TimeLayout)
	}
	if len(breaks) > 0 {
		p.Axis.Caption += "; the axis is cut (≈) so that the failures get most of its width"
	}
	lanes := m.lanes[:min(len(m.lanes), in.MaxLanes)]
	p.LanesLeft = len(m.lanes) - len(lanes)
	open := lanes[:min(len(lanes), in.OpenLanes)]
	p.Open = drawLanes(open, x, rootX, breaks, 0)
	if rest := lanes[len(open):]; len(rest) > 0 {
		more := drawLanes(rest, x, rootX, breaks, len(open))
		p.More = &more
	}

	for i, r := range m.rows {
		if i == in.TableRows {
			p.RowsMore = len(m.rows) - i
			break
		}
		d := r.doc
		rv := rowView{Class: r.state, Offset: offset(d.Time().Sub(m.origin)), Time: d.Time().UTC().Format(outputreader.TimeLayout),
			Pod: visible(podOf(d), true), Worker: visible(d.Failure.Worker, true),
			Code: visible(cut(shownHeadline(d), 160), true), Key: visible(d.Key, true)}
		if d.Opened() {
			rv.Kind = fmt.Sprintf("%s, %s", d.Failure.Kind(), d.Failure.Origin)
		}
		if d.Synthesized {
			rv.Key = "(from the pod's status)"
		}
		p.Rows = append(p.Rows, rv)
	}
	add := func(what string, key string, err error) {
		if len(p.Skipped) < defaultRows {
			p.Skipped = append(p.Skipped, skipView{What: what, Key: visible(key, true), Reason: visible(err.Error(), true)})
		}
	}
	if in.Current != nil {
		for _, s := range in.Current.Skipped {
			add("error document", s.Key, s.Err)
		}
	}
	if in.Superseded != nil {
		for _, s := range in.Superseded.Skipped {
			add("superseded document", kferrors.SupersededPrefix+s.Key, s.Err)
		}
	}
	if in.Events != nil {
		for _, s := range in.Events.Skipped {
			add("event", s.Key, s.Err)
		}
	}
	for _, l := range legend {
		p.Legend = append(p.Legend, legendView{Class: string(l.kind), D: shape(l.kind, 7, 7), Text: l.text})
	}
	return p
}

var legend = []struct {
	kind markKind
	text string
}{
	{markRoot, "root cause"},
	{markFailure, "other failure"},
	{markRecovered, "recovered failure"},
	{markGroupStarted, "group started"},
	{markRestart, "restart"},
	{markWorkerFailed, "worker failed"},
	{markWorkerStopped, "worker stopped"},
	{markPodFailed, "pod failed"},
	{markPodSucceeded, "pod succeeded"},
	{markRelaunch, "relaunch"},
}

// drawOrder puts the root cause on top, failures over events.
var drawOrder = map[markKind]int{markRoot: 9, markFailure: 7, markRecovered: 6, markPodFailed: 5}

func drawLanes(lanes []lane, x func(time.Time) float64, rootX string, breaks []string, first int) lanesView {
	v := lanesView{Width: svgWidth, Height: len(lanes) * laneHeight, LaneHeight: laneHeight, PlotLeft: plotLeft, PlotRight: plotRight,
		RootX: rootX, Breaks: breaks}
	for i, l := range lanes {
		y := float64(i * laneHeight)
		mid := y + laneHeight/2
		class := "lane"
		if (first+i)%2 == 1 {
			class += " odd"
		}
		if l.root {
			class += " root"
		}
		pod := visible(l.pod, true)
		lv := laneView{Class: class, Root: l.root, Pod: pod, PodShort: cut(pod, podChars), Y: num(y), Mid: num(mid), TextY: num(mid + 4),
			Bottom: num(y + laneHeight)}
		marks := l.marks
		for _, want := range []func(markKind) bool{
			func(k markKind) bool { return drawOrder[k] == 0 },
			func(k markKind) bool { return drawOrder[k] != 0 },
		} {
			for _, mk := range orderForDrawing(marks, want) {
				lv.Marks = append(lv.Marks, markView{Class: string(mk.kind), D: shape(mk.kind, x(mk.at), mid), Title: cut(visible(mk.title, false), titleChars)})
				if mk.kind == markRoot {
					lv.Label = rootLabel(mk, x(mk.at), mid)
				}
			}
		}
		v.Lanes = append(v.Lanes, lv)
	}
	return v
}

func orderForDrawing(marks []mark, want func(markKind) bool) []mark {
	var out []mark
	for _, m := range marks {
		if want(m.kind) {
			out = append(out, m)
		}
	}
	// Stable: by draw order, then time as they came.
	for i := 1; i < len(out); i++ {
		for j := i; j > 0 && drawOrder[out[j].kind] < drawOrder[out[j-1].kind]; j-- {
			out[j], out[j-1] = out[j-1], out[j]
		}
	}
	return out
}

// rootLabel names the root cause beside its mark, on the side with more
// room, cut to fit it (12px bold text: about 7.2 units a character).
func rootLabel(mk mark, x, mid float64) *labelView {
	const charWidth, gap = 7.2, 12
	text, _, _ := strings.Cut(mk.title, "\n")
	if _, rest, ok := strings.Cut(text, "ROOT CAUSE: "); ok {
		text = "ROOT CAUSE · " + rest
	}
	right, left := svgWidth-4-(x+gap), x-gap-plotLeft
	lv := &labelView{X: num(x + gap), Y: num(mid + 4), Anchor: "start"}
	room := right
	if left > right {
		lv.X, lv.Anchor, room = num(x-gap), "end", left
	}
	lv.Text = cut(visible(text, true), max(8, min(rootChars, int(room/charWidth))))
	return lv
}

// shape is the SVG path of a mark of kind centred at (x, y).
func shape(kind markKind, x, y float64) string {
	switch kind {
	case markRoot:
		return circle(x, y, 7)
	case markFailure, markRecovered:
		return circle(x, y, 4.5)
	case markGroupStarted:
		return fmt.Sprintf("M%s %sL%s %sL%s %sZ", num(x-3.5), num(y-5.5), num(x+5), num(y), num(x-3.5), num(y+5.5))
	case markRestart, markRelaunch:
		return fmt.Sprintf("M%s %sL%s %sL%s %sL%s %sZ", num(x), num(y-5.5), num(x+5.5), num(y), num(x), num(y+5.5), num(x-5.5), num(y))
	case markWorkerFailed, markWorkerStopped:
		return fmt.Sprintf("M%s %sV%s", num(x), num(y-7), num(y+7))
	case markPodFailed:
		return fmt.Sprintf("M%s %sL%s %sM%s %sL%s %s", num(x-4.5), num(y-4.5), num(x+4.5), num(y+4.5), num(x+4.5), num(y-4.5), num(x-4.5), num(y+4.5))
	}
	return fmt.Sprintf("M%s %sh8v8h-8Z", num(x-4), num(y-4))
}

func circle(x, y, r float64) string {
	return fmt.Sprintf("M%s %sa%s %s 0 1 0 %s 0a%s %s 0 1 0 -%s 0Z", num(x-r), num(y), num(r), num(r), num(2*r), num(r), num(r), num(2*r))
}

// tickSteps are the round steps an axis piece is labelled in.
var tickSteps = func() []time.Duration {
	var s []time.Duration
	for unit := time.Microsecond; unit < time.Second; unit *= 10 {
		s = append(s, unit, 2*unit, 5*unit)
	}
	s = append(s, time.Second, 2*time.Second, 5*time.Second, 10*time.Second, 15*time.Second, 30*time.Second,
		time.Minute, 2*time.Minute, 5*time.Minute, 10*time.Minute, 15*time.Minute, 30*time.Minute,
		time.Hour, 2*time.Hour, 3*time.Hour, 6*time.Hour, 12*time.Hour, 24*time.Hour)
	// Whole days beyond, up to the longest span a Duration holds (292
	// years): documents years apart (a clock that was wrong) still get
	// round labels.
	for _, days := range []time.Duration{7, 14, 30, 60, 90, 180, 365, 730, 1825, 3650, 7300, 18250, 36500, 73000} {
		s = append(s, days*24*time.Hour)
	}
	return s
}()

func num(f float64) string { return strconv.FormatFloat(f, 'f', 1, 64) }

// shownCode is a document's code as people read it: flytekit's
// USER:RuntimeError as the exception it wraps (outputreader.Shown).
func shownCode(d outputreader.Document) string {
	if d.Exception != "" {
		return d.Exception
	}
	code, _ := outputreader.Shown(d.Failure.Code, d.Failure.Message)
	return code
}

// shownHeadline is a document's code and first line (kferrors.Headline),
// the exception flytekit wraps shown for its wrapper code.
func shownHeadline(d outputreader.Document) string {
	code, msg := outputreader.Shown(d.Failure.Code, d.Failure.Message)
	if d.Exception != "" {
		code = d.Exception
	}
	return kferrors.Headline(code, kferrors.OneLine(msg))
}

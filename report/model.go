package report

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	kferrors "github.com/kfelastic/kfelastic/errors"
	"github.com/kfelastic/kfelastic/events"
	"github.com/kfelastic/kfelastic/outputreader"
)

// Input is everything a report shows. Build turns it into HTML and reads
// nothing else: no clock, no storage.
type Input struct {
	// Prefix names where the documents are (the URL given to the CLI).
	Prefix string
	// Message is the UI message, as the plugin says it
	// (outputreader.Summary.Message); "" means Current.Message().
	Message string
	// Current is every document directly under the prefix
	// (outputreader.Read with OpenAll): the failures that decide the task.
	Current *outputreader.Report
	// Superseded is every document under superseded/: failures the agent
	// recovered from (errors.Supersede). Nil when there are none.
	Superseded *outputreader.Report
	// Events is the pods' event log (events.Read); nil when there is none.
	Events *events.Log
	// OpenLanes is how many lanes show at once, the root cause's first; the
	// others fold into a list to open. Default 30.
	OpenLanes int
	// TableRows bounds the failure table; default 500.
	TableRows int
	// MaxLanes bounds the lanes drawn at all, so that a page stays a page
	// at 100,000 workers; default 2000. The earliest failing pods are kept.
	MaxLanes int
}

// Geometry of the timeline, in SVG user units (CSS pixels at 1:1).
const (
	svgWidth     = 1000
	labelWidth   = 220
	plotLeft     = labelWidth + 16
	plotRight    = svgWidth - 24
	laneHeight   = 22
	axisHeight   = 34
	podChars     = 30
	rootChars    = 90
	titleChars   = 300
	defaultOpen  = 30
	defaultRows  = 500
	defaultLanes = 2000
)

// markKind is what a mark on a lane stands for; its name is its CSS class.
type markKind string

const (
	markRoot          markKind = "m-root"
	markFailure       markKind = "m-fail"
	markRecovered     markKind = "m-recovered"
	markGroupStarted  markKind = "m-start"
	markRestart       markKind = "m-restart"
	markWorkerFailed  markKind = "m-exit"
	markWorkerStopped markKind = "m-exit-stopped"
	markPodFailed     markKind = "m-podfail"
	markPodSucceeded  markKind = "m-ok"
	markRelaunch      markKind = "m-relaunch"
	markOther         markKind = "m-other"
)

// mark is one thing at one time on one pod's lane.
type mark struct {
	at    time.Time
	kind  markKind
	title string // the tooltip, plain text
}

// lane is one pod's row.
type lane struct {
	pod   string
	root  bool
	first time.Time // its earliest current failure; zero if none
	marks []mark
}

// model is the report before it is drawn: lanes in order, the time domain.
type model struct {
	root       *outputreader.Document
	origin     time.Time // offsets are shown from here: the root cause's time
	from, to   time.Time // the time domain of the lanes
	failFrom   time.Time // the window of the current failures; zero if none
	failTo     time.Time
	lanes      []lane
	rows       []row
	documents  int
	recovered  int
	pods       int
	eventCount int
}

// row is one failure of the table.
type row struct {
	doc   outputreader.Document
	state string // root | secondary | recovered
}

// podOf is the lane of a document: its worker's pod (kferrors.PodOf).
func podOf(d outputreader.Document) string {
	switch {
	case d.Failure.Worker != "":
		return kferrors.PodOf(d.Failure.Worker)
	case d.Key != "":
		return "(no worker: " + d.Key + ")"
	}
	return "(no worker)"
}

// newModel sorts everything into lanes: the root cause's lane first, then
// the lanes with failures by their earliest one, then the others by name.
func newModel(in Input) model {
	var m model
	lanes := map[string]*lane{}
	get := func(pod string) *lane {
		l := lanes[pod]
		if l == nil {
			l = &lane{pod: pod}
			lanes[pod] = l
		}
		return l
	}
	cur := in.Current
	if cur == nil {
		cur = &outputreader.Report{}
	}
	m.root = cur.RootCause
	if m.root != nil {
		m.origin = m.root.Time()
		l := get(podOf(*m.root))
		l.root = true
		l.first = m.root.Time()
		l.marks = append(l.marks, mark{at: m.root.Time(), kind: markRoot, title: documentTitle("ROOT CAUSE", *m.root, m.origin)})
		m.rows = append(m.rows, row{doc: *m.root, state: "root"})
		m.documents++
	}
	if m.root != nil {
		m.failFrom, m.failTo = m.root.Time(), m.root.Time()
	}
	for _, d := range cur.Others {
		if d.Time().After(m.failTo) {
			m.failTo = d.Time()
		}
		l := get(podOf(d))
		if l.first.IsZero() || d.Time().Before(l.first) {
			l.first = d.Time()
		}
		l.marks = append(l.marks, mark{at: d.Time(), kind: markFailure, title: documentTitle("failure", d, m.origin)})
		m.rows = append(m.rows, row{doc: d, state: "secondary"})
		m.documents++
	}
	if s := in.Superseded; s != nil {
		for _, d := range allDocuments(s) {
			l := get(podOf(d))
			l.marks = append(l.marks, mark{at: d.Time(), kind: markRecovered, title: documentTitle("recovered failure (superseded)", d, m.origin)})
			m.rows = append(m.rows, row{doc: d, state: "recovered"})
			m.recovered++
		}
	}
	if in.Events != nil {
		for _, ev := range in.Events.Events {
			l := get(ev.Pod)
			l.marks = append(l.marks, mark{at: ev.Time, kind: eventKind(ev), title: eventTitle(ev, m.origin)})
			m.eventCount++
		}
	}
	for _, l := range lanes {
		slices.SortStableFunc(l.marks, func(a, b mark) int { return a.at.Compare(b.at) })
		for _, mk := range l.marks {
			if m.from.IsZero() || mk.at.Before(m.from) {
				m.from = mk.at
			}
			if mk.at.After(m.to) {
				m.to = mk.at
			}
		}
		m.lanes = append(m.lanes, *l)
	}
	slices.SortFunc(m.lanes, func(a, b lane) int {
		switch {
		case a.root != b.root:
			if a.root {
				return -1
			}
			return 1
		case a.first.IsZero() != b.first.IsZero():
			if a.first.IsZero() {
				return 1
			}
			return -1
		}
		return cmp.Or(a.first.Compare(b.first), strings.Compare(a.pod, b.pod))
	})
	m.pods = len(m.lanes)
	if m.origin.IsZero() {
		m.origin = m.from
	}
	// A single instant gets a second either side; every domain a margin.
	if !m.to.After(m.from) {
		m.from, m.to = m.from.Add(-time.Second), m.from.Add(time.Second)
	}
	margin := m.to.Sub(m.from) / 50
	m.from, m.to = m.from.Add(-margin), m.to.Add(margin)
	return m
}

// allDocuments is a report's root cause and others, in the total order.
func allDocuments(r *outputreader.Report) []outputreader.Document {
	if r.RootCause == nil {
		return nil
	}
	return append([]outputreader.Document{*r.RootCause}, r.Others...)
}

func eventKind(ev events.Event) markKind {
	switch ev.Kind {
	case events.GroupStarted:
		return markGroupStarted
	case events.Restart:
		return markRestart
	case events.WorkerExited:
		if ev.Stopped || ev.Code == "" {
			return markWorkerStopped
		}
		return markWorkerFailed
	case events.PodFailed:
		return markPodFailed
	case events.PodSucceeded:
		return markPodSucceeded
	case events.Relaunch:
		return markRelaunch
	}
	return markOther
}

// documentTitle is a failure's tooltip.
func documentTitle(what string, d outputreader.Document, origin time.Time) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s: %s", offset(d.Time().Sub(origin)), what, kferrors.Headline(d.Failure.Code, firstLine(d.Failure.Message)))
	fmt.Fprintf(&b, "\n%s", d.Time().UTC().Format(outputreader.TimeLayout))
	if d.Failure.Worker != "" {
		fmt.Fprintf(&b, "\nworker %s", d.Failure.Worker)
	}
	if d.Opened() {
		fmt.Fprintf(&b, "\n%s, %s", d.Failure.Kind(), d.Failure.Origin)
	}
	switch {
	case d.Synthesized:
		b.WriteString("\nfrom the pod's status")
	case d.Key != "":
		fmt.Fprintf(&b, "\n%s", d.Key)
	}
	return b.String()
}

// eventTitle is an event's tooltip.
func eventTitle(ev events.Event, origin time.Time) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s", offset(ev.Time.Sub(origin)), ev.Kind)
	add := func(k, v string) {
		if v != "" {
			fmt.Fprintf(&b, " %s=%s", k, v)
		}
	}
	num := func(k string, v int) {
		if v != 0 {
			add(k, strconv.Itoa(v))
		}
	}
	num("attempt", ev.Attempt)
	num("restart_count", ev.RestartCount)
	num("round", ev.Round)
	num("world_size", ev.WorldSize)
	add("worker", ev.Worker)
	if ev.ExitCode != nil {
		add("exit", strconv.Itoa(*ev.ExitCode))
	}
	add("signal", ev.Signal)
	add("code", ev.Code)
	if ev.Stopped {
		add("stopped", "by the agent")
	}
	add("reason", ev.Reason)
	add("replacement", ev.Replacement)
	add("document", ev.Document)
	fmt.Fprintf(&b, "\n%s", ev.Time.UTC().Format(outputreader.TimeLayout))
	if ev.Message != "" {
		fmt.Fprintf(&b, "\n%s", ev.Message)
	}
	return b.String()
}

// offset says a duration from the root cause, to a tenth of a millisecond
// below a second and a millisecond below a minute: "+1.234s", "-250ms",
// "+4.4ms", "+2m03s". Tooltips and the table give the exact times.
func offset(d time.Duration) string {
	sign := "+"
	if d < 0 {
		sign, d = "-", -d
	}
	switch {
	case d == 0:
		return "±0"
	case d < time.Millisecond:
		return sign + strconv.FormatFloat(math.Round(float64(d)/100)/10, 'f', -1, 64) + "µs"
	case d < time.Second:
		return sign + strconv.FormatFloat(math.Round(float64(d)/float64(100*time.Microsecond))/10, 'f', -1, 64) + "ms"
	case d < time.Minute:
		return sign + strconv.FormatFloat(math.Round(d.Seconds()*1000)/1000, 'f', -1, 64) + "s"
	case d < time.Hour:
		return fmt.Sprintf("%s%dm%02ds", sign, int(d.Minutes()), int(d.Seconds())%60)
	case d < 24*time.Hour:
		return fmt.Sprintf("%s%dh%02dm%02ds", sign, int(d.Hours()), int(d.Minutes())%60, int(d.Seconds())%60)
	}
	// Days, and of the rest what is not zero: "+365d", "+14d12h",
	// "+3d04h05m06s" (not "+338610h55m32s").
	days, h, m, s := int64(d/(24*time.Hour)), int(d.Hours())%24, int(d.Minutes())%60, int(d.Seconds())%60
	switch {
	case s != 0:
		return fmt.Sprintf("%s%dd%02dh%02dm%02ds", sign, days, h, m, s)
	case m != 0:
		return fmt.Sprintf("%s%dd%02dh%02dm", sign, days, h, m)
	case h != 0:
		return fmt.Sprintf("%s%dd%02dh", sign, days, h)
	}
	return fmt.Sprintf("%s%dd", sign, days)
}

// Package report draws the failure report of docs/DESIGN.md §9: one
// self-contained HTML page (inline CSS and SVG, no script, nothing fetched)
// with one lane per pod, each failure a mark at its time, the root cause
// highlighted with its message, the other failures dimmed, recovered
// (superseded) failures and the pods' events (group started, restart,
// relaunch, pod failed) in their lanes, and the Flyte UI message as the
// summary.
//
// It is pure: documents and events in, HTML out. The command
// (`kfelastic report URL -o report.html`) reads them:
//
//	cur, _ := outputreader.Read(ctx, src, &outputreader.Options{OpenAll: true})
//	old, _ := outputreader.Read(ctx, supersededSrc, &outputreader.Options{OpenAll: true})
//	log, _ := events.Read(ctx, bucket, nil)
//	sum, _ := outputreader.Summarize(ctx, src, nil)  // the UI message, as the plugin says it
//	err := report.Build(w, report.Input{Prefix: url, Message: sum.Message(), Current: cur, Superseded: old, Events: log})
//
// At hundreds of pods the root cause's lane comes first and the first
// OpenLanes lanes (by first failure) show at once in a scrolling box under
// a sticky time axis; the rest fold into a list that opens on a click, and
// past MaxLanes (2000) the pods that failed last are left out, said so.
// Every text from storage is escaped: html/template escapes it for HTML
// and visible (visible.go) first shows control characters, terminal escape
// sequences and invisible reordering characters as \x1b, \u202e, ….
package report

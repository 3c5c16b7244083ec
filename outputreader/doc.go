// Package outputreader reads every error document of a task attempt and picks
// the root cause: the earliest failure of any pod, by a total order (time,
// worker, key; see Less and docs/DESIGN.md §3). It implements flyteplugins'
// io.OutputReader for the plugin, and serves the CLI and the local engine.
//
// The usage loop:
//
//	src := outputreader.NewBucketSource(bucket)              // or flyteio.NewDataStoreSource(store, prefix)
//	summary, err := outputreader.Summarize(ctx, src, nil)    // the plugin: root cause + tally, flat memory
//	ee := flyteio.ExecutionError(summary.Merge(synthesized...)) // for flyteplugins
//
//	report, err := outputreader.Read(ctx, src, nil, synthesized...) // the CLI, the report: every document
//	// or, while late documents may still land:
//	report, err = outputreader.WaitFor(ctx, src, nil, failedPods, graceDeadline, synthesized...)
//	if report.RootCause == nil { /* no documents: a distinct outcome */ }
//	ui := report.Message()                                   // root cause + tally, as summary.Message()
//
// What it reads. Documents live directly under the output prefix: our
// error-<19-digit ns>-<worker>-<rand>.pb, flytekit's error-<uuid hex>.pb and
// the legacy error.pb. Our names order our documents by time, so Read opens
// only the earliest few of them, plus every document named otherwise, and
// ranks the rest by their names (TimeFromName); each still counts in
// Report.Others and Report.Workers. A document without timestamp is ranked by
// its object's modification time (TimeFromModified), or, where the backend
// tells none, by the time it was listed (TimeFromListing) — never as 1970.
// Corrupt, empty, oversized, vanished and unreadable documents are skipped
// and reported in Report.Skipped; only listing and I/O errors fail a Read.
// Every skipped one but a vanished one is still a failure of the pod that
// wrote it (Document.Unreadable: code kferrors.CodeUnreadableDocument, its
// worker from its name, a message with what could be read of it), ranked
// by its object's modification time, an upper bound of the failure: a pod
// that wrote a document never counts as succeeded (Summary.HasPod).
//
// flytekit's wrapper codes (USER:RuntimeError) are shown as the exception
// they wrap (WrappedException, Shown) in the UI message and the tally.
//
// Cost. One listing, then reads in rounds of at most Options.Concurrency in
// parallel. Read's memory holds one small summary per document (key, worker,
// code, times) and one message: the current best's. Summarize holds none per
// document: the best document, the Concurrency earliest time-named keys, and
// a tally whose size is bounded (MaxTallyWorkers workers and pods, 256
// codes), so the plugin's memory stays flat however many documents a task
// leaves. Both open the same documents and say the same UI message.
package outputreader

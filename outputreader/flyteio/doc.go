// Package flyteio connects the root-cause reader to flytepropeller: a
// Source over flytestdlib's DataStore (what propeller hands a plugin), an
// io.OutputReader whose errors come from outputreader.Read, and the
// ExecutionError flyteplugins reports.
//
// It is a package of its own so that the kfelastic binary, which runs in
// every training pod, does not link flytestdlib's storage stack (its
// Azure/GCS/stow drivers cost ≈50 MiB of RSS at start): only the plugin and
// the benchmarks import it.
//
//	src := flyteio.NewDataStoreSource(store, outputPrefix)
//	summary, err := outputreader.Summarize(ctx, src, nil, synthesized...)
//	ee := flyteio.ExecutionError(summary) // nil without a root cause
package flyteio

// Package errors builds, classifies, encodes and writes the per-pod error
// document of kfelastic: a serialized flyteidl.core.ErrorDocument, the same
// bytes flytekit writes and flytepropeller reads.
//
// The usage loop of a supervisor is:
//
//	f := errors.Classify(errors.WorkerExit{...})      // what was observed → a Failure
//	w := errors.NewWriter(bucket)                // bucket opened by OpenPrefix(url)
//	key, err := w.Write(ctx, f)                  // error-<ns>-<worker>-<rand>.pb, never overwrites
//
// and a reader does Decode(bytes) → FromDocument → Failure.
//
// It is also the one failure vocabulary of kfelastic: every failure code
// (Code*, SignalCode), the agent's exit-code contract in both directions
// (ExitCode, CodeOfExit), and the one rule for a pod that died without a
// document (ClassifyPod), which the plugin (kfoperator.Synthesize) and the
// master (master/kube) both adapt to. The package is
// named after its folder (docs/DESIGN.md §1.1); importers alias it, e.g. kferrors.
package errors

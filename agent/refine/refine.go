// Package refine decides what stands for a pod whose command (flytekit's
// pyflyte-execute under --launcher command) failed: the command's own error
// document, refined by the pod's torch error files (the earliest rank's
// time and exception, where torch named another), capped to the reader's
// limit. Pure: the agent reads the files and writes the documents.
package refine

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	kferrors "github.com/kfelastic/kfelastic/errors"
)

// CommandDocument is what stands for the pod, decided from the command's
// own document f (size bytes stored) and its pod's torch error files (the
// agent's refineFound does the I/O around it): f refined by the error
// files (FromErrorFiles; how says what changed, "" for nothing), and
// whether it is rewritten under our name: when refined, or when f is over
// the reader's limit (kferrors.DefaultMaxDocumentBytes; the rewrite caps
// it).
func CommandDocument(f kferrors.Failure, size int, files []RankError) (refined kferrors.Failure, how string, rewrite bool) {
	refined, how = FromErrorFiles(f, files)
	if !strings.Contains(how, "exception") {
		// The exception is still the one torch named: a known text in its
		// root cause (an ECC error, NCCL's watchdog) names the failure.
		if r := kferrors.Recognize(refined); r.Code != refined.Code {
			refined, how = r, strings.TrimPrefix(how+" and the meaning of its text", " and ")
		}
	}
	return refined, how, how != "" || size > kferrors.DefaultMaxDocumentBytes
}

// RankError is one local rank's torch error file, read.
type RankError struct {
	LocalRank int
	Path      string
	Err       *kferrors.TorchError
}

// FromErrorFiles is the pod's document f as its torch error files
// tell it (pure): dated to the earliest failure among them (each file's
// time is torch's whole second refined by its mtime), and, when that is
// another rank than the one torch named, with that rank's exception as
// code and message, flytekit's text kept below it. how says what changed
// ("" for nothing).
//
// The files are all of one attempt (its attempt_<N> folder), so one dated
// before torch's second is an earlier failure of the same group, not
// another: torch 1.13's multiprocessing context records only the worker
// its join found first, by local rank, not by time, so flytekit's second
// can be a later rank's (real flytekit, nproc_per_node=2: local rank 1
// raised at …03.98, rank 0's gloo error at …04.03 was named). Only a
// file dated after torch's second is left out (a clock that jumped).
func FromErrorFiles(f kferrors.Failure, files []RankError) (kferrors.Failure, string) {
	if f.Time.IsZero() || f.Time.Nanosecond() != 0 {
		return f, "" // no whole second to refine
	}
	named := RootCauseErrorFile(f.Message)
	var first *RankError
	for i := range files {
		r := &files[i]
		t := r.Err.Time
		if t.IsZero() || t.Equal(f.Time) || t.Sub(f.Time) >= time.Second {
			continue // no time, torch's own whole second, or past torch's second
		}
		if first == nil || t.Before(first.Err.Time) || (t.Equal(first.Err.Time) && r.Path == named) {
			first = r
		}
	}
	if first == nil {
		return f, ""
	}
	refined := f
	refined.Time = first.Err.Time
	if first.Path == named || first.Err.Message == "" {
		return refined, "time"
	}
	refined.Code = first.Err.ExceptionType()
	var b strings.Builder
	b.WriteString(first.Err.Message)
	if tb := strings.TrimSpace(first.Err.Traceback); tb != "" && !strings.Contains(first.Err.Message, tb) {
		b.WriteString("\n\n" + tb)
	}
	fmt.Fprintf(&b, "\n\nLocal rank %d raised first, at %s (its error file %s); torch named another rank. "+
		"flytekit's document:\n\n%s", first.LocalRank, first.Err.Time.UTC().Format(time.RFC3339Nano), first.Path, f.Message)
	refined.Message = b.String()
	// The rank's own error, not flytekit's table (which names torch's
	// rank), says what the failure means.
	refined = kferrors.RecognizeIn(refined, first.Err.Message+"\n"+first.Err.Traceback)
	return refined, "time and exception of local rank " + strconv.Itoa(first.LocalRank)
}

// RootCauseErrorFile is the torch error file that torch's ChildFailedError
// message names for its root cause (the first "error_file:" after "Root
// Cause"); "" if none (a worker killed by a signal has "<N/A>").
func RootCauseErrorFile(msg string) string {
	_, rest, ok := strings.Cut(msg, "Root Cause")
	if !ok {
		return ""
	}
	_, rest, ok = strings.Cut(rest, "error_file:")
	if !ok {
		return ""
	}
	line, _, _ := strings.Cut(rest, "\n")
	p := strings.TrimSpace(line)
	if !filepath.IsAbs(p) {
		return ""
	}
	return p
}

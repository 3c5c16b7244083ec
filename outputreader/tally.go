package outputreader

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"

	kferrors "github.com/kfelastic/kfelastic/errors"
)

// Bounds of a tally, so that its memory does not grow with the documents.
const (
	// MaxTallyWorkers is how many distinct workers (and pods) a tally tells
	// apart exactly: 2048 pods of 8 workers. Beyond it the UI message says
	// "at least", and Summary.HasPod assumes an unseen pod reported.
	MaxTallyWorkers = 1 << 14
	// maxTallyCodes is how many distinct codes a tally counts by name, in
	// the order it meets them; documents with further codes count as "other
	// codes". Codes are cut to maxTallyCodeBytes for counting.
	maxTallyCodes     = 256
	maxTallyCodeBytes = 64
	// maxShownCodes is how many codes the UI message names, the most
	// frequent first; the rest are "other codes" there.
	maxShownCodes = 8
)

// tally counts what the UI message's last line says about the failures:
// documents, distinct workers and pods, codes, and how many documents were
// ranked by their names only. It counts every document, the root cause
// included; line takes the root cause out. Its memory is bounded by
// MaxTallyWorkers and maxTallyCodes, whatever the number of documents, so
// the plugin's read (Summarize) and the full list (Report) share it and say
// the same.
type tally struct {
	docs       int
	notOpened  int
	workers    hashCounts
	pods       hashCounts
	codes      map[string]int
	otherCodes int // opened documents whose code fell beyond maxTallyCodes
}

// add counts d: by its code when it was opened, by its name's worker when not.
func (t *tally) add(d Document) {
	if !d.Opened() {
		t.addName(d.Failure.Worker)
		return
	}
	t.docs++
	t.addWorker(d.Failure.Worker, 1)
	code := tallyCode(shownCode(d))
	if t.codes == nil {
		t.codes = map[string]int{}
	}
	if n, ok := t.codes[code]; ok || len(t.codes) < maxTallyCodes {
		t.codes[code] = n + 1
	} else {
		t.otherCodes++
	}
}

// addName counts a document known only by its name (worker as the name
// carries it); removeName takes such a count back when the document is
// opened after all.
func (t *tally) addName(worker string) {
	t.docs++
	t.notOpened++
	t.addWorker(worker, 1)
}

func (t *tally) removeName(worker string) {
	t.docs--
	t.notOpened--
	t.addWorker(worker, -1)
}

func (t *tally) addWorker(worker string, n int32) {
	w := kferrors.SanitizeWorker(worker)
	t.workers.add(hashName(w), n)
	t.pods.add(hashName(kferrors.PodOfSanitized(w)), n)
}

func (t *tally) clone() tally {
	c := *t
	c.workers = t.workers.clone()
	c.pods = t.pods.clone()
	c.codes = maps.Clone(t.codes)
	return c
}

// line is the one line about every failure but root (the unreadable
// documents among them), and the skipped documents that count as no
// failure: vanished, the documents that vanished while read. It ends
// "Earliest failure shown.", or, when a hardware fault stands for the
// earliest failure (displaced, a peer's NCCL error), names that one.
func (t *tally) line(root Document, vanished int, displaced *Document) string {
	var parts []string
	if others := t.docs - 1; others > 0 {
		codes := maps.Clone(t.codes)
		otherCodes := t.otherCodes
		if c := tallyCode(shownCode(root)); codes[c] > 0 {
			if codes[c]--; codes[c] == 0 {
				delete(codes, c)
			}
		} else if otherCodes > 0 {
			otherCodes--
		}
		type count struct {
			code string
			n    int
		}
		var counts []count
		for c, n := range codes {
			counts = append(counts, count{c, n})
		}
		slices.SortFunc(counts, func(a, b count) int {
			return cmp.Or(cmp.Compare(b.n, a.n), strings.Compare(a.code, b.code))
		})
		var items []string
		for i, c := range counts {
			if i < maxShownCodes {
				items = append(items, fmt.Sprintf("%d× %s", c.n, c.code))
			} else {
				otherCodes += c.n
			}
		}
		if otherCodes > 0 {
			items = append(items, fmt.Sprintf("%d× other codes", otherCodes))
		}
		if t.notOpened > 0 {
			items = append(items, fmt.Sprintf("%d later, not opened", t.notOpened))
		}
		workers := t.workers.len()
		if t.workers.has(hashName(kferrors.SanitizeWorker(root.Failure.Worker))) {
			workers--
		}
		what := Plural(workers, "other worker", "other workers")
		if t.workers.full {
			what = "at least " + what
		}
		if others != workers || t.workers.full {
			what += ", " + Plural(others, "other document", "other documents")
		}
		parts = append(parts, fmt.Sprintf("Also failed: %s (%s).", what, strings.Join(items, ", ")))
	}
	if vanished > 0 {
		parts = append(parts, fmt.Sprintf("Skipped %s.", Plural(vanished, "document that vanished while read", "documents that vanished while read")))
	}
	if displaced != nil {
		who := displaced.Failure.Worker
		if who == "" {
			who = displaced.Key
		}
		code, _ := Shown(displaced.Failure.Code, "")
		return strings.Join(parts, " ") + fmt.Sprintf(" Hardware fault shown: it explains the earlier %s of %s at %s.",
			tallyCode(code), who, displaced.Time().UTC().Format(TimeLayout))
	}
	if len(parts) == 0 {
		return ""
	}
	return strings.Join(parts, " ") + " Earliest failure shown."
}

// tallyCode is the name a code is counted under: "no code" for none, at
// most maxTallyCodeBytes of it (a hostile code may be a megabyte).
func tallyCode(code string) string {
	switch {
	case code == "":
		return "no code"
	case len(code) > maxTallyCodeBytes:
		return kferrors.CapMessage(code, maxTallyCodeBytes-len("…")) + "…"
	}
	return code
}

// PodOf is the pod a document's worker belongs to, in the sanitized form
// that names carry (kferrors.SanitizeWorker): the worker itself, or without
// its local rank for "<pod>/<local rank>" (sanitized "<pod>.<rank>").
func PodOf(worker string) string { return kferrors.PodOfSanitized(kferrors.SanitizeWorker(worker)) }

// hashCounts is a set of names, kept as 64-bit hashes with a count each so
// that a name can be taken back, and at most MaxTallyWorkers of them. A
// collision of two names among 2^14 has a chance of about 2^-37.
type hashCounts struct {
	m map[uint64]int32
	// full: a name was refused for want of room; len is a lower bound.
	full bool
}

func (s *hashCounts) add(h uint64, n int32) {
	c, ok := s.m[h]
	switch {
	case n < 0 && !ok:
		return
	case !ok && len(s.m) >= MaxTallyWorkers:
		s.full = true
		return
	}
	if s.m == nil {
		s.m = map[uint64]int32{}
	}
	if c += n; c <= 0 {
		delete(s.m, h)
		return
	}
	s.m[h] = c
}

func (s *hashCounts) has(h uint64) bool { return s.m[h] > 0 }
func (s *hashCounts) len() int          { return len(s.m) }
func (s *hashCounts) clone() hashCounts { return hashCounts{m: maps.Clone(s.m), full: s.full} }

// hashName is FNV-1a, 64 bits.
func hashName(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return h
}

// Plural is "1 <one>" or "<n> <many>".
func Plural(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}

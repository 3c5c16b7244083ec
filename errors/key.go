package errors

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Object names. Ours are error-<19-digit UTC ns>-<worker>-<random>.pb so a
// lexicographic listing is a time-ordered one; flytekit's are
// error-<uuid hex>.pb and the legacy single document is error.pb.
const (
	KeyPrefix   = "error"
	KeySuffix   = ".pb"
	LegacyKey   = "error.pb"
	maxWorkerIn = 64
	tsDigits    = 19
)

// NewKey names a document written at t by worker. random must be unique per
// writer (NewKey's callers use RandomSuffix). A time UsableTime refuses is
// named as 0 ns, which TimeFromKey does not read as a time: such a document
// is always opened, never ranked by its name.
func NewKey(t time.Time, worker, random string) string {
	var ns int64
	if UsableTime(t) {
		ns = t.UnixNano()
	}
	return fmt.Sprintf("%s-%0*d-%s-%s%s", KeyPrefix, tsDigits, ns, SanitizeWorker(worker), random, KeySuffix)
}

// HardwareKeyMark begins the random element of a hardware fault's key
// (DocumentKey): never hex, so no other key of ours carries it.
const HardwareKeyMark = "hw"

// DocumentKey names f's document: NewKey, with the random element marked
// (HardwareKeyMark) when f's code is a hardware fault (IsHardwareCode).
// Readers open a marked document whatever the time its name says
// (IsHardwareKey): a hardware fault takes precedence over the peers'
// secondary failures dated before it (docs/DESIGN.md §3), which a reader
// ranking unopened documents by their names would never weigh against it.
func DocumentKey(f Failure, random string) string {
	if IsHardwareCode(f.Code) {
		random = HardwareKeyMark + random
	}
	return NewKey(f.Time, f.Worker, random)
}

// IsHardwareKey reports whether key is one of ours that DocumentKey marked
// as a hardware fault's.
func IsHardwareKey(key string) bool {
	if _, ok := TimeFromKey(key); !ok {
		return false
	}
	rest := strings.TrimSuffix(key, KeySuffix)
	return strings.HasPrefix(rest[strings.LastIndexByte(rest, '-')+1:], HardwareKeyMark)
}

// RandomSuffix returns 16 hex characters from crypto/rand.
func RandomSuffix() string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // never fails on Linux (crypto/rand panics instead)
	return hex.EncodeToString(b[:])
}

// SanitizeWorker turns a worker name (a pod name, maybe "<pod>/<local rank>",
// maybe hostile) into a key element: letters, digits, '.', '_' and '-' only,
// '/' becomes '.', other bytes '_', no leading dots, at most 64 bytes. It can
// never produce a path separator or "..".
func SanitizeWorker(worker string) string {
	var b strings.Builder
	for i := 0; i < len(worker) && b.Len() < maxWorkerIn; i++ {
		c := worker[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '_', c == '-':
			b.WriteByte(c)
		case c == '/' || c == '.':
			b.WriteByte('.')
		default:
			b.WriteByte('_')
		}
	}
	s := strings.ReplaceAll(b.String(), "..", "._")
	s = strings.TrimLeft(s, ".")
	if s == "" {
		return "unknown"
	}
	return s
}

// IsDocumentKey reports whether a key (relative to the output prefix) names an
// error document: error.pb or error<anything>.pb, as upstream lists them.
func IsDocumentKey(key string) bool {
	return strings.HasPrefix(key, KeyPrefix) && strings.HasSuffix(key, KeySuffix) && !strings.Contains(key, "/")
}

// TimeFromKey returns the time encoded in one of our own key names, or false
// for keys named otherwise (flytekit's, the legacy one) and for a name whose
// time UsableTime refuses.
func TimeFromKey(key string) (time.Time, bool) {
	rest, ok := strings.CutPrefix(key, KeyPrefix+"-")
	if !ok || len(rest) < tsDigits+1 || rest[tsDigits] != '-' {
		return time.Time{}, false
	}
	// Digits only (ParseInt would take a sign): key order must be time order.
	for i := range tsDigits {
		if rest[i] < '0' || rest[i] > '9' {
			return time.Time{}, false
		}
	}
	ns, err := strconv.ParseInt(rest[:tsDigits], 10, 64)
	if err != nil || ns <= 0 {
		return time.Time{}, false
	}
	t := time.Unix(0, ns).UTC()
	return t, UsableTime(t)
}

// WorkerFromKey returns the sanitized worker element of one of our keys
// (error-<ns>-<worker>-<random>.pb; see SanitizeWorker), or "" for keys named
// otherwise. Workers may contain dashes (pod names do): the random part is
// the last dash-separated element.
func WorkerFromKey(key string) string {
	if _, ok := TimeFromKey(key); !ok {
		return ""
	}
	rest := strings.TrimSuffix(key, KeySuffix)
	const head = len(KeyPrefix) + 1 + tsDigits + 1 // "error-" + ns + "-"
	if len(rest) <= head {
		return ""
	}
	rest = rest[head:]
	i := strings.LastIndexByte(rest, '-')
	if i < 0 {
		return ""
	}
	return rest[:i]
}

// PodOf is the pod of a worker name: the agent names its workers
// "<pod>/<local rank>" (docs/DESIGN.md §2.3); any other name is a pod's own.
func PodOf(worker string) string { return cutRank(worker, '/') }

// PodOfSanitized is PodOf for a sanitized worker name (SanitizeWorker turns
// "<pod>/<rank>" into "<pod>.<rank>"), as our document names carry them.
func PodOfSanitized(worker string) string { return cutRank(worker, '.') }

func cutRank(worker string, sep byte) string {
	i := strings.LastIndexByte(worker, sep)
	if i <= 0 || i == len(worker)-1 {
		return worker
	}
	for _, c := range []byte(worker[i+1:]) {
		if c < '0' || c > '9' {
			return worker
		}
	}
	return worker[:i]
}

package kube

import (
	"encoding/json"
	"math/rand/v2"
	"testing"
	"time"
)

// An event's occurrence and time, from the JSON the API server serves:
// client-go's correlator counts on the core/v1 event (count, lastTimestamp),
// events.k8s.io's recorder in a series (count, lastObservedTime as a
// MicroTime) after a first eventTime.
func TestEventOccurrence(t *testing.T) {
	read := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name, json string
		n          int32
		at         string
	}{
		{"first, legacy", `{"count":1,"firstTimestamp":"2026-12-07T10:00:00Z","lastTimestamp":"2026-12-07T10:00:00Z"}`, 1, "2026-12-07T10:00:00Z"},
		{"again, legacy", `{"count":3,"firstTimestamp":"2026-12-07T10:00:00Z","lastTimestamp":"2026-12-07T11:00:00Z"}`, 3, "2026-12-07T11:00:00Z"},
		{"first, events.k8s.io", `{"eventTime":"2026-12-07T10:00:00.250000Z"}`, 1, "2026-12-07T10:00:00.25Z"},
		{"series", `{"eventTime":"2026-12-07T10:00:00.250000Z","series":{"count":2,"lastObservedTime":"2026-12-07T11:30:00.500000Z"}}`, 2, "2026-12-07T11:30:00.5Z"},
		{"no count, no time", `{"metadata":{"creationTimestamp":"2026-12-07T09:00:00Z"}}`, 1, "2026-12-07T09:00:00Z"},
		{"a clock ahead", `{"count":2,"lastTimestamp":"2026-12-07T13:00:00Z"}`, 2, "2026-12-07T12:00:00Z"},
	} {
		var e event
		if err := json.Unmarshal([]byte(tc.json), &e); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		want, _ := time.Parse(time.RFC3339Nano, tc.at)
		if n, at := e.occurrence(), e.when(read); n != tc.n || !at.Equal(want) {
			t.Errorf("%s: occurrence %d at %s, want %d at %s", tc.name, n, at, tc.n, want)
		}
	}
}

// handled, against a model, on seeded random updates of a few events: an
// occurrence is taken once, only when later than every one taken of its
// event since the event was last deleted; undo gives the mark back.
func TestHandledTakesEachOccurrenceOnce(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	r := rand.New(rand.NewPCG(seed, 7))
	h := handled{}
	model := map[string]int32{}
	uids := []string{"a", "b", "c"}
	for i := range 5000 {
		uid := uids[r.IntN(len(uids))]
		if r.IntN(20) == 0 {
			delete(h, uid) // the watch's DELETED
			delete(model, uid)
			continue
		}
		e := event{Count: int32(r.IntN(6))}
		e.Metadata.UID = uid
		undo, ok := h.take(&e)
		n := max(e.Count, 1)
		prev, had := model[uid]
		if want := !had || n > prev; ok != want {
			t.Fatalf("seed %d, step %d: take(%s #%d) = %v, want %v (last taken #%d, %v)", seed, i, uid, n, ok, want, prev, had)
		}
		if !ok {
			continue
		}
		if r.IntN(4) == 0 { // the pods could not be read: again on the next list
			undo()
			if _, again := h.take(&e); !again {
				t.Fatalf("seed %d, step %d: %s #%d not taken again after undo", seed, i, uid, n)
			}
		}
		model[uid] = n
	}
}

package store

import (
	"bytes"
	"fmt"
	"slices"
	"sort"
)

// KV is the durable record of one key: its value, or that it is gone.
type KV struct {
	Key     string
	Value   []byte
	Deleted bool
}

// Session is the durable record of one client's session.
type Session struct {
	Client string
	Seq    uint64
	Result Result
	Closed bool
}

// changeSet is what changed since the last TakeChanges.
type changeSet struct {
	keys     []string // in the order first changed
	keySeen  map[string]struct{}
	sessions map[string]*session // the latest struct of each changed client, evicted ones included
}

func newChangeSet() changeSet {
	return changeSet{keySeen: map[string]struct{}{}, sessions: map[string]*session{}}
}

func (c *changeSet) key(k string) {
	if _, ok := c.keySeen[k]; !ok {
		c.keySeen[k] = struct{}{}
		c.keys = append(c.keys, k)
	}
}

func (c *changeSet) session(s *session) { c.sessions[s.client] = s }

// TakeChanges returns the records changed since the last call, each in its
// current state, and forgets them: one batch for the master's log.
//
// Keys come in the order they were first changed; sessions in the order of
// their last change, oldest first, which Restore reads as recency. A session
// evicted since the last call is still reported (closed, as it was evicted),
// so that no earlier record showing it open outlives it.
func (s *Store) TakeChanges() ([]KV, []Session) {
	kvs := make([]KV, 0, len(s.changes.keys))
	for _, k := range s.changes.keys {
		kvs = append(kvs, s.kvRecord(k))
	}
	sessions := make([]*session, 0, len(s.changes.sessions))
	for _, sess := range s.changes.sessions {
		sessions = append(sessions, sess)
	}
	s.changes = newChangeSet()
	return kvs, sessionRecords(sessions)
}

// Snapshot returns every record: keys in byte order, sessions least recently
// used first. It changes nothing, the pending changes included.
func (s *Store) Snapshot() ([]KV, []Session) {
	keys := make([]string, 0, len(s.data))
	for k := range s.data {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	kvs := make([]KV, len(keys))
	for i, k := range keys {
		kvs[i] = s.kvRecord(k)
	}
	sessions := make([]*session, 0, s.sessions.len())
	for _, sess := range s.sessions.byClient {
		sessions = append(sessions, sess)
	}
	return kvs, sessionRecords(sessions)
}

func (s *Store) kvRecord(k string) KV {
	v, ok := s.data[k]
	if !ok {
		return KV{Key: k, Deleted: true}
	}
	return KV{Key: k, Value: bytes.Clone(nonNil(v))}
}

// sessionRecords sorts sessions by last use and copies them out.
func sessionRecords(sessions []*session) []Session {
	sort.Slice(sessions, func(i, j int) bool { return sessions[i].lastUse < sessions[j].lastUse })
	out := make([]Session, len(sessions))
	for i, sess := range sessions {
		out[i] = Session{Client: sess.client, Seq: sess.seq, Result: sess.result.clone(), Closed: sess.closed}
	}
	return out
}

// Restore loads records into an empty store: those of the newest snapshot,
// then those of each later log batch, in the order they were produced. The
// last record of a key or client wins, and the order of clients' last
// records is their recency.
//
// Every record must be within the limits (ErrTooLarge, ErrInvalid), and so
// must the result — except the session count: eviction leaves records of
// evicted sessions in older batches, so Restore evicts the least recently
// used closed sessions again until MaxSessions hold, which reproduces the
// live store's choice. All or nothing: on error the store stays empty.
func (s *Store) Restore(kvs []KV, sessions []Session) error {
	if len(s.data) > 0 || s.sessions.len() > 0 {
		return fmt.Errorf("restore: %w: into a store that holds %d keys and %d sessions", ErrInvalid, len(s.data), s.sessions.len())
	}
	r := New(s.limits)
	for i, kv := range kvs {
		if err := r.checkKey(kv.Key); err != nil {
			return fmt.Errorf("restore: key record %d: %w", i, err)
		}
		if kv.Deleted {
			delete(r.data, kv.Key)
			continue
		}
		if err := r.checkValue("value", kv.Key, len(kv.Value)); err != nil {
			return fmt.Errorf("restore: key record %d: %w", i, err)
		}
		r.data[kv.Key] = bytes.Clone(nonNil(kv.Value))
	}
	if len(r.data) > r.limits.MaxKeys {
		return fmt.Errorf("restore: %w: %d keys, the limit is %d", ErrTooLarge, len(r.data), r.limits.MaxKeys)
	}
	for i, rec := range sessions {
		if err := r.checkSessionRecord(rec); err != nil {
			return fmt.Errorf("restore: session record %d: %w", i, err)
		}
		r.sessions.put(rec.Client, rec.Seq, rec.Result.clone(), rec.Closed)
	}
	for r.sessions.len() > r.limits.MaxSessions {
		victim := r.sessions.oldestClosed()
		if victim == nil {
			return fmt.Errorf("restore: %w: %d sessions open, the limit is %d", ErrTooLarge, r.sessions.len(), r.limits.MaxSessions)
		}
		r.sessions.remove(victim)
	}
	for k, v := range r.data {
		r.bytes += int64(len(k)) + int64(len(v))
	}
	for _, sess := range r.sessions.byClient {
		r.bytes += sess.bytes()
	}
	if r.bytes > r.limits.MaxTotalBytes {
		return fmt.Errorf("restore: %w: the records hold %d bytes, the limit is %d", ErrTooLarge, r.bytes, r.limits.MaxTotalBytes)
	}
	*s = *r
	return nil
}

func (s *Store) checkSessionRecord(rec Session) error {
	if err := checkClient(rec.Client, rec.Seq); err != nil {
		return err
	}
	// A recorded result is a mutation's: at most one value (COMPARE_SET's).
	if len(rec.Result.Values) > 0 {
		return fmt.Errorf("%w: client %s: a recorded result with %d values", ErrInvalid, quote(rec.Client), len(rec.Result.Values))
	}
	if n := len(rec.Result.Value); n > s.limits.MaxValue {
		return fmt.Errorf("%w: client %s: recorded value of %d bytes, the limit is %d", ErrTooLarge, quote(rec.Client), n, s.limits.MaxValue)
	}
	return nil
}

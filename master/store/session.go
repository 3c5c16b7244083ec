package store

// session is what the store remembers of a client for exactly-once: the last
// mutation's seq and result.
type session struct {
	client string
	seq    uint64
	result Result // owned by the store; handed out as clones
	closed bool
	// lastUse orders sessions by their last change (a mutation recorded or
	// the session closed). It is a counter, not a time: the store has no
	// clock.
	lastUse uint64
	// prev and next link the closed sessions, least recently used first.
	prev, next *session
}

func (s *session) bytes() int64 { return sessionBytes(s.client, s.result) }

// sessionBytes is what a session record adds to the store's payload.
func sessionBytes(client string, r Result) int64 { return int64(len(client)) + r.bytes() }

// sessionTable holds the sessions and, among them, a list of the closed ones
// in the order they would be evicted.
type sessionTable struct {
	byClient               map[string]*session
	uses                   uint64
	closedHead, closedTail *session
}

func newSessionTable() sessionTable {
	return sessionTable{byClient: map[string]*session{}}
}

func (t *sessionTable) get(client string) *session { return t.byClient[client] }

func (t *sessionTable) len() int { return len(t.byClient) }

// oldestClosed is the session to evict first, or nil when all are open.
func (t *sessionTable) oldestClosed() *session { return t.closedHead }

// record notes a mutation applied for client, creating or reopening its
// session, and returns the session.
func (t *sessionTable) record(client string, seq uint64, result Result) *session {
	return t.put(client, seq, result, false)
}

// close marks an open session closed; it becomes the most recently used of
// the closed.
func (t *sessionTable) close(s *session) {
	t.uses++
	s.lastUse = t.uses
	s.closed = true
	t.pushClosed(s)
}

// put sets client's session as given and makes it the most recently used.
func (t *sessionTable) put(client string, seq uint64, result Result, closed bool) *session {
	s := t.byClient[client]
	if s == nil {
		s = &session{client: client}
		t.byClient[client] = s
	} else if s.closed {
		t.unlinkClosed(s)
	}
	t.uses++
	s.seq, s.result, s.closed, s.lastUse = seq, result, closed, t.uses
	if closed {
		t.pushClosed(s)
	}
	return s
}

// remove forgets a session (eviction).
func (t *sessionTable) remove(s *session) {
	if s.closed {
		t.unlinkClosed(s)
	}
	delete(t.byClient, s.client)
}

func (t *sessionTable) pushClosed(s *session) {
	s.prev, s.next = t.closedTail, nil
	if t.closedTail != nil {
		t.closedTail.next = s
	} else {
		t.closedHead = s
	}
	t.closedTail = s
}

func (t *sessionTable) unlinkClosed(s *session) {
	if s.prev != nil {
		s.prev.next = s.next
	} else {
		t.closedHead = s.next
	}
	if s.next != nil {
		s.next.prev = s.prev
	} else {
		t.closedTail = s.prev
	}
	s.prev, s.next = nil, nil
}

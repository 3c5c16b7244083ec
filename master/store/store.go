package store

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"strconv"
)

// Errors, to be classified with errors.Is. Each error Apply or Restore returns
// wraps exactly one of them and says what was wrong and which limit applied;
// no message contains a value's bytes.
var (
	// ErrNotFound: GET or MULTI_GET of a missing key.
	ErrNotFound = errors.New("store: key not found")
	// ErrInvalid: a request that can never succeed as sent — an unknown op,
	// an empty key, a MULTI_SET with more keys than values, a mutation
	// without a client id or with seq 0, an ADD that overflows int64.
	ErrInvalid = errors.New("store: invalid request")
	// ErrTooLarge: a key, value, count or total over its limit (gRPC
	// RESOURCE_EXHAUSTED).
	ErrTooLarge = errors.New("store: over a limit")
	// ErrReplayed: a mutation whose seq is below its session's last, or not
	// above the last of a closed session.
	ErrReplayed = errors.New("store: replayed sequence number")
	// ErrNotInteger: ADD on a value that torch's std::stoll would reject.
	ErrNotInteger = errors.New("store: value is not a decimal integer")
)

// MaxClientID is the longest client id accepted, in bytes. It fits a pod name
// (≤ 253), an incarnation id and a connection counter with room to spare.
const MaxClientID = 1024

// Limits bound what the store holds, so that a misbehaving worker cannot
// exhaust the master's memory or make its snapshot unwritable. A zero (or
// negative) field takes the default of the same name.
type Limits struct {
	MaxKey        int   // bytes in a key
	MaxValue      int   // bytes in a value, after APPEND too
	MaxTotalBytes int64 // keys + values + client ids + recorded results
	MaxKeys       int   // keys in the store
	MaxMulti      int   // keys in one CHECK, MULTI_GET or MULTI_SET
	MaxSessions   int   // client sessions remembered, open and closed
}

// Defaults, and why each is what it is.
const (
	// DefaultMaxKey: torch's keys are short paths ("/torch.rendezvous.<id>",
	// "<prefix>/<rank>"); 4 KiB leaves room for nested PrefixStores and long
	// run ids.
	DefaultMaxKey = 4 << 10
	// DefaultMaxValue: torch's own values are at most a few hundred KB (the
	// pickled rendezvous state grows with the node count), but workers may
	// put their own blobs in the store; 64 MiB admits those and stays an
	// eighth of the total.
	DefaultMaxValue = 64 << 20
	// DefaultMaxTotalBytes: a snapshot carries everything the store holds in
	// one state file, and the durability layer caps a state file at 1 GiB;
	// half of that leaves room for framing and the master's other records.
	DefaultMaxTotalBytes = 512 << 20
	// DefaultMaxKeys: a few keys per rank per round for jobs of 10⁴ ranks
	// over many rounds (torch never deletes old rounds' keys); ~1M entries
	// cost ~100 MiB of map overhead at worst.
	DefaultMaxKeys = 1 << 20
	// DefaultMaxMulti: multi-key ops carry one key per node
	// (_assign_worker_ranks); 65536 covers the largest jobs.
	DefaultMaxMulti = 1 << 16
	// DefaultMaxSessions: one session per relayed TCPStore connection —
	// an agent's plus, with the agent store, each worker's — e.g. 8k nodes
	// × 8 workers; closed ones are evicted first.
	DefaultMaxSessions = 1 << 16
)

func (l Limits) withDefaults() Limits {
	if l.MaxKey <= 0 {
		l.MaxKey = DefaultMaxKey
	}
	if l.MaxValue <= 0 {
		l.MaxValue = DefaultMaxValue
	}
	if l.MaxTotalBytes <= 0 {
		l.MaxTotalBytes = DefaultMaxTotalBytes
	}
	if l.MaxKeys <= 0 {
		l.MaxKeys = DefaultMaxKeys
	}
	if l.MaxMulti <= 0 {
		l.MaxMulti = DefaultMaxMulti
	}
	if l.MaxSessions <= 0 {
		l.MaxSessions = DefaultMaxSessions
	}
	return l
}

// Kind is a store operation. The zero Kind is invalid, so that an Op built
// from a request with no operation set is refused rather than guessed.
type Kind int

// The operations, named after torch's commands. WAIT is CHECK plus the
// loop's parking (see Ready); PING and VALIDATE never reach the store.
const (
	Set        Kind = iota + 1 // Key, Value
	Get                        // Key → Value
	Add                        // Key, Delta → Number
	CompareSet                 // Key, Expected, Desired → Value
	Check                      // Keys → OK
	Delete                     // Key → OK, Number (0 or 1)
	NumKeys                    // → Number
	Append                     // Key, Value
	MultiGet                   // Keys → Values
	MultiSet                   // Keys, Values
)

var kindNames = [...]string{
	Set: "SET", Get: "GET", Add: "ADD", CompareSet: "COMPARE_SET", Check: "CHECK",
	Delete: "DELETE_KEY", NumKeys: "GETNUMKEYS", Append: "APPEND",
	MultiGet: "MULTI_GET", MultiSet: "MULTI_SET",
}

func (k Kind) valid() bool { return k >= Set && k <= MultiSet }

// String is torch's name of the command.
func (k Kind) String() string {
	if !k.valid() {
		return fmt.Sprintf("Kind(%d)", int(k))
	}
	return kindNames[k]
}

// Mutates reports whether the operation may change the store: those need a
// session and a seq, are recorded for exactly-once, and their reply must wait
// until the change is durable.
func (k Kind) Mutates() bool {
	switch k {
	case Set, Add, CompareSet, Delete, Append, MultiSet:
		return true
	}
	return false
}

// Op is one operation; which fields it reads depends on Kind (see the Kind
// constants). The store copies what it keeps: the caller may reuse the slices.
type Op struct {
	Kind     Kind
	Key      string
	Keys     []string
	Value    []byte
	Expected []byte
	Desired  []byte
	Values   [][]byte
	Delta    int64
}

// Result is an operation's answer; the fields that Kind does not set are zero.
// Its slices belong to the caller.
type Result struct {
	Value  []byte
	Values [][]byte
	Number int64
	OK     bool
}

// Store is the key-value store. It is not safe for concurrent use: one loop
// owns it.
type Store struct {
	limits Limits
	data   map[string][]byte
	// bytes is the payload held: keys, values, and for every session its
	// client id and recorded result (what a snapshot writes).
	bytes    int64
	sessions sessionTable
	changes  changeSet
}

// New returns an empty store with the given limits (zero fields: defaults).
func New(l Limits) *Store {
	return &Store{
		limits:   l.withDefaults(),
		data:     map[string][]byte{},
		sessions: newSessionTable(),
		changes:  newChangeSet(),
	}
}

// Limits returns the limits in force, defaults filled in; the gRPC layer
// sizes its messages by them.
func (s *Store) Limits() Limits { return s.limits }

// Len is the number of keys, as GETNUMKEYS reports it.
func (s *Store) Len() int { return len(s.data) }

// Bytes is the payload the store holds: keys, values, client ids and
// recorded results. MaxTotalBytes bounds it.
func (s *Store) Bytes() int64 { return s.bytes }

// Ready reports whether every key exists: torch's CHECK, and the condition
// that ends a WAIT. It validates nothing: validate a WAIT's keys once with
// Apply(Check) before parking it, then call Ready on each wake-up.
func (s *Store) Ready(keys []string) bool {
	for _, k := range keys {
		if _, ok := s.data[k]; !ok {
			return false
		}
	}
	return true
}

// Apply runs one operation for the session client and returns its result and
// the keys it wrote or deleted (each once, in the order first written), whose
// waiters the loop should re-check.
//
// Reads (Get, Check, NumKeys, MultiGet) ignore client and seq. Mutations need
// a client id and a seq ≥ 1 that grows per client (gaps are fine):
//   - seq above the session's last: applied, and on success recorded as the
//     session's last seq and result; a failed mutation changed nothing and is
//     not recorded, so its retry runs afresh;
//   - seq equal to the last: a retry, answered with the recorded result and
//     not applied again (whatever the op says);
//   - seq below the last, or not above the last of a closed session:
//     ErrReplayed.
//
// A mutation is all or nothing: every check happens before the first write.
func (s *Store) Apply(client string, seq uint64, op Op) (res Result, touched []string, err error) {
	if !op.Kind.valid() {
		return Result{}, nil, fmt.Errorf("%w: unknown operation %v", ErrInvalid, op.Kind)
	}
	if !op.Kind.Mutates() {
		res, err = s.read(op)
		return res, nil, err
	}
	if err := checkClient(client, seq); err != nil {
		return Result{}, nil, fmt.Errorf("%v: %w", op.Kind, err)
	}
	sess := s.sessions.get(client)
	if sess != nil {
		switch {
		case seq < sess.seq:
			return Result{}, nil, fmt.Errorf("%v: %w: seq %d of client %s is below its last, %d",
				op.Kind, ErrReplayed, seq, quote(client), sess.seq)
		case seq == sess.seq && sess.closed:
			return Result{}, nil, fmt.Errorf("%v: %w: seq %d of closed client %s is not above its last, %d",
				op.Kind, ErrReplayed, seq, quote(client), sess.seq)
		case seq == sess.seq:
			return sess.result.clone(), nil, nil
		}
	}

	p, err := s.plan(op)
	if err != nil {
		return Result{}, nil, fmt.Errorf("%v: %w", op.Kind, err)
	}

	// The session's record replaces the old one; a new session may need a
	// closed one evicted to make room.
	var victim *session
	if sess == nil && s.sessions.len() >= s.limits.MaxSessions {
		victim = s.sessions.oldestClosed()
		if victim == nil {
			return Result{}, nil, fmt.Errorf("%v: %w: no session for client %s: %d sessions open, the limit is %d, none closed to evict",
				op.Kind, ErrTooLarge, quote(client), s.sessions.len(), s.limits.MaxSessions)
		}
	}
	total := s.bytes + p.bytesDelta + sessionBytes(client, p.result)
	if sess != nil {
		total -= sess.bytes()
	}
	if victim != nil {
		total -= victim.bytes()
	}
	if total > s.limits.MaxTotalBytes {
		return Result{}, nil, fmt.Errorf("%v: %w: the store would hold %d bytes, the limit is %d",
			op.Kind, ErrTooLarge, total, s.limits.MaxTotalBytes)
	}
	if n := len(s.data) + p.newKeys; n > s.limits.MaxKeys {
		return Result{}, nil, fmt.Errorf("%v: %w: the store would hold %d keys, the limit is %d",
			op.Kind, ErrTooLarge, n, s.limits.MaxKeys)
	}

	// Commit: nothing below can fail.
	for _, w := range p.writes {
		if w.deleted {
			delete(s.data, w.key)
		} else {
			s.data[w.key] = w.value
		}
		s.changes.key(w.key)
		touched = append(touched, w.key)
	}
	if victim != nil {
		s.sessions.remove(victim)
	}
	sess = s.sessions.record(client, seq, p.result)
	s.changes.session(sess)
	s.bytes = total
	return p.result.clone(), touched, nil
}

// CloseSession marks a client's session closed: its record stays (so a late
// retry is refused rather than applied again) but it becomes the first to be
// evicted when sessions run out. Unknown and already closed clients are left
// as they are.
func (s *Store) CloseSession(client string) {
	sess := s.sessions.get(client)
	if sess == nil || sess.closed {
		return
	}
	s.sessions.close(sess)
	s.changes.session(sess)
}

func checkClient(client string, seq uint64) error {
	switch {
	case client == "":
		return fmt.Errorf("%w: a mutation needs a client id", ErrInvalid)
	case len(client) > MaxClientID:
		return fmt.Errorf("%w: client id of %d bytes, the limit is %d", ErrInvalid, len(client), MaxClientID)
	case seq == 0:
		return fmt.Errorf("%w: a mutation needs seq ≥ 1 (client %s)", ErrInvalid, quote(client))
	}
	return nil
}

// read answers Get, Check, NumKeys and MultiGet.
func (s *Store) read(op Op) (Result, error) {
	switch op.Kind {
	case Get:
		if err := s.checkKey(op.Key); err != nil {
			return Result{}, fmt.Errorf("%v: %w", op.Kind, err)
		}
		v, ok := s.data[op.Key]
		if !ok {
			return Result{}, fmt.Errorf("%v: %w: %s", op.Kind, ErrNotFound, quote(op.Key))
		}
		return Result{Value: bytes.Clone(nonNil(v))}, nil
	case Check:
		if err := s.checkKeys(op.Keys); err != nil {
			return Result{}, fmt.Errorf("%v: %w", op.Kind, err)
		}
		return Result{OK: s.Ready(op.Keys)}, nil
	case NumKeys:
		return Result{Number: int64(len(s.data))}, nil
	case MultiGet:
		if err := s.checkKeys(op.Keys); err != nil {
			return Result{}, fmt.Errorf("%v: %w", op.Kind, err)
		}
		values := make([][]byte, len(op.Keys))
		for i, k := range op.Keys {
			v, ok := s.data[k]
			if !ok {
				return Result{}, fmt.Errorf("%v: %w: key %d of %d, %s", op.Kind, ErrNotFound, i+1, len(op.Keys), quote(k))
			}
			values[i] = bytes.Clone(nonNil(v))
		}
		return Result{Values: values}, nil
	}
	panic("store: read of a mutation " + op.Kind.String())
}

// plan is a mutation worked out but not yet applied.
type plan struct {
	writes     []write // each key once, in the order first written
	result     Result  // owned by the store once committed
	bytesDelta int64   // change in key and value bytes
	newKeys    int     // keys created
}

type write struct {
	key     string
	value   []byte // owned by the store; never modified once stored
	deleted bool
}

// put plans storing value under key.
func (s *Store) put(p *plan, key string, value []byte) {
	old, exists := s.data[key]
	if exists {
		p.bytesDelta += int64(len(value)) - int64(len(old))
	} else {
		p.bytesDelta += int64(len(key)) + int64(len(value))
		p.newKeys++
	}
	p.writes = append(p.writes, write{key: key, value: value})
}

// plan validates a mutation against the limits and the current data and
// works out its writes and result, copying every input it keeps.
func (s *Store) plan(op Op) (*plan, error) {
	p := &plan{}
	if op.Kind != MultiSet {
		if err := s.checkKey(op.Key); err != nil {
			return nil, err
		}
	}
	switch op.Kind {
	case Set:
		if err := s.checkValue("value", op.Key, len(op.Value)); err != nil {
			return nil, err
		}
		s.put(p, op.Key, bytes.Clone(nonNil(op.Value)))

	case Add:
		var current int64
		if old, ok := s.data[op.Key]; ok {
			n, err := parseLikeStoll(old)
			if err != nil {
				return nil, fmt.Errorf("%w: key %s holds %d bytes: %v", ErrNotInteger, quote(op.Key), len(old), err)
			}
			current = n
		}
		if (op.Delta > 0 && current > math.MaxInt64-op.Delta) || (op.Delta < 0 && current < math.MinInt64-op.Delta) {
			return nil, fmt.Errorf("%w: %d + %d overflows int64 (key %s)", ErrInvalid, current, op.Delta, quote(op.Key))
		}
		sum := current + op.Delta
		v := strconv.AppendInt(nil, sum, 10)
		if err := s.checkValue("sum", op.Key, len(v)); err != nil {
			return nil, err
		}
		s.put(p, op.Key, v)
		p.result.Number = sum

	case CompareSet:
		if err := s.checkValue("expected value", op.Key, len(op.Expected)); err != nil {
			return nil, err
		}
		if err := s.checkValue("desired value", op.Key, len(op.Desired)); err != nil {
			return nil, err
		}
		old, exists := s.data[op.Key]
		switch {
		case !exists && len(op.Expected) == 0, exists && bytes.Equal(old, op.Expected):
			desired := bytes.Clone(nonNil(op.Desired))
			s.put(p, op.Key, desired)
			p.result.Value = bytes.Clone(desired)
		case !exists:
			// torch answers expected here, though nothing is stored ("lying
			// to the caller", says its source); c10d's rendezvous relies on
			// the reply differing from desired.
			p.result.Value = bytes.Clone(op.Expected)
		default:
			p.result.Value = bytes.Clone(old)
		}

	case Delete:
		if old, ok := s.data[op.Key]; ok {
			p.writes = append(p.writes, write{key: op.Key, deleted: true})
			p.bytesDelta -= int64(len(op.Key)) + int64(len(old))
			p.newKeys--
			p.result = Result{OK: true, Number: 1}
		}

	case Append:
		old := s.data[op.Key]
		if err := s.checkValue("appended value", op.Key, len(old)+len(op.Value)); err != nil {
			return nil, err
		}
		// A fresh slice: stored values are never modified in place.
		v := make([]byte, 0, len(old)+len(op.Value))
		v = append(append(v, old...), op.Value...)
		s.put(p, op.Key, v)

	case MultiSet:
		if len(op.Keys) != len(op.Values) {
			return nil, fmt.Errorf("%w: %d keys but %d values", ErrInvalid, len(op.Keys), len(op.Values))
		}
		if err := s.checkKeys(op.Keys); err != nil {
			return nil, err
		}
		// torch sets the pairs in order, so a repeated key ends with its
		// last value.
		last := make(map[string]int, len(op.Keys))
		for i, k := range op.Keys {
			if err := s.checkValue("value", k, len(op.Values[i])); err != nil {
				return nil, err
			}
			last[k] = i
		}
		for _, k := range op.Keys {
			if j, first := last[k]; first {
				s.put(p, k, bytes.Clone(nonNil(op.Values[j])))
				delete(last, k)
			}
		}
	}
	return p, nil
}

func (s *Store) checkKey(key string) error {
	if key == "" {
		// torch's client prefixes every key with "/", so an empty key is a
		// request built without one.
		return fmt.Errorf("%w: empty key", ErrInvalid)
	}
	if len(key) > s.limits.MaxKey {
		return fmt.Errorf("%w: key %s is %d bytes, the limit is %d", ErrTooLarge, quote(key), len(key), s.limits.MaxKey)
	}
	return nil
}

func (s *Store) checkKeys(keys []string) error {
	if len(keys) > s.limits.MaxMulti {
		return fmt.Errorf("%w: %d keys in one operation, the limit is %d", ErrTooLarge, len(keys), s.limits.MaxMulti)
	}
	for _, k := range keys {
		if err := s.checkKey(k); err != nil {
			return err
		}
	}
	return nil
}

func (s *Store) checkValue(what, key string, n int) error {
	if n > s.limits.MaxValue {
		return fmt.Errorf("%w: %s for key %s is %d bytes, the limit is %d", ErrTooLarge, what, quote(key), n, s.limits.MaxValue)
	}
	return nil
}

// parseLikeStoll reads a value as torch's std::stoll does (base 10, C
// locale): leading white space, an optional sign, at least one digit, and
// whatever follows the digits ignored. So "12abc" is 12 and " -3" is -3, as
// in torch; "", "abc" and numbers beyond int64 are errors.
func parseLikeStoll(b []byte) (int64, error) {
	i := 0
	for i < len(b) && isCSpace(b[i]) {
		i++
	}
	neg := false
	if i < len(b) && (b[i] == '+' || b[i] == '-') {
		neg = b[i] == '-'
		i++
	}
	start := i
	// Accumulate negatively: the magnitude of MinInt64 exceeds MaxInt64's.
	var n int64
	for ; i < len(b) && b[i] >= '0' && b[i] <= '9'; i++ {
		d := int64(b[i] - '0')
		if n < (math.MinInt64+d)/10 {
			return 0, errors.New("out of int64 range")
		}
		n = n*10 - d
	}
	if i == start {
		return 0, errors.New("no digits")
	}
	if !neg {
		if n == math.MinInt64 {
			return 0, errors.New("out of int64 range")
		}
		n = -n
	}
	return n, nil
}

func isCSpace(c byte) bool {
	return c == ' ' || (c >= '\t' && c <= '\r')
}

// quote renders a key or client id for an error message, shortened: ids are
// names, not secrets, but may be long.
func quote(s string) string {
	const show = 64
	if len(s) <= show {
		return strconv.Quote(s)
	}
	return fmt.Sprintf("%s…(%d bytes)", strconv.Quote(s[:show]), len(s))
}

// nonNil makes an empty value an empty slice, so that a stored empty value
// and a result's are never nil (callers may tell "empty" from "absent").
func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}

func (r Result) clone() Result {
	c := Result{Number: r.Number, OK: r.OK}
	if r.Value != nil {
		c.Value = bytes.Clone(r.Value)
	}
	if r.Values != nil {
		c.Values = make([][]byte, len(r.Values))
		for i, v := range r.Values {
			c.Values[i] = bytes.Clone(nonNil(v))
		}
	}
	return c
}

func (r Result) bytes() int64 {
	n := int64(len(r.Value))
	for _, v := range r.Values {
		n += int64(len(v))
	}
	return n
}

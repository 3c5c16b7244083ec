package store

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"math/big"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// The reference model: the same contract written the dumb way. Each mutation
// works on a deep copy of the whole state, which is kept only if every limit,
// recounted from scratch, still holds; ADD parses with a regexp and
// strconv, and checks overflow with big integers. Where two checks could both
// fail, the contract's order is: op kind; client id, seq; the session's seq;
// the op's own checks in field order (key, then keys, then values); sessions,
// total bytes and key count last.

type refSession struct {
	seq    uint64
	result Result
	closed bool
	use    int
}

type refStore struct {
	lim      Limits
	data     map[string][]byte
	sessions map[string]refSession
	uses     int
}

func newRef(l Limits) *refStore {
	return &refStore{lim: l.withDefaults(), data: map[string][]byte{}, sessions: map[string]refSession{}}
}

func (r *refStore) clone() *refStore {
	c := &refStore{lim: r.lim, data: map[string][]byte{}, sessions: map[string]refSession{}, uses: r.uses}
	for k, v := range r.data {
		c.data[k] = slices.Clone(v)
	}
	for k, v := range r.sessions {
		c.sessions[k] = v
	}
	return c
}

func (r *refStore) total() int64 {
	var n int64
	for k, v := range r.data {
		n += int64(len(k) + len(v))
	}
	for c, s := range r.sessions {
		n += int64(len(c) + len(s.result.Value))
		for _, v := range s.result.Values {
			n += int64(len(v))
		}
	}
	return n
}

var stollPrefix = regexp.MustCompile(`^[ \t\n\v\f\r]*([+-]?[0-9]+)`)

func (r *refStore) keyErr(k string) error {
	if k == "" {
		return ErrInvalid
	}
	if len(k) > r.lim.MaxKey {
		return ErrTooLarge
	}
	return nil
}

func (r *refStore) keysErr(keys []string) error {
	if len(keys) > r.lim.MaxMulti {
		return ErrTooLarge
	}
	for _, k := range keys {
		if err := r.keyErr(k); err != nil {
			return err
		}
	}
	return nil
}

func (r *refStore) apply(client string, seq uint64, op Op) (Result, []string, error) {
	if op.Kind < Set || op.Kind > MultiSet {
		return Result{}, nil, ErrInvalid
	}
	switch op.Kind {
	case Get:
		if err := r.keyErr(op.Key); err != nil {
			return Result{}, nil, err
		}
		v, ok := r.data[op.Key]
		if !ok {
			return Result{}, nil, ErrNotFound
		}
		return Result{Value: slices.Clone(v)}, nil, nil
	case Check:
		if err := r.keysErr(op.Keys); err != nil {
			return Result{}, nil, err
		}
		ok := true
		for _, k := range op.Keys {
			_, has := r.data[k]
			ok = ok && has
		}
		return Result{OK: ok}, nil, nil
	case NumKeys:
		return Result{Number: int64(len(r.data))}, nil, nil
	case MultiGet:
		if err := r.keysErr(op.Keys); err != nil {
			return Result{}, nil, err
		}
		var vs [][]byte
		for _, k := range op.Keys {
			v, ok := r.data[k]
			if !ok {
				return Result{}, nil, ErrNotFound
			}
			vs = append(vs, slices.Clone(v))
		}
		return Result{Values: vs}, nil, nil
	}

	if client == "" || len(client) > MaxClientID || seq == 0 {
		return Result{}, nil, ErrInvalid
	}
	if s, ok := r.sessions[client]; ok {
		if seq < s.seq || (seq == s.seq && s.closed) {
			return Result{}, nil, ErrReplayed
		}
		if seq == s.seq {
			return s.result, nil, nil
		}
	}

	c := r.clone()
	var res Result
	var touched []string
	touch := func(k string) {
		if !slices.Contains(touched, k) {
			touched = append(touched, k)
		}
	}
	if op.Kind != MultiSet {
		if err := r.keyErr(op.Key); err != nil {
			return Result{}, nil, err
		}
	}
	switch op.Kind {
	case Set:
		if len(op.Value) > r.lim.MaxValue {
			return Result{}, nil, ErrTooLarge
		}
		c.data[op.Key] = slices.Clone(op.Value)
		touch(op.Key)
	case Add:
		cur := big.NewInt(0)
		if v, ok := c.data[op.Key]; ok {
			m := stollPrefix.FindSubmatch(v)
			if m == nil {
				return Result{}, nil, ErrNotInteger
			}
			n, err := strconv.ParseInt(string(m[1]), 10, 64)
			if err != nil {
				return Result{}, nil, ErrNotInteger
			}
			cur.SetInt64(n)
		}
		sum := cur.Add(cur, big.NewInt(op.Delta))
		if !sum.IsInt64() {
			return Result{}, nil, ErrInvalid
		}
		text := sum.String()
		if len(text) > r.lim.MaxValue {
			return Result{}, nil, ErrTooLarge
		}
		c.data[op.Key] = []byte(text)
		touch(op.Key)
		res.Number = sum.Int64()
	case CompareSet:
		if len(op.Expected) > r.lim.MaxValue || len(op.Desired) > r.lim.MaxValue {
			return Result{}, nil, ErrTooLarge
		}
		cur, ok := c.data[op.Key]
		if (!ok && len(op.Expected) == 0) || (ok && bytes.Equal(cur, op.Expected)) {
			c.data[op.Key] = slices.Clone(op.Desired)
			touch(op.Key)
			res.Value = slices.Clone(op.Desired)
		} else if !ok {
			res.Value = slices.Clone(op.Expected)
		} else {
			res.Value = slices.Clone(cur)
		}
	case Delete:
		if _, ok := c.data[op.Key]; ok {
			delete(c.data, op.Key)
			touch(op.Key)
			res = Result{OK: true, Number: 1}
		}
	case Append:
		v := append(slices.Clone(c.data[op.Key]), op.Value...)
		if len(v) > r.lim.MaxValue {
			return Result{}, nil, ErrTooLarge
		}
		c.data[op.Key] = v
		touch(op.Key)
	case MultiSet:
		if len(op.Keys) != len(op.Values) {
			return Result{}, nil, ErrInvalid
		}
		if err := r.keysErr(op.Keys); err != nil {
			return Result{}, nil, err
		}
		for i, k := range op.Keys {
			if len(op.Values[i]) > r.lim.MaxValue {
				return Result{}, nil, ErrTooLarge
			}
			c.data[k] = slices.Clone(op.Values[i])
			touch(k)
		}
	}

	if _, ok := c.sessions[client]; !ok && len(c.sessions) >= r.lim.MaxSessions {
		victim, best := "", math.MaxInt
		for id, s := range c.sessions {
			if s.closed && s.use < best {
				victim, best = id, s.use
			}
		}
		if victim == "" {
			return Result{}, nil, ErrTooLarge
		}
		delete(c.sessions, victim)
	}
	c.uses++
	c.sessions[client] = refSession{seq: seq, result: res, use: c.uses}
	if c.total() > r.lim.MaxTotalBytes || len(c.data) > r.lim.MaxKeys {
		return Result{}, nil, ErrTooLarge
	}
	*r = *c
	return res, touched, nil
}

func (r *refStore) close(client string) {
	if s, ok := r.sessions[client]; ok && !s.closed {
		r.uses++
		s.closed, s.use = true, r.uses
		r.sessions[client] = s
	}
}

func refHas(r *refStore, k string) bool {
	_, ok := r.data[k]
	return ok
}

// fuzzLimits are small, so that random ops hit every limit.
var fuzzLimits = Limits{MaxKey: 8, MaxValue: 16, MaxTotalBytes: 120, MaxKeys: 5, MaxMulti: 4, MaxSessions: 3}

// opReader turns fuzz bytes into operations; past the end it reads zeros.
type opReader struct{ b []byte }

func (o *opReader) next() byte {
	if len(o.b) == 0 {
		return 0
	}
	c := o.b[0]
	o.b = o.b[1:]
	return c
}

var (
	fuzzClients = []string{"a", "b", "c", "d", "e", "", strings.Repeat("x", MaxClientID+1)}
	fuzzKeys    = []string{"k0", "k1", "k2", "k3", "k4", "", "12345678", "123456789"}
	fuzzNumbers = []string{"5", "-3", " 7x", "+2", "", "abc", "-", "9223372036854775807",
		"-9223372036854775808", "99999999999999999999", "\t-0012"}
	fuzzDeltas = []int64{0, 1, -1, 5, -7, math.MaxInt64, math.MinInt64, 1 << 40}
)

func (o *opReader) key() string { return fuzzKeys[int(o.next())%len(fuzzKeys)] }

func (o *opReader) value() []byte {
	sel := o.next()
	if sel%4 == 0 {
		return []byte(fuzzNumbers[int(sel/4)%len(fuzzNumbers)])
	}
	n := int(o.next()) % 20
	v := make([]byte, n)
	for i := range v {
		v[i] = o.next()
	}
	return v
}

func (o *opReader) keys() []string {
	n := int(o.next()) % 6
	ks := make([]string, n)
	for i := range ks {
		ks[i] = o.key()
	}
	return ks
}

func (o *opReader) op() Op {
	op := Op{Kind: Kind(o.next() % 12)} // 0 and 11 are invalid
	switch op.Kind {
	case Set, Append:
		op.Key, op.Value = o.key(), o.value()
	case Get, Delete:
		op.Key = o.key()
	case Add:
		op.Key = o.key()
		d := o.next()
		op.Delta = fuzzDeltas[int(d)%len(fuzzDeltas)]
		if d >= 128 {
			op.Delta = int64(int8(o.next()))
		}
	case CompareSet:
		op.Key, op.Expected, op.Desired = o.key(), o.value(), o.value()
		if o.next()%3 == 0 {
			op.Expected = nil
		}
	case Check, MultiGet:
		op.Keys = o.keys()
	case MultiSet:
		op.Keys = o.keys()
		n := len(op.Keys)
		if o.next()%8 == 0 {
			n++
		}
		for range n {
			op.Values = append(op.Values, o.value())
		}
	}
	return op
}

func (o *opReader) seq(last uint64) uint64 {
	switch o.next() % 6 {
	case 0:
		return 0
	case 1:
		return last
	case 2, 3:
		return last + 1
	case 4:
		if last > 0 {
			return last - 1
		}
		return 1
	default:
		return last + uint64(o.next())
	}
}

func errClass(err error) string {
	for _, e := range []error{ErrNotFound, ErrInvalid, ErrTooLarge, ErrReplayed, ErrNotInteger} {
		if errors.Is(err, e) {
			return e.Error()
		}
	}
	if err != nil {
		return "unclassified: " + err.Error()
	}
	return "ok"
}

func sameResult(a, b Result) bool {
	if !bytes.Equal(a.Value, b.Value) || a.Number != b.Number || a.OK != b.OK || len(a.Values) != len(b.Values) {
		return false
	}
	for i := range a.Values {
		if !bytes.Equal(a.Values[i], b.Values[i]) {
			return false
		}
	}
	return true
}

// runOps applies the ops encoded in data to a Store and to the reference and
// fails at the first difference. Along the way it keeps a durable log as the
// master does (TakeChanges batches, now and then replaced by a Snapshot) and
// at the end restores a second store from it, which must equal the first.
func runOps(t *testing.T, data []byte) {
	o := &opReader{b: data}
	s, ref := New(fuzzLimits), newRef(fuzzLimits)
	var logKVs []KV
	var logSessions []Session
	for step := 0; len(o.b) > 0 && step < 500; step++ {
		sel := o.next()
		client := fuzzClients[int(o.next())%len(fuzzClients)]
		switch {
		case sel >= 240:
			s.CloseSession(client)
			ref.close(client)
			continue
		case sel >= 228:
			kvs, sessions := s.TakeChanges()
			logKVs, logSessions = append(logKVs, kvs...), append(logSessions, sessions...)
			if sel >= 234 {
				logKVs, logSessions = s.Snapshot()
			}
			continue
		}
		seq := o.seq(ref.sessions[client].seq)
		op := o.op()
		res, touched, err := s.Apply(client, seq, op)
		wantRes, wantTouched, wantErr := ref.apply(client, seq, op)
		desc := fmt.Sprintf("step %d: client %s seq %d op %+v", step, quote(client), seq, op)
		if errClass(err) != errClass(wantErr) {
			t.Fatalf("%s: error %v, the reference says %v", desc, err, wantErr)
		}
		if err == nil && !sameResult(res, wantRes) {
			t.Fatalf("%s: result %+v, the reference says %+v", desc, res, wantRes)
		}
		if !slices.Equal(touched, wantTouched) {
			t.Fatalf("%s: touched %q, the reference says %q", desc, touched, wantTouched)
		}
		if s.Len() != len(ref.data) || s.Bytes() != ref.total() {
			t.Fatalf("%s: store has %d keys, %d bytes; the reference %d, %d", desc, s.Len(), s.Bytes(), len(ref.data), ref.total())
		}
		if s.Len() > fuzzLimits.MaxKeys || s.Bytes() > fuzzLimits.MaxTotalBytes || s.sessions.len() > fuzzLimits.MaxSessions {
			t.Fatalf("%s: over a limit: %d keys, %d bytes, %d sessions", desc, s.Len(), s.Bytes(), s.sessions.len())
		}
		if k := o.key(); s.Ready([]string{k}) != refHas(ref, k) {
			t.Fatalf("%s: Ready(%q) = %v", desc, k, s.Ready([]string{k}))
		}
	}
	kvs, sessions := s.TakeChanges()
	logKVs, logSessions = append(logKVs, kvs...), append(logSessions, sessions...)
	restored := New(fuzzLimits)
	if err := restored.Restore(logKVs, logSessions); err != nil {
		t.Fatalf("restore from the log: %v", err)
	}
	assertSameStore(t, restored, s)
}

// assertSameStore compares everything observable: records, recency order,
// payload bytes.
func assertSameStore(t *testing.T, got, want *Store) {
	t.Helper()
	gotKVs, gotSessions := got.Snapshot()
	wantKVs, wantSessions := want.Snapshot()
	if !reflect.DeepEqual(gotKVs, wantKVs) {
		t.Fatalf("keys differ:\n got  %+v\n want %+v", gotKVs, wantKVs)
	}
	if !reflect.DeepEqual(gotSessions, wantSessions) {
		t.Fatalf("sessions differ:\n got  %+v\n want %+v", gotSessions, wantSessions)
	}
	if got.Bytes() != want.Bytes() || got.Len() != want.Len() {
		t.Fatalf("got %d keys, %d bytes; want %d, %d", got.Len(), got.Bytes(), want.Len(), want.Bytes())
	}
}

func FuzzApply(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{0, 0, 2, 1, 0, 0, 1, 0, 3, 2, 0, 1, 0, 0, 2, 3, 0, 4})
	f.Add([]byte("\x00\x00\x02\x03\x00\x01\x00\x00\x02\x03\x00\x01\x00\xf0\x00\x00\x01\x02\x0a\x02\x05\xe4\x00"))
	f.Add(bytes.Repeat([]byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 240, 230, 235}, 8))
	f.Fuzz(runOps)
}

// TestAgainstReference runs pseudo-random op sequences through the same
// comparison as FuzzApply, so that plain `go test` covers it.
func TestAgainstReference(t *testing.T) {
	state := uint64(1)
	for range 300 {
		data := make([]byte, 400)
		for i := range data {
			state = state*6364136223846793005 + 1442695040888963407
			data[i] = byte(state >> 56)
		}
		runOps(t, data)
	}
}

package store

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// client drives a store as one relayed connection does: one session, seq
// growing by one per mutation.
type client struct {
	t   *testing.T
	s   *Store
	id  string
	seq uint64
}

func newClient(t *testing.T, s *Store, id string) *client { return &client{t: t, s: s, id: id} }

// do applies op, with the next seq if it is a mutation.
func (c *client) do(op Op) (Result, []string, error) {
	seq := uint64(0)
	if op.Kind.Mutates() {
		c.seq++
		seq = c.seq
	}
	return c.s.Apply(c.id, seq, op)
}

// must applies op and fails the test on an error.
func (c *client) must(op Op) Result {
	c.t.Helper()
	res, _, err := c.do(op)
	if err != nil {
		c.t.Fatalf("%v %q: %v", op.Kind, op.Key, err)
	}
	return res
}

func (c *client) set(k, v string) { c.t.Helper(); c.must(Op{Kind: Set, Key: k, Value: []byte(v)}) }
func (c *client) add(k string, d int64) int64 {
	c.t.Helper()
	return c.must(Op{Kind: Add, Key: k, Delta: d}).Number
}
func (c *client) get(k string) string {
	c.t.Helper()
	return string(c.must(Op{Kind: Get, Key: k}).Value)
}
func (c *client) numKeys() int64 { c.t.Helper(); return c.must(Op{Kind: NumKeys}).Number }
func (c *client) check(keys ...string) bool {
	c.t.Helper()
	return c.must(Op{Kind: Check, Keys: keys}).OK
}
func (c *client) compareSet(k, expected, desired string) string {
	c.t.Helper()
	return string(c.must(Op{Kind: CompareSet, Key: k, Expected: []byte(expected), Desired: []byte(desired)}).Value)
}
func (c *client) del(k string) bool { c.t.Helper(); return c.must(Op{Kind: Delete, Key: k}).OK }

func wantErr(t *testing.T, err, want error) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Fatalf("error %v, want %v", err, want)
	}
}

func equal[T any](t *testing.T, what string, got, want T) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("%s = %v, want %v", what, got, want)
	}
}

// torch: StoreTestBase._test_set_get_check.
func TestSetGetCheck(t *testing.T) {
	c := newClient(t, New(Limits{}), "w0")
	c.add("key", 1)
	c.add("key", 2)
	c.add("key", 3)
	c.set("key0", "value0")
	c.add("key3", 1)
	c.set("key1", "value1")
	c.add("key3", 2)
	c.set("key2", "value2")
	for d := int64(3); d <= 6; d++ {
		c.add("key3", d)
	}
	equal(t, "num keys", c.numKeys(), 5)
	equal(t, "key", c.get("key"), "6")
	equal(t, "key0", c.get("key0"), "value0")
	equal(t, "key1", c.get("key1"), "value1")
	equal(t, "key2", c.get("key2"), "value2")
	equal(t, "key3", c.get("key3"), "21")
	equal(t, "check key3", c.check("key3"), true)
	equal(t, "check Randomkey3", c.check("Randomkey3"), false)
	equal(t, "check none", c.check(), true)
	c.set("-key3", "7")
	equal(t, "-key3", c.get("-key3"), "7")
	c.del("-key3")
	equal(t, "num keys", c.numKeys(), 5)
}

// torch: StoreTestBase._test_compare_set, every branch.
func TestCompareSet(t *testing.T) {
	c := newClient(t, New(Limits{}), "w0")
	// Absent, expected not empty: expected comes back, nothing is stored.
	equal(t, "absent, wrong expected", c.compareSet("cs_key0", "wrong_old_value", "new_value0"), "wrong_old_value")
	equal(t, "stored", c.check("cs_key0"), false)
	// Present, different: the current value comes back, unchanged.
	c.set("cs_key0", "value0")
	equal(t, "present, different", c.compareSet("cs_key0", "wrong_old_value", "new_value0"), "value0")
	equal(t, "after", c.get("cs_key0"), "value0")
	// Present, equal: replaced, the new value comes back.
	equal(t, "present, equal", c.compareSet("cs_key0", "value0", "new_value0"), "new_value0")
	equal(t, "after", c.get("cs_key0"), "new_value0")
	// Absent, expected empty: desired is stored and comes back (c10d's setup).
	equal(t, "absent, empty expected", c.compareSet("cs_key1", "", "new_value1"), "new_value1")
	equal(t, "after", c.get("cs_key1"), "new_value1")
	// Present with an empty value, expected empty: that is equal.
	c.set("cs_key2", "")
	equal(t, "present empty, empty expected", c.compareSet("cs_key2", "", "x"), "x")
	// Present, expected empty but value not: no change.
	equal(t, "present, empty expected", c.compareSet("cs_key2", "", "y"), "x")
}

func TestAdd(t *testing.T) {
	c := newClient(t, New(Limits{}), "w0")
	equal(t, "missing is 0", c.add("n", 0), 0)
	equal(t, "stored as decimal", c.get("n"), "0")
	equal(t, "add 5", c.add("n", 5), 5)
	equal(t, "add -7", c.add("n", -7), -2)
	equal(t, "stored negative", c.get("n"), "-2")
	equal(t, "add -3", c.add("n", -3), -5)

	// ADD reads a value as std::stoll does.
	for v, want := range map[string]int64{"41": 42, " \t7": 8, "+2": 3, "-0012": -11, "12abc": 13, "9223372036854775806": math.MaxInt64} {
		c.set("s", v)
		equal(t, fmt.Sprintf("add 1 to %q", v), c.add("s", 1), want)
	}
	for _, v := range []string{"", "abc", "-", " ", "x12", "9223372036854775808", "-9223372036854775809"} {
		c.set("s", v)
		_, _, err := c.do(Op{Kind: Add, Key: "s", Delta: 1})
		wantErr(t, err, ErrNotInteger)
		equal(t, "unchanged", c.get("s"), v)
	}

	// Overflow is refused, not wrapped; the boundaries themselves are fine.
	c.set("m", "9223372036854775807")
	_, _, err := c.do(Op{Kind: Add, Key: "m", Delta: 1})
	wantErr(t, err, ErrInvalid)
	equal(t, "unchanged", c.get("m"), "9223372036854775807")
	c.set("m", "-9223372036854775807")
	equal(t, "to MinInt64", c.add("m", -1), math.MinInt64)
	equal(t, "MinInt64 stored", c.get("m"), "-9223372036854775808")
	_, _, err = c.do(Op{Kind: Add, Key: "m", Delta: -1})
	wantErr(t, err, ErrInvalid)
	_, _, err = c.do(Op{Kind: Add, Key: "fresh", Delta: math.MinInt64})
	if err != nil {
		t.Fatalf("MinInt64 to a missing key: %v", err)
	}
}

// torch: TCPStoreTest._test_numkeys_delkeys (without TCPStore's init key).
func TestNumKeysDelete(t *testing.T) {
	c := newClient(t, New(Limits{}), "w0")
	equal(t, "empty", c.numKeys(), 0)
	c.add("key", 1)
	c.add("key", 2)
	c.add("key", 3)
	c.set("key0", "value0")
	c.add("key3", 1)
	c.set("key1", "value1")
	equal(t, "num keys", c.numKeys(), 4)
	res := c.must(Op{Kind: Delete, Key: "key"})
	equal(t, "delete reply", res, Result{OK: true, Number: 1})
	equal(t, "num keys", c.numKeys(), 3)
	_, _, err := c.do(Op{Kind: Get, Key: "key"})
	wantErr(t, err, ErrNotFound)
	if !strings.Contains(err.Error(), `"key"`) {
		t.Errorf("error %q does not name the key", err)
	}
	c.del("key0")
	c.del("key3")
	equal(t, "num keys", c.numKeys(), 1)
	res = c.must(Op{Kind: Delete, Key: "key3"})
	equal(t, "delete of a missing key", res, Result{})
	c.set("key4", "value2")
	equal(t, "num keys", c.numKeys(), 2)
	equal(t, "key1", c.get("key1"), "value1")
	equal(t, "key4", c.get("key4"), "value2")
}

// torch: _test_append.
func TestAppend(t *testing.T) {
	c := newClient(t, New(Limits{}), "w0")
	c.set("foo", "po")
	c.must(Op{Kind: Append, Key: "foo", Value: []byte("tato")})
	c.must(Op{Kind: Append, Key: "bar", Value: []byte("po")})
	c.must(Op{Kind: Append, Key: "bar", Value: []byte("tato")})
	equal(t, "foo", c.get("foo"), "potato")
	equal(t, "bar", c.get("bar"), "potato")
}

// torch: _test_multi_set, _test_multi_get; plus the failure cases.
func TestMultiSetMultiGet(t *testing.T) {
	s := New(Limits{MaxValue: 8})
	c := newClient(t, s, "w0")
	c.must(Op{Kind: MultiSet, Keys: []string{"foo", "bar"}, Values: [][]byte{[]byte("po"), []byte("tato")}})
	equal(t, "foo", c.get("foo"), "po")
	equal(t, "bar", c.get("bar"), "tato")
	res := c.must(Op{Kind: MultiGet, Keys: []string{"foo", "bar"}})
	equal(t, "multi get", res.Values, [][]byte{[]byte("po"), []byte("tato")})
	equal(t, "empty multi get", c.must(Op{Kind: MultiGet}).Values, [][]byte{})

	_, _, err := c.do(Op{Kind: MultiGet, Keys: []string{"foo", "nope", "nada"}})
	wantErr(t, err, ErrNotFound)
	if !strings.Contains(err.Error(), `"nope"`) || strings.Contains(err.Error(), "nada") {
		t.Errorf("error %q should name the first missing key only", err)
	}

	// A repeated key ends with its last value, as torch's sets in order do.
	_, touched, err := c.do(Op{Kind: MultiSet, Keys: []string{"a", "b", "a"}, Values: [][]byte{[]byte("1"), []byte("2"), []byte("3")}})
	if err != nil {
		t.Fatal(err)
	}
	equal(t, "a", c.get("a"), "3")
	equal(t, "touched", touched, []string{"a", "b"})

	_, _, err = c.do(Op{Kind: MultiSet, Keys: []string{"x", "y"}, Values: [][]byte{[]byte("1")}})
	wantErr(t, err, ErrInvalid)

	// All or nothing: one value over the limit and nothing is written.
	before, _ := s.Snapshot()
	_, _, err = c.do(Op{Kind: MultiSet, Keys: []string{"foo", "new", "bar"}, Values: [][]byte{[]byte("1"), []byte("2"), []byte("123456789")}})
	wantErr(t, err, ErrTooLarge)
	after, _ := s.Snapshot()
	equal(t, "store after a refused MULTI_SET", after, before)
}

func TestManyKeys(t *testing.T) {
	const n = 20000
	s := New(Limits{})
	c := newClient(t, s, "w0")
	keys := make([]string, n)
	values := make([][]byte, n)
	for i := range n {
		keys[i] = fmt.Sprintf("/torch.rendezvous.job.0/rank/%d", i)
		values[i] = []byte(fmt.Sprint(i * 7))
		if i%2 == 0 {
			c.set(keys[i], string(values[i]))
		}
	}
	for i := 1; i < n; i += 2 {
		c.must(Op{Kind: MultiSet, Keys: keys[i : i+1], Values: values[i : i+1]})
	}
	equal(t, "num keys", c.numKeys(), n)
	equal(t, "check all", c.must(Op{Kind: Check, Keys: keys[:DefaultMaxMulti/4]}).OK, true)
	for i := 0; i < n; i += 997 {
		equal(t, keys[i], c.get(keys[i]), fmt.Sprint(i*7))
	}
	got := c.must(Op{Kind: MultiGet, Keys: keys[:1000]}).Values
	equal(t, "multi get", got, values[:1000])
}

func TestLimits(t *testing.T) {
	l := Limits{MaxKey: 8, MaxValue: 16, MaxTotalBytes: 80, MaxKeys: 4, MaxMulti: 3, MaxSessions: 2}
	s := New(l)
	c := newClient(t, s, "w")
	at, over := strings.Repeat("v", 16), strings.Repeat("v", 17)

	// Keys: at the limit fine, one byte over refused, empty invalid.
	c.set("12345678", "")
	for _, op := range []Op{
		{Kind: Set, Key: "123456789"}, {Kind: Get, Key: "123456789"},
		{Kind: Check, Keys: []string{"k", "123456789"}},
	} {
		_, _, err := c.do(op)
		wantErr(t, err, ErrTooLarge)
	}
	for _, op := range []Op{{Kind: Set}, {Kind: Get}, {Kind: Delete}, {Kind: MultiGet, Keys: []string{""}}} {
		_, _, err := c.do(op)
		wantErr(t, err, ErrInvalid)
	}
	c.del("12345678")

	// Values: at the limit fine, one byte over refused — for every way in.
	c.set("k", at)
	equal(t, "value at the limit", c.get("k"), at)
	for _, op := range []Op{
		{Kind: Set, Key: "k", Value: []byte(over)},
		{Kind: Append, Key: "k", Value: []byte("x")},
		{Kind: CompareSet, Key: "k", Expected: []byte(at), Desired: []byte(over)},
		{Kind: CompareSet, Key: "k", Expected: []byte(over), Desired: []byte("x")},
		{Kind: MultiSet, Keys: []string{"k"}, Values: [][]byte{[]byte(over)}},
	} {
		_, _, err := c.do(op)
		wantErr(t, err, ErrTooLarge)
		if !strings.Contains(err.Error(), "17 bytes, the limit is 16") {
			t.Errorf("%v: error %q should give the size and the limit", op.Kind, err)
		}
	}
	equal(t, "unchanged", c.get("k"), at)

	// Keys per operation.
	_, _, err := c.do(Op{Kind: MultiGet, Keys: []string{"a", "b", "c", "d"}})
	wantErr(t, err, ErrTooLarge)
	_, _, err = c.do(Op{Kind: MultiSet, Keys: []string{"a", "b", "c", "d"}, Values: make([][]byte, 4)})
	wantErr(t, err, ErrTooLarge)

	// Key count: k plus three more, then the fifth is refused; an overwrite
	// or a delete is not.
	c.must(Op{Kind: MultiSet, Keys: []string{"a", "b", "c"}, Values: make([][]byte, 3)})
	_, _, err = c.do(Op{Kind: Set, Key: "e"})
	wantErr(t, err, ErrTooLarge)
	c.set("a", "x")
	c.del("a")
	c.set("e", "")

	// Total bytes: keys + values + the session's client id and result.
	// Now: "k"+16, "b", "c", "e" = 20, client "w" = 1.
	equal(t, "bytes", s.Bytes(), int64(21))
	c.set("b", strings.Repeat("x", 16))
	c.set("c", strings.Repeat("x", 16))
	c.set("e", strings.Repeat("x", 16))
	equal(t, "bytes", s.Bytes(), int64(69))
	// A COMPARE_SET's recorded result counts too: 69, the new value
	// replacing one as long, and the 16 bytes it answers = 85.
	_, _, err = c.do(Op{Kind: CompareSet, Key: "k", Expected: []byte(at), Desired: []byte(strings.Repeat("y", 16))})
	wantErr(t, err, ErrTooLarge)
	if !strings.Contains(err.Error(), "85 bytes, the limit is 80") {
		t.Errorf("error %q should give the total and the limit", err)
	}
	equal(t, "unchanged", c.get("k"), at)
	c.set("k", "") // shrinking is always allowed
	equal(t, "bytes", s.Bytes(), int64(53))

	// Client ids and seq.
	_, _, err = s.Apply("", 1, Op{Kind: Set, Key: "k"})
	wantErr(t, err, ErrInvalid)
	_, _, err = s.Apply(strings.Repeat("c", MaxClientID+1), 1, Op{Kind: Set, Key: "k"})
	wantErr(t, err, ErrInvalid)
	_, _, err = s.Apply("w", 0, Op{Kind: Set, Key: "k"})
	wantErr(t, err, ErrInvalid)
	_, _, err = s.Apply("w", 99, Op{})
	wantErr(t, err, ErrInvalid)
}

// No message carries a value's bytes, only sizes, limits and key names.
func TestErrorsNeverShowValues(t *testing.T) {
	s := New(Limits{MaxValue: 32})
	c := newClient(t, s, "w")
	secret := "SECRET-TOKEN-0123456789"
	c.set("k", secret)
	ops := []Op{
		{Kind: Add, Key: "k", Delta: 1},
		{Kind: Set, Key: "k", Value: []byte(secret + secret)},
		{Kind: Append, Key: "k", Value: []byte(secret)},
		{Kind: CompareSet, Key: "k", Expected: []byte(secret + secret)},
		{Kind: MultiSet, Keys: []string{"k"}, Values: [][]byte{[]byte(secret), []byte(secret)}},
	}
	for _, op := range ops {
		_, _, err := c.do(op)
		if err == nil {
			t.Fatalf("%v: no error", op.Kind)
		}
		if strings.Contains(err.Error(), "SECRET") {
			t.Errorf("%v: error %q shows a value", op.Kind, err)
		}
	}
}

func TestTouched(t *testing.T) {
	c := newClient(t, New(Limits{}), "w")
	cases := []struct {
		op   Op
		want []string
	}{
		{Op{Kind: Set, Key: "a"}, []string{"a"}},
		{Op{Kind: Add, Key: "n", Delta: 1}, []string{"n"}},
		{Op{Kind: Append, Key: "a", Value: []byte("x")}, []string{"a"}},
		{Op{Kind: CompareSet, Key: "c", Expected: []byte("no")}, nil},
		{Op{Kind: CompareSet, Key: "c", Desired: []byte("1")}, []string{"c"}},
		{Op{Kind: CompareSet, Key: "c", Expected: []byte("2"), Desired: []byte("3")}, nil},
		{Op{Kind: CompareSet, Key: "c", Expected: []byte("1"), Desired: []byte("3")}, []string{"c"}},
		{Op{Kind: Delete, Key: "c"}, []string{"c"}},
		{Op{Kind: Delete, Key: "c"}, nil},
		{Op{Kind: MultiSet, Keys: []string{"y", "x", "y"}, Values: make([][]byte, 3)}, []string{"y", "x"}},
		{Op{Kind: Get, Key: "a"}, nil},
		{Op{Kind: Check, Keys: []string{"a"}}, nil},
	}
	for i, tc := range cases {
		_, touched, err := c.do(tc.op)
		if err != nil {
			t.Fatalf("case %d: %v", i, err)
		}
		if !slices.Equal(touched, tc.want) {
			t.Errorf("case %d %v: touched %q, want %q", i, tc.op.Kind, touched, tc.want)
		}
	}
}

// Neither what goes in nor what comes out shares memory with the store.
func TestNoAliasing(t *testing.T) {
	s := New(Limits{})
	c := newClient(t, s, "w")
	in := []byte("value")
	c.must(Op{Kind: Set, Key: "k", Value: in})
	in[0] = 'X'
	multi := [][]byte{[]byte("m")}
	c.must(Op{Kind: MultiSet, Keys: []string{"m"}, Values: multi})
	multi[0][0] = 'X'
	desired := []byte("d")
	cas := c.must(Op{Kind: CompareSet, Key: "c", Desired: desired})
	desired[0] = 'X'
	cas.Value[0] = 'Y'

	out := c.must(Op{Kind: Get, Key: "k"})
	out.Value[0] = 'X'
	outs := c.must(Op{Kind: MultiGet, Keys: []string{"k", "m"}})
	outs.Values[1][0] = 'X'
	kvs, sessions := s.Snapshot()
	for _, kv := range kvs {
		kv.Value[0] = 'X'
	}
	sessions[0].Result.Value[0] = 'X'
	kvs, _ = s.TakeChanges()
	for _, kv := range kvs {
		kv.Value[0] = 'X'
	}

	equal(t, "k", c.get("k"), "value")
	equal(t, "m", c.get("m"), "m")
	equal(t, "c", c.get("c"), "d")
	// The recorded result of the COMPARE_SET is intact too.
	res, _, err := s.Apply("w", 3, Op{Kind: CompareSet})
	if err != nil {
		t.Fatal(err)
	}
	equal(t, "recorded result", string(res.Value), "d")
	// An empty value reads back empty, not absent.
	c.set("e", "")
	if v := c.must(Op{Kind: Get, Key: "e"}).Value; v == nil {
		t.Errorf("empty value read back as nil")
	}
}

func TestExactlyOnce(t *testing.T) {
	s := New(Limits{})
	// A retried ADD adds once and answers the same number.
	res, touched, err := s.Apply("w", 1, Op{Kind: Add, Key: "n", Delta: 5})
	if err != nil || res.Number != 5 || len(touched) != 1 {
		t.Fatalf("first ADD: %v %v %v", res, touched, err)
	}
	for range 3 {
		res, touched, err = s.Apply("w", 1, Op{Kind: Add, Key: "n", Delta: 5})
		if err != nil || res.Number != 5 || touched != nil {
			t.Fatalf("retried ADD: %v %v %v", res, touched, err)
		}
	}
	equal(t, "n", string(mustGet(t, s, "n")), "5")

	// A retried COMPARE_SET answers what it answered then, though another
	// client has changed the key since: the retrier learns it won.
	if res, _, _ = s.Apply("w", 2, Op{Kind: CompareSet, Key: "r", Desired: []byte("mine")}); string(res.Value) != "mine" {
		t.Fatalf("COMPARE_SET: %q", res.Value)
	}
	if _, _, err = s.Apply("other", 1, Op{Kind: Set, Key: "r", Value: []byte("theirs")}); err != nil {
		t.Fatal(err)
	}
	res, _, _ = s.Apply("w", 2, Op{Kind: CompareSet, Key: "r", Desired: []byte("mine")})
	equal(t, "retried COMPARE_SET", string(res.Value), "mine")
	equal(t, "r", string(mustGet(t, s, "r")), "theirs")

	// Older seqs are refused; gaps are fine; reads ignore seq.
	_, _, err = s.Apply("w", 1, Op{Kind: Add, Key: "n", Delta: 5})
	wantErr(t, err, ErrReplayed)
	if !strings.Contains(err.Error(), "seq 1") || !strings.Contains(err.Error(), "2") {
		t.Errorf("error %q should give both seqs", err)
	}
	if _, _, err = s.Apply("w", 10, Op{Kind: Add, Key: "n", Delta: 1}); err != nil {
		t.Fatal(err)
	}
	if _, _, err = s.Apply("w", 3, Op{Kind: Get, Key: "n"}); err != nil {
		t.Fatalf("read with an old seq: %v", err)
	}
	if _, _, err = s.Apply("", 0, Op{Kind: NumKeys}); err != nil {
		t.Fatalf("read without a session: %v", err)
	}

	// A failed mutation is not recorded: its retry runs afresh.
	if _, _, err = s.Apply("w", 11, Op{Kind: Set, Key: "t", Value: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	_, _, err = s.Apply("w", 12, Op{Kind: Add, Key: "t", Delta: 1})
	wantErr(t, err, ErrNotInteger)
	if _, _, err = s.Apply("other", 2, Op{Kind: Set, Key: "t", Value: []byte("1")}); err != nil {
		t.Fatal(err)
	}
	res, _, err = s.Apply("w", 12, Op{Kind: Add, Key: "t", Delta: 1})
	if err != nil || res.Number != 2 {
		t.Fatalf("retry of a failed ADD: %v %v", res, err)
	}
}

func mustGet(t *testing.T, s *Store, k string) []byte {
	t.Helper()
	res, _, err := s.Apply("", 0, Op{Kind: Get, Key: k})
	if err != nil {
		t.Fatal(err)
	}
	return res.Value
}

func TestSessionsEvictLeastRecentlyUsedClosed(t *testing.T) {
	s := New(Limits{MaxSessions: 3})
	set := func(client string, seq uint64) error {
		_, _, err := s.Apply(client, seq, Op{Kind: Set, Key: "k"})
		return err
	}
	for _, c := range []string{"a", "b", "c"} {
		if err := set(c, 5); err != nil {
			t.Fatal(err)
		}
	}
	// Full of open sessions: a new client is refused, the known ones go on.
	wantErr(t, set("d", 1), ErrTooLarge)
	if err := set("a", 6); err != nil {
		t.Fatal(err)
	}

	// Closed ones are evicted, least recently closed first.
	s.CloseSession("b")
	s.CloseSession("a")
	s.CloseSession("a") // closing twice changes nothing
	s.CloseSession("zzz")
	if err := set("d", 1); err != nil {
		t.Fatalf("d should evict b: %v", err)
	}
	// b is forgotten, so its id starts afresh; a is still remembered.
	_, sessions := s.Snapshot()
	equal(t, "sessions", clientsOf(sessions), []string{"c", "a", "d"})
	wantErr(t, set("a", 6), ErrReplayed) // closed: a retry is refused too
	wantErr(t, set("a", 2), ErrReplayed)

	// Reusing a closed id with a higher seq reopens it: then it is no longer
	// evictable, and e finds no room.
	if err := set("a", 7); err != nil {
		t.Fatal(err)
	}
	wantErr(t, set("e", 1), ErrTooLarge)
	s.CloseSession("c")
	if err := set("e", 1); err != nil {
		t.Fatal(err)
	}
	_, sessions = s.Snapshot()
	equal(t, "sessions", clientsOf(sessions), []string{"d", "a", "e"})
}

func clientsOf(sessions []Session) []string {
	var ids []string
	for _, s := range sessions {
		ids = append(ids, s.Client)
	}
	return ids
}

// The master's durability, as it will run: each batch of changes goes to the
// log; a snapshot now and then; on restart, the newest snapshot plus the
// batches after it.
func TestDurabilityRoundTrip(t *testing.T) {
	l := Limits{MaxSessions: 3}
	s := New(l)
	w, x := newClient(t, s, "w"), newClient(t, s, "x")
	var log [][2]any // batches of ([]KV, []Session)
	take := func() {
		kvs, sessions := s.TakeChanges()
		log = append(log, [2]any{kvs, sessions})
	}

	w.set("a", "1")
	w.add("n", 3)
	x.compareSet("/torch.rendezvous.j", "", "Y2FuaW1hZGFt")
	take()
	w.del("a")
	w.set("b", "2")
	// A snapshot without taking the pending changes first: they are in the
	// snapshot and in the next batch as well, which is harmless.
	snapKVs, snapSessions := s.Snapshot()
	log = nil
	x.must(Op{Kind: Append, Key: "b", Value: []byte("3")})
	take()
	x.must(Op{Kind: MultiSet, Keys: []string{"p", "q"}, Values: [][]byte{[]byte("P"), nil}})
	s.CloseSession("x")
	take()
	w.add("n", 4)
	take()

	var kvs []KV
	var sessions []Session
	kvs, sessions = append(kvs, snapKVs...), append(sessions, snapSessions...)
	for _, b := range log {
		kvs, sessions = append(kvs, b[0].([]KV)...), append(sessions, b[1].([]Session)...)
	}
	r := New(l)
	if err := r.Restore(kvs, sessions); err != nil {
		t.Fatal(err)
	}
	assertSameStore(t, r, s)
	if k, ss := r.TakeChanges(); len(k)+len(ss) != 0 {
		t.Errorf("a restored store has changes pending: %v %v", k, ss)
	}

	// The restored store remembers the sessions: a retry of w's last ADD is
	// answered, not applied; x is closed.
	res, _, err := r.Apply("w", w.seq, Op{Kind: Add, Key: "n", Delta: 4})
	if err != nil || res.Number != 7 {
		t.Fatalf("retry after restore: %v %v", res, err)
	}
	_, _, err = r.Apply("x", x.seq, Op{Kind: Set, Key: "b"})
	wantErr(t, err, ErrReplayed)

	// And a snapshot alone restores too.
	kvs, sessions = s.Snapshot()
	r2 := New(l)
	if err := r2.Restore(kvs, sessions); err != nil {
		t.Fatal(err)
	}
	assertSameStore(t, r2, s)
}

// A session logged open, then closed and evicted before the next batch: the
// batch still reports it (closed), and Restore evicts it again.
func TestRestoreReplaysEviction(t *testing.T) {
	l := Limits{MaxSessions: 2}
	s := New(l)
	var kvs []KV
	var sessions []Session
	take := func() {
		k, ss := s.TakeChanges()
		kvs, sessions = append(kvs, k...), append(sessions, ss...)
	}
	apply := func(c string, seq uint64) {
		t.Helper()
		if _, _, err := s.Apply(c, seq, Op{Kind: Add, Key: c, Delta: 1}); err != nil {
			t.Fatal(err)
		}
	}
	apply("a", 1)
	apply("b", 1)
	take()
	s.CloseSession("a")
	apply("c", 1) // evicts a
	take()
	if !slices.Contains(clientsOf(sessions[2:]), "a") {
		t.Fatalf("the batch does not report the evicted session: %+v", sessions[2:])
	}
	r := New(l)
	if err := r.Restore(kvs, sessions); err != nil {
		t.Fatal(err)
	}
	assertSameStore(t, r, s)
}

func TestRestoreRefuses(t *testing.T) {
	l := Limits{MaxKey: 4, MaxValue: 4, MaxTotalBytes: 20, MaxKeys: 2, MaxSessions: 1}
	cases := []struct {
		name     string
		kvs      []KV
		sessions []Session
		want     error
	}{
		{"key too long", []KV{{Key: "12345"}}, nil, ErrTooLarge},
		{"empty key", []KV{{Key: ""}}, nil, ErrInvalid},
		{"value too long", []KV{{Key: "k", Value: []byte("12345")}}, nil, ErrTooLarge},
		{"deleted record over the limit", []KV{{Key: "12345", Deleted: true}}, nil, ErrTooLarge},
		{"too many keys", []KV{{Key: "a"}, {Key: "b"}, {Key: "c"}}, nil, ErrTooLarge},
		{"too many bytes", []KV{{Key: "a", Value: []byte("1234")}}, []Session{{Client: strings.Repeat("c", 16), Seq: 1}}, ErrTooLarge},
		{"seq 0", nil, []Session{{Client: "c"}}, ErrInvalid},
		{"no client", nil, []Session{{Seq: 1}}, ErrInvalid},
		{"recorded value too long", nil, []Session{{Client: "c", Seq: 1, Result: Result{Value: []byte("12345")}}}, ErrTooLarge},
		{"recorded values", nil, []Session{{Client: "c", Seq: 1, Result: Result{Values: [][]byte{{}}}}}, ErrInvalid},
		{"open sessions over the limit", nil, []Session{{Client: "c", Seq: 1}, {Client: "d", Seq: 1}}, ErrTooLarge},
	}
	for _, tc := range cases {
		s := New(l)
		wantErr(t, s.Restore(tc.kvs, tc.sessions), tc.want)
		if s.Len() != 0 || s.Bytes() != 0 || s.sessions.len() != 0 {
			t.Errorf("%s: a refused restore left %d keys, %d bytes", tc.name, s.Len(), s.Bytes())
		}
	}

	// Within the limits once replayed: a key deleted later, a closed session
	// evicted.
	s := New(l)
	err := s.Restore(
		[]KV{{Key: "a", Value: []byte("1")}, {Key: "b"}, {Key: "a", Deleted: true}, {Key: "c"}},
		[]Session{{Client: "c", Seq: 1, Closed: true}, {Client: "d", Seq: 4}})
	if err != nil {
		t.Fatal(err)
	}
	equal(t, "keys", s.Len(), 2)
	_, sessions := s.Snapshot()
	equal(t, "sessions", sessions, []Session{{Client: "d", Seq: 4}})

	// Only into an empty store.
	wantErr(t, s.Restore(nil, nil), ErrInvalid)
}

func TestDefaults(t *testing.T) {
	equal(t, "limits", New(Limits{MaxKey: -1, MaxMulti: 7}).Limits(), Limits{
		MaxKey: DefaultMaxKey, MaxValue: DefaultMaxValue, MaxTotalBytes: DefaultMaxTotalBytes,
		MaxKeys: DefaultMaxKeys, MaxMulti: 7, MaxSessions: DefaultMaxSessions,
	})
	// The default value limit, exactly: at it and one byte over.
	s := New(Limits{})
	big := bytes.Repeat([]byte{'v'}, DefaultMaxValue+1)
	if _, _, err := s.Apply("w", 1, Op{Kind: Set, Key: "k", Value: big[:DefaultMaxValue]}); err != nil {
		t.Fatal(err)
	}
	_, _, err := s.Apply("w", 2, Op{Kind: Set, Key: "k", Value: big})
	wantErr(t, err, ErrTooLarge)
}

func TestKind(t *testing.T) {
	equal(t, "name", CompareSet.String(), "COMPARE_SET")
	equal(t, "invalid", Kind(0).String(), "Kind(0)")
	var mutating []Kind
	for k := Set; k <= MultiSet; k++ {
		if k.Mutates() {
			mutating = append(mutating, k)
		}
	}
	equal(t, "mutations", mutating, []Kind{Set, Add, CompareSet, Delete, Append, MultiSet})
}

// Package tcpstore reads and writes torch's TCPStore wire protocol: the
// frames a torch.distributed.TCPStore client sends to its server, and the
// server's replies. It is pure framing — no network, no store — so that the
// agent's store relay (agent/storerelay) and its fuzzer share one decoder.
//
// # Versions and commands covered, and how each was verified
//
// Framing is the same in every version: one command byte, strings and values
// as a little-endian u64 length and the bytes, counts as u64, integers as
// little-endian i64 (TORCH-STORE.md in the project's shared notes).
//
//   - torch 1.13 and 2.0 (numbering Torch113): SET, COMPARE_SET, GET, ADD,
//     CHECK, WAIT, GETNUMKEYS, WATCH_KEY, DELETE_KEY. Verified against a real
//     torch 1.13 client (Debian's python3-torch) in agent/storerelay_test.go,
//     and from recorded bytes in this package's tests.
//   - torch 2.1 (numbering Torch21, no handshake): the above with DELETE_KEY
//     7, then APPEND 8, MULTI_GET 9, MULTI_SET 10, CANCEL_WAIT 11; no
//     WATCH_KEY. From TORCH-STORE.md's table only (no 2.1 client here):
//     recorded bytes built from that table.
//   - torch 2.2 and later (numbering Torch22): the VALIDATE handshake with
//     magic 0x3C85F7CE first, then SET 1 … CANCEL_WAIT 12, PING 13,
//     QUEUE_PUSH 14, QUEUE_POP 15, QUEUE_LEN 16, LIST_KEYS 17 (2.11).
//     Verified with a real torch 2.6 client (Debian trixie's) and, since,
//     torch 2.14.1 (Debian sid's, in the root `scripts/deps.sh torch2`
//     builds; its tests skip when it is absent): it sends VALIDATE, then
//     PING, on its one connection (2.14's constructor then ADDs "init/"
//     when given a world size); the relay's tests run every operation of
//     its Python API through the relay (a timed-out wait included) and
//     torch elastic's rendezvous, which uses MULTI_GET/MULTI_SET; and from
//     bytes (one stream captured from the 2.6 client, the others derived
//     from torch's TCPStore.cpp client code) always. 2.14's classic client
//     was captured command by command against a logging server: SET 1,
//     COMPARE_SET 2, GET 3 (after WAIT 6), ADD 4, CHECK 5, WAIT 6,
//     GETNUMKEYS 7, DELETE_KEY 8, APPEND 9, MULTI_GET 10 (after WAIT 6),
//     MULTI_SET 11, PING 13: the 2.2+ numbering, unchanged. It sends no
//     QUEUE_* (refused in the client: "queues not implemented on legacy
//     TCPStore backend") and its list_keys sent nothing; QUEUE_* and
//     LIST_KEYS are decoded from the table only.
//
// # Telling the numberings apart
//
// A 2.2+ client always opens with VALIDATE: the bytes 00 CE F7 85 3C. An
// older client's first command cannot start so: a SET (0) there would be
// followed by a key length whose low bytes are the magic, a key of ≥ 1 GB,
// longer than any key allowed. So the decoder peeks one byte; only when it
// is 0 does it peek five, which is safe since an old SET has ≥ 17 bytes —
// a 1.13 client's first GETNUMKEYS (one byte) never blocks the sniff.
//
// Without the magic, codes 0–6 agree, and 7 and 8 clash: WATCH_KEY and
// DELETE_KEY in 1.13/2.0, DELETE_KEY and APPEND in 2.1. The decoder reads
// them as 1.13/2.0 (the torch of Debian bookworm, and of the images this
// project was first used with) unless it was told Torch21, and switches a
// connection to 2.1 numbering for good when it sends 9, 10 or 11, codes a
// 1.13/2.0 client never sends. A 2.1 client that deletes a key or appends
// before its first MULTI_GET/MULTI_SET is therefore misread unless the relay
// is configured for 2.1; torch elastic's own agents do neither.
package tcpstore

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// Numbering is a family of command numbers.
type Numbering int

const (
	// Torch113 is the numbering of torch 1.13 and 2.0.
	Torch113 Numbering = iota + 1
	// Torch21 is the numbering of torch 2.1: no handshake, no WATCH_KEY,
	// APPEND and the MULTI_ commands.
	Torch21
	// Torch22 is the numbering of torch 2.2 and later, announced by the
	// VALIDATE handshake.
	Torch22
)

func (n Numbering) String() string {
	switch n {
	case Torch113:
		return "torch-1.13"
	case Torch21:
		return "torch-2.1"
	case Torch22:
		return "torch-2.2+"
	}
	return fmt.Sprintf("numbering(%d)", int(n))
}

// Cmd is a command, whatever its number in a numbering.
type Cmd int

// The commands; Validate is the 2.2+ handshake, which has no reply.
const (
	Validate Cmd = iota + 1
	Set
	CompareSet
	Get
	Add
	Check
	Wait
	NumKeys
	WatchKey
	Delete
	Append
	MultiGet
	MultiSet
	CancelWait
	Ping
	QueuePush
	QueuePop
	QueueLen
	ListKeys
)

var cmdNames = [...]string{"", "VALIDATE", "SET", "COMPARE_SET", "GET", "ADD", "CHECK", "WAIT", "GETNUMKEYS",
	"WATCH_KEY", "DELETE_KEY", "APPEND", "MULTI_GET", "MULTI_SET", "CANCEL_WAIT", "PING", "QUEUE_PUSH",
	"QUEUE_POP", "QUEUE_LEN", "LIST_KEYS"}

func (c Cmd) String() string {
	if c > 0 && int(c) < len(cmdNames) {
		return cmdNames[c]
	}
	return fmt.Sprintf("cmd(%d)", int(c))
}

// The command tables, indexed by the byte on the wire.
var (
	codes113 = []Cmd{Set, CompareSet, Get, Add, Check, Wait, NumKeys, WatchKey, Delete}
	codes21  = []Cmd{Set, CompareSet, Get, Add, Check, Wait, NumKeys, Delete, Append, MultiGet, MultiSet, CancelWait}
	codes22  = []Cmd{Validate, Set, CompareSet, Get, Add, Check, Wait, NumKeys, Delete, Append, MultiGet, MultiSet,
		CancelWait, Ping, QueuePush, QueuePop, QueueLen, ListKeys}
)

func table(n Numbering) []Cmd {
	switch n {
	case Torch21:
		return codes21
	case Torch22:
		return codes22
	}
	return codes113
}

// Code is cmd's byte in numbering n, or false when n has no such command.
func Code(n Numbering, cmd Cmd) (byte, bool) {
	for i, c := range table(n) {
		if c == cmd {
			return byte(i), true
		}
	}
	return 0, false
}

// Magic is the number a 2.2+ client sends after VALIDATE.
const Magic uint32 = 0x3C85F7CE

// Request is one decoded command. Which fields are set depends on Cmd:
// Key (SET, COMPARE_SET, GET, ADD, WATCH_KEY, DELETE_KEY, APPEND, QUEUE_*),
// Keys (CHECK, WAIT, MULTI_GET, MULTI_SET), Value (SET, APPEND, QUEUE_PUSH;
// COMPARE_SET's desired value), Expected (COMPARE_SET), Values (MULTI_SET),
// Delta (ADD), Number (PING's nonce, VALIDATE's magic).
type Request struct {
	Cmd      Cmd
	Key      string
	Keys     []string
	Value    []byte
	Expected []byte
	Values   [][]byte
	Delta    int64
	Number   uint32
}

// Limits bound what one frame may carry, so that a length of 4 GiB is
// refused before anything is allocated for it.
type Limits struct {
	MaxKey   int // bytes in a key
	MaxValue int // bytes in a value
	MaxKeys  int // keys in one CHECK, WAIT, MULTI_GET or MULTI_SET
	MaxFrame int // bytes in one frame, all keys and values together
}

// DefaultLimits match the master's store (master/store) and its gRPC
// message limit, so that what the relay accepts the master accepts too.
var DefaultLimits = Limits{MaxKey: 4 << 10, MaxValue: 64 << 20, MaxKeys: 1 << 16, MaxFrame: 72 << 20}

// Errors a decoder returns; after any of them the stream is out of step and
// the connection must be closed.
var (
	// ErrTooLarge is a length or count over a limit.
	ErrTooLarge = errors.New("tcpstore: frame over a limit")
	// ErrUnknown is a command byte the connection's numbering does not have,
	// or a VALIDATE with a wrong magic.
	ErrUnknown = errors.New("tcpstore: unknown command")
)

// Decoder reads requests from one client connection.
type Decoder struct {
	r      *bufio.Reader
	lim    Limits
	legacy Numbering
	num    Numbering // 0 until the first command was sniffed
	frame  int       // bytes of the current frame so far
}

// NewDecoder reads from r. legacy is how to read a client without the 2.2+
// handshake: Torch113 (also for 0) or Torch21. Zero limits take the defaults.
func NewDecoder(r io.Reader, legacy Numbering, lim Limits) *Decoder {
	if legacy != Torch21 {
		legacy = Torch113
	}
	if lim.MaxKey <= 0 {
		lim.MaxKey = DefaultLimits.MaxKey
	}
	if lim.MaxValue <= 0 {
		lim.MaxValue = DefaultLimits.MaxValue
	}
	if lim.MaxKeys <= 0 {
		lim.MaxKeys = DefaultLimits.MaxKeys
	}
	if lim.MaxFrame <= 0 {
		lim.MaxFrame = DefaultLimits.MaxFrame
	}
	return &Decoder{r: bufio.NewReaderSize(r, 64<<10), lim: lim, legacy: legacy}
}

// Numbering is the connection's numbering; 0 before the first command.
func (d *Decoder) Numbering() Numbering { return d.num }

// Next reads one request. io.EOF means the client closed between frames;
// io.ErrUnexpectedEOF a frame cut short.
func (d *Decoder) Next() (Request, error) {
	if d.num == 0 {
		if err := d.sniff(); err != nil {
			return Request{}, err
		}
	}
	d.frame = 0
	b, err := d.r.ReadByte()
	if err != nil {
		return Request{}, err
	}
	t := table(d.num)
	if d.num == Torch113 && int(b) >= len(t) && int(b) < len(codes21) {
		// Codes 9–11 exist only in 2.1: this client is a 2.1 client.
		d.num, t = Torch21, codes21
	}
	if int(b) >= len(t) {
		return Request{}, fmt.Errorf("%w: byte %d in %s numbering", ErrUnknown, b, d.num)
	}
	req := Request{Cmd: t[b]}
	return req, d.body(&req)
}

func (d *Decoder) sniff() error {
	first, err := d.r.Peek(1)
	if err != nil {
		return err
	}
	d.num = d.legacy
	if first[0] != 0 {
		return nil
	}
	head, err := d.r.Peek(5)
	if err != nil {
		d.num = 0
		return unexpected(err)
	}
	if binary.LittleEndian.Uint32(head[1:]) == Magic {
		d.num = Torch22
	}
	return nil
}

func (d *Decoder) body(req *Request) (err error) {
	switch req.Cmd {
	case Validate:
		if req.Number, err = d.u32(); err == nil && req.Number != Magic {
			err = fmt.Errorf("%w: VALIDATE with magic %#x", ErrUnknown, req.Number)
		}
	case Ping:
		req.Number, err = d.u32()
	case Set, Append, QueuePush:
		if req.Key, err = d.key(); err == nil {
			req.Value, err = d.value()
		}
	case CompareSet:
		if req.Key, err = d.key(); err == nil {
			if req.Expected, err = d.value(); err == nil {
				req.Value, err = d.value()
			}
		}
	case Get, WatchKey, Delete, QueuePop, QueueLen:
		req.Key, err = d.key()
	case Add:
		if req.Key, err = d.key(); err == nil {
			var u uint64
			u, err = d.u64()
			req.Delta = int64(u)
		}
	case Check, Wait, MultiGet:
		req.Keys, err = d.keys()
	case MultiSet:
		var n int
		if n, err = d.count(); err != nil {
			return err
		}
		req.Keys, req.Values = make([]string, 0, min(n, 1024)), make([][]byte, 0, min(n, 1024))
		for range n {
			k, err := d.key()
			if err != nil {
				return err
			}
			v, err := d.value()
			if err != nil {
				return err
			}
			req.Keys, req.Values = append(req.Keys, k), append(req.Values, v)
		}
	}
	return err
}

func (d *Decoder) u32() (uint32, error) {
	var b [4]byte
	if _, err := io.ReadFull(d.r, b[:]); err != nil {
		return 0, unexpected(err)
	}
	return binary.LittleEndian.Uint32(b[:]), nil
}

func (d *Decoder) u64() (uint64, error) {
	var b [8]byte
	if _, err := io.ReadFull(d.r, b[:]); err != nil {
		return 0, unexpected(err)
	}
	return binary.LittleEndian.Uint64(b[:]), nil
}

// bytes reads a length and that many bytes, refusing a length over max or
// over what is left of the frame before allocating.
func (d *Decoder) bytes(max int, what string) ([]byte, error) {
	n, err := d.u64()
	if err != nil {
		return nil, err
	}
	if n > uint64(max) || n > uint64(d.lim.MaxFrame-d.frame) {
		return nil, fmt.Errorf("%w: %s of %d bytes (at most %d, %d left in the frame)", ErrTooLarge, what, n,
			max, d.lim.MaxFrame-d.frame)
	}
	d.frame += int(n)
	b := make([]byte, n)
	if _, err := io.ReadFull(d.r, b); err != nil {
		return nil, unexpected(err)
	}
	return b, nil
}

func (d *Decoder) key() (string, error) {
	b, err := d.bytes(d.lim.MaxKey, "key")
	return string(b), err
}

func (d *Decoder) value() ([]byte, error) { return d.bytes(d.lim.MaxValue, "value") }

func (d *Decoder) count() (int, error) {
	n, err := d.u64()
	if err != nil {
		return 0, err
	}
	if n > uint64(d.lim.MaxKeys) {
		return 0, fmt.Errorf("%w: %d keys (at most %d)", ErrTooLarge, n, d.lim.MaxKeys)
	}
	return int(n), nil
}

func (d *Decoder) keys() ([]string, error) {
	n, err := d.count()
	if err != nil {
		return nil, err
	}
	keys := make([]string, 0, min(n, 1024))
	for range n {
		k, err := d.key()
		if err != nil {
			return nil, err
		}
		keys = append(keys, k)
	}
	return keys, nil
}

// unexpected turns an end of stream inside a frame into io.ErrUnexpectedEOF.
func unexpected(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// AppendRequest appends req as a client of numbering n sends it (for tests,
// benchmarks and the fuzzer's round trip). It fails when n has no req.Cmd.
func AppendRequest(b []byte, n Numbering, req Request) ([]byte, error) {
	code, ok := Code(n, req.Cmd)
	if !ok {
		return b, fmt.Errorf("%w: %s has no %s", ErrUnknown, n, req.Cmd)
	}
	b = append(b, code)
	switch req.Cmd {
	case Validate, Ping:
		b = binary.LittleEndian.AppendUint32(b, req.Number)
	case Set, Append, QueuePush:
		b = AppendBytes(AppendBytes(b, []byte(req.Key)), req.Value)
	case CompareSet:
		b = AppendBytes(AppendBytes(AppendBytes(b, []byte(req.Key)), req.Expected), req.Value)
	case Get, WatchKey, Delete, QueuePop, QueueLen:
		b = AppendBytes(b, []byte(req.Key))
	case Add:
		b = AppendInt(AppendBytes(b, []byte(req.Key)), req.Delta)
	case Check, Wait, MultiGet:
		b = binary.LittleEndian.AppendUint64(b, uint64(len(req.Keys)))
		for _, k := range req.Keys {
			b = AppendBytes(b, []byte(k))
		}
	case MultiSet:
		b = binary.LittleEndian.AppendUint64(b, uint64(len(req.Keys)))
		for i, k := range req.Keys {
			b = AppendBytes(AppendBytes(b, []byte(k)), req.Values[i])
		}
	}
	return b, nil
}

// AppendBytes appends a length-prefixed string or value.
func AppendBytes(b, v []byte) []byte {
	return append(binary.LittleEndian.AppendUint64(b, uint64(len(v))), v...)
}

// AppendInt appends an i64 (ADD's delta, and every integer reply).
func AppendInt(b []byte, v int64) []byte { return binary.LittleEndian.AppendUint64(b, uint64(v)) }

// AppendU32 appends a u32 (PING's reply).
func AppendU32(b []byte, v uint32) []byte { return binary.LittleEndian.AppendUint32(b, v) }

// One-byte replies.
const (
	// CheckReady and CheckNotReady answer CHECK.
	CheckReady, CheckNotReady byte = 0, 1
	// StopWaiting answers WAIT once every key exists; WaitCanceled answers
	// CANCEL_WAIT.
	StopWaiting, WaitCanceled byte = 0, 1
)

package storerelay

import (
	"encoding/base64"
	"encoding/binary"
	"time"
)

// torch's c10d rendezvous keeps its state in one store key,
// /torch.rendezvous.<run id>: base64 of a pickled _RendezvousState whose
// last_heartbeats map each node to a datetime it rewrites every
// keep_alive_interval (5 s). A node is dead to the others only once its
// last heartbeat is keep_alive_interval × keep_alive_max_attempt old (15 s by
// default; torch 2.7+ reads both from the rendezvous config, which flytekit
// fills from its decorator, so no launcher setting reaches them). Until
// then the next round may be completed with the dead node in it: on torch
// 2.14 its rank 0 never publishes MASTER_ADDR and every node waits out the
// store's 60 s read timeout (scenario 11 failed so), on 1.13 the round waits.
//
// The master knows at once that a pod is gone. When it outdates a round in
// command mode, each agent notes when it learnt of it (the cutoff); once the
// master's next round has formed with N pods, D of the round before gone
// from it (Round.Departed: by pod and incarnation), its relay watches the
// stored state until no more than D heartbeats are still before the
// departed pods' earliest reported failure (Round.DepartedSince: a
// preemption's SIGTERM; survivors that re-rendezvous before the agent
// learnt of the new round beat after it), or before the cutoff
// (the survivors beat at once: they re-rendezvous, their peer being gone; a
// live node at least every keep-alive interval; a dead one never), or,
// without D, until N nodes have written a heartbeat after it (a
// replacement's only once its torch has started: 2–3 s on 2.14 here, its
// pod's start on a cluster). Every heartbeat still before the cutoff is
// then a dead node's, and the relay ages it: each torch agent finds that
// node dead at its next read (torch's _sanitize) and removes it, and the
// round forms without it. A scale-up ages nothing: every node before the
// cutoff is alive and beats. (Were a dead node not in the state, removed
// by torch's own keep-alive or never joined, a live node not yet beaten
// since the cutoff could be aged with D: torch drops it as if its
// keep-alive had lapsed, its workers train on, and it joins again at its
// next rendezvous.)
// agedC10dState does the byte work: it walks the pickle's opcodes and
// rewrites datetime payloads in place (same length: no frame changes), and
// gives up, changing nothing, on any opcode it does not know.

// agedC10dState returns value (base64 of a pickled c10d state) with every
// heartbeat before cutoff set to aged, and how many it set; ok is false when
// value is not such a state.
func agedC10dState(value []byte, cutoff, aged time.Time) (out []byte, n int, ok bool) {
	raw, err := base64.StdEncoding.DecodeString(string(value))
	if err != nil || len(raw) < 2 || raw[0] != 0x80 {
		return nil, 0, false
	}
	n, _, ok = ageDatetimes(raw, cutoff, aged, true)
	if !ok {
		return nil, 0, false
	}
	return []byte(base64.StdEncoding.EncodeToString(raw)), n, true
}

// c10dHeartbeats counts a c10d state's heartbeats before cutoff and at or
// after it; ok is false when value is not such a state.
func c10dHeartbeats(value []byte, cutoff time.Time) (before, after int, ok bool) {
	raw, err := base64.StdEncoding.DecodeString(string(value))
	if err != nil || len(raw) < 2 || raw[0] != 0x80 {
		return 0, 0, false
	}
	return ageDatetimes(raw, cutoff, time.Time{}, false)
}

// ageDatetimes rewrites, in p, the 10-byte payload of every pickled datetime
// of last_heartbeats before cutoff (SHORT_BINBYTES of 10 bytes that read as
// a date of this century, after the string "last_heartbeats": the state's
// last field, after its deadline, which stays) to aged. ok is false when p
// holds an opcode it does not know. after counts those at or after cutoff;
// with write false nothing is changed (n counts what would be).
func ageDatetimes(p []byte, cutoff, aged time.Time, write bool) (n, after int, ok bool) {
	heartbeats := false
	for i := 0; i < len(p); {
		op := p[i]
		i++
		arg, lenBytes := pickleArg(op)
		switch {
		case arg < 0:
			return 0, 0, false
		case lenBytes > 0: // a length-prefixed payload
			if i+lenBytes > len(p) {
				return 0, 0, false
			}
			var size uint64
			switch lenBytes {
			case 1:
				size = uint64(p[i])
			case 4:
				size = uint64(binary.LittleEndian.Uint32(p[i:]))
			case 8:
				size = binary.LittleEndian.Uint64(p[i:])
			}
			i += lenBytes
			if size > uint64(len(p)-i) {
				return 0, 0, false
			}
			if op == 0x8c && string(p[i:i+int(size)]) == "last_heartbeats" {
				heartbeats = true
			}
			if op == 'C' && size == 10 && heartbeats {
				if t, isDate := decodeDatetime(p[i : i+10]); isDate && t.Before(cutoff) {
					if write {
						encodeDatetime(p[i:i+10], aged)
					}
					n++
				} else if isDate {
					after++
				}
			}
			i += int(size)
		case op == 'c': // GLOBAL: two lines
			for range 2 {
				for i < len(p) && p[i] != '\n' {
					i++
				}
				i++
			}
		case op == '.':
			return n, after, true
		default:
			i += arg
		}
		if i > len(p) {
			return 0, 0, false
		}
	}
	return 0, 0, false // no STOP
}

// pickleArg is the size of an opcode's fixed argument, or with lenBytes > 0
// the size of the length before its payload; -1 for an opcode this walker
// does not know (then nothing is changed).
func pickleArg(op byte) (arg, lenBytes int) {
	switch op {
	case 0x80, 'K', 'h', 'q': // PROTO, BININT1, BINGET, BINPUT
		return 1, 0
	case 'M': // BININT2
		return 2, 0
	case 'J', 'j', 'r': // BININT, LONG_BINGET, LONG_BINPUT
		return 4, 0
	case 0x95, 'G': // FRAME, BINFLOAT
		return 8, 0
	case 0x8c, 'C', 'U', 0x8a: // SHORT_BINUNICODE, SHORT_BINBYTES, SHORT_BINSTRING, LONG1
		return 0, 1
	case 'X', 'B', 'T', 0x8b: // BINUNICODE, BINBYTES, BINSTRING, LONG4
		return 0, 4
	case 0x8d, 0x8e, 0x96: // BINUNICODE8, BINBYTES8, BYTEARRAY8
		return 0, 8
	case 'c', '.':
		return 0, 0
	case 0x94, 0x93, ')', 0x81, '}', ']', '(', 0x88, 0x89, 'N', 'u', 's', 'b', 0x8f, 0x90, 0x91,
		0x85, 0x86, 0x87, 't', 'R', 'e', 'a', '0', '1', '2', 'l', 'd', 0x92:
		// MEMOIZE, STACK_GLOBAL, EMPTY_TUPLE, NEWOBJ, EMPTY_DICT, EMPTY_LIST,
		// MARK, NEWTRUE, NEWFALSE, NONE, SETITEMS, SETITEM, BUILD, EMPTY_SET,
		// ADDITEMS, FROZENSET, TUPLE1-3, TUPLE, REDUCE, APPENDS, APPEND, POP,
		// POP_MARK, DUP, LIST, DICT, NEWOBJ_EX
		return 0, 0
	}
	return -1, 0
}

// decodeDatetime reads datetime's pickled payload: year (2 bytes, big
// endian), month, day, hour, minute, second, microsecond (3 bytes). The
// time zone is the pickle's (c10d's are UTC).
func decodeDatetime(b []byte) (time.Time, bool) {
	year := int(b[0])<<8 | int(b[1])
	month, day, hour, minute, sec := int(b[2]), int(b[3]), int(b[4]), int(b[5]), int(b[6])
	us := int(b[7])<<16 | int(b[8])<<8 | int(b[9])
	if year < 2000 || year > 2200 || month < 1 || month > 12 || day < 1 || day > 31 || hour > 23 ||
		minute > 59 || sec > 59 || us > 999999 {
		return time.Time{}, false
	}
	return time.Date(year, time.Month(month), day, hour, minute, sec, us*1000, time.UTC), true
}

func encodeDatetime(b []byte, t time.Time) {
	t = t.UTC()
	b[0], b[1] = byte(t.Year()>>8), byte(t.Year())
	b[2], b[3], b[4], b[5], b[6] = byte(t.Month()), byte(t.Day()), byte(t.Hour()), byte(t.Minute()), byte(t.Second())
	us := t.Nanosecond() / 1000
	b[7], b[8], b[9] = byte(us>>16), byte(us>>8), byte(us)
}

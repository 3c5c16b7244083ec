package relaunch

import (
	"testing"
	"testing/quick"
)

func TestDecide(t *testing.T) {
	p := Policy{MaxPerRank: 2, OOM: DefaultOOM}
	for _, c := range []struct {
		code        string
		recoverable bool
		spent       int
		kind        Kind
		counted     bool
	}{
		{"Preempted", true, 0, Relaunch, false},
		{"Preempted", true, 99, Relaunch, false}, // never counted, never refused
		{"Evicted", true, 5, Relaunch, false},
		{"OOMKilled", true, 0, MoreMemory, true},
		{"OOMKilled", true, 2, None, false}, // budget spent
		{"NodeCheckFailed", true, 1, AvoidHost, true},
		{"Straggler", true, 0, AvoidHost, true},
		{"ValueError", false, 0, None, false},
		{"NodeLost", true, 0, AvoidHost, true},
		{"GpuFallenOffBus", true, 0, AvoidHost, false},
		{"GpuEccUncorrectable", true, 99, AvoidHost, false}, // never counted, never refused
		{"GpuNvlinkError", true, 0, AvoidHost, false},
		{"GpuXidError", true, 0, Relaunch, true},      // a user Xid: in place, counted
		{"GpuDeviceError", true, 0, AvoidHost, false}, // Xid 62, 109: the device needs a reset
		{"NcclTimeout", true, 0, Relaunch, true},
		{"CudaOutOfMemory", false, 0, None, false},
		{"Hang", true, 1, Relaunch, true},
		{"RendezvousTimeout", true, 0, None, false},
		{"JobStopped", true, 0, None, false},
	} {
		kind, counted, why := p.Decide(c.code, c.recoverable, c.spent)
		if kind != c.kind || counted != c.counted {
			t.Errorf("%s (recoverable %v, spent %d): %s counted=%v (%s), want %s counted=%v", c.code, c.recoverable, c.spent,
				kind, counted, why, c.kind, c.counted)
		}
		if kind == None && why == "" {
			t.Errorf("%s: no relaunch without a reason", c.code)
		}
	}
}

func TestOOMRaised(t *testing.T) {
	const gi = 1 << 30
	for _, c := range []struct {
		cur, next int64
		ok        bool
	}{
		{1 * gi, 2 * gi, true},
		{6 * gi, 12 * gi, true},
		{10 * gi, 18 * gi, true}, // +8 GiB at most
		{60 * gi, 64 * gi, true}, // capped
		{64 * gi, 64 * gi, false},
		{0, 0, false},
	} {
		next, ok := DefaultOOM.Raised(c.cur)
		if next != c.next || ok != c.ok {
			t.Errorf("Raised(%d GiB) = %d, %v; want %d, %v", c.cur/gi, next, ok, c.next, c.ok)
		}
	}
	// Against a reference: never shrinks, never above the cap, never by
	// more than the increment, and ok iff it grew.
	f := func(cur int64, factor uint8) bool {
		if cur <= 0 {
			cur = -cur + 1
		}
		p := OOM{Factor: 1 + float64(factor)/50, MaxIncrement: 8 * gi, Max: 64 * gi}
		next, ok := p.Raised(cur)
		if !ok {
			return next == cur
		}
		return next > cur && next <= p.Max && next-cur <= p.MaxIncrement
	}
	if err := quick.Check(f, nil); err != nil {
		t.Error(err)
	}
}

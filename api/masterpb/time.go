package masterpb

import "time"

// The protocol's and the state's times are Unix nanoseconds, 0 for none
// (proto3 has no absent int64). UnixNano and Time convert both ways.

// UnixNano is t in Unix nanoseconds; 0 for the zero time.
func UnixNano(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

// Time is the time of ns Unix nanoseconds; the zero time for 0.
func Time(ns int64) time.Time {
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns)
}

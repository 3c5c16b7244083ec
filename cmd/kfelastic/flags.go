package main

import (
	"fmt"
	"time"
)

// intIn refuses a numeric flag outside [lo, hi]; its --help names the range.
func intIn(flag string, v, lo, hi int) error {
	if v < lo || v > hi {
		return fmt.Errorf("--%s %d: want %d to %d", flag, v, lo, hi)
	}
	return nil
}

// durationIn refuses a duration flag outside [lo, hi] (hi 0: no upper
// bound); its --help names the range.
func durationIn(flag string, d, lo, hi time.Duration) error {
	if d < lo || (hi > 0 && d > hi) {
		if hi > 0 {
			return fmt.Errorf("--%s %v: want %v to %v", flag, d, lo, hi)
		}
		return fmt.Errorf("--%s %v: want at least %v", flag, d, lo)
	}
	return nil
}

// Package relaunch is the master's relaunch policy as pure functions
// (docs/DESIGN.md §5.5): which failure gets its pod relaunched, whether that spends
// the rank's budget, and how much memory a pod gets back after an OOM kill.
// The master decides with it; the plugin's builder (kfoperator) renders the
// same OOM numbers into the job and patches replica templates with it, so
// that there is one implementation of the arithmetic.
package relaunch

import (
	"fmt"
	"math"

	kferrors "github.com/kfelastic/kfelastic/errors"
)

// Kind is what happens to a failed pod's rank.
type Kind int

const (
	// None: the rank is not relaunched (a user error, or its budget is spent).
	None Kind = iota
	// Relaunch: a new pod takes the rank.
	Relaunch
	// MoreMemory: a new pod takes the rank with its memory raised by OOM.
	MoreMemory
	// AvoidHost: a new pod takes the rank on another machine.
	AvoidHost
)

func (k Kind) String() string {
	switch k {
	case None:
		return "none"
	case Relaunch:
		return "relaunch"
	case MoreMemory:
		return "relaunch-more-memory"
	case AvoidHost:
		return "relaunch-avoid-host"
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// Policy is the relaunch policy of one job.
type Policy struct {
	// MaxPerRank is how many counted relaunches one rank gets (DLRover:
	// min(restartCount, 5)); preemptions are not counted.
	MaxPerRank int
	// OOM is how memory grows for a pod relaunched after an OOM kill.
	OOM OOM
}

// DefaultPolicy is DLRover's: 5 counted relaunches per rank, OOM ×2 by at
// most 8 GiB up to 64 GiB.
var DefaultPolicy = Policy{MaxPerRank: 5, OOM: DefaultOOM}

// Decide maps a pod's failure to what happens to its rank, given the
// counted relaunches the rank already had. counted says whether this
// relaunch spends budget. A failure that is not recoverable (a user error)
// is never relaunched: the same code would fail the same way.
func (p Policy) Decide(code string, recoverable bool, spent int) (kind Kind, counted bool, why string) {
	switch {
	case code == kferrors.CodePreempted || code == kferrors.CodeEvicted:
		return Relaunch, false, "preempted pods are relaunched without spending budget"
	case !recoverable:
		return None, false, "a user error is not relaunched"
	case code == kferrors.CodeRendezvousTimeout:
		return None, false, "a pod that found no round in time would wait in vain elsewhere too"
	case code == kferrors.CodeJobStopped:
		return None, false, "the job stopped"
	case kferrors.IsHardwareCode(code):
		// The device failed, not the workload: no budget spent, and the
		// replacement goes to another machine (each such relaunch avoids
		// one more; with none left the pod pends, and the pend timeout
		// decides).
		return AvoidHost, false, "a hardware fault: relaunched elsewhere without spending budget"
	}
	kind = Relaunch
	switch code {
	case kferrors.CodeOOMKilled:
		kind = MoreMemory
	case kferrors.CodeNodeCheckFailed, kferrors.CodeStraggler, kferrors.CodeNodeLost:
		kind = AvoidHost
	}
	if spent >= p.MaxPerRank {
		return None, false, fmt.Sprintf("rank relaunched %d times already (limit %d)", spent, p.MaxPerRank)
	}
	return kind, true, ""
}

// OOM is how much memory a pod relaunched after an OOM kill gets: the
// current amount times Factor, raised by no more than MaxIncrement, capped
// at Max (bytes; 0 means no bound).
type OOM struct {
	Factor       float64
	MaxIncrement int64
	Max          int64
}

// DefaultOOM is DLRover's: ×2, at most +8 GiB, at most 64 GiB.
var DefaultOOM = OOM{Factor: 2, MaxIncrement: 8 << 30, Max: 64 << 30}

// Raised is the memory after one OOM kill of a pod that had current bytes.
// ok is false when it cannot grow (at the cap, or a factor ≤ 1): relaunching
// would be killed the same way.
func (p OOM) Raised(current int64) (next int64, ok bool) {
	if current <= 0 {
		return current, false
	}
	f := float64(current) * p.Factor
	if f > math.MaxInt64/2 {
		f = math.MaxInt64 / 2
	}
	next = int64(math.Ceil(f))
	if p.MaxIncrement > 0 && next-current > p.MaxIncrement {
		next = current + p.MaxIncrement
	}
	if p.Max > 0 && next > p.Max {
		next = p.Max
	}
	if next <= current {
		return current, false
	}
	return next, true
}

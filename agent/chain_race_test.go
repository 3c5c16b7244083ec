//go:build race

package agent

// Under the race detector each TestChain case costs five times as much:
// a third of the cases keep the test within a few seconds.
func init() { chainCases = 1000 }

//go:build race

package nodecheck

// The race detector slows the Go check's matmul some 30×: tests that
// compare timings skip.
func init() { raceEnabled = true }

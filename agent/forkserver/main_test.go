package forkserver

import (
	"testing"

	"github.com/kfelastic/kfelastic/internal/test/testenv"
)

// TestMain runs the tests in a temp folder of their own, removed after
// (testenv.Main): what the processes they start leave there goes too.
func TestMain(m *testing.M) { testenv.Main(m) }

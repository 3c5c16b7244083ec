package main

import (
	"testing"

	"github.com/kfelastic/kfelastic/internal/test/testenv"
)

// TestMain stops the MinIO server the tests start (testenv.MinIO).
func TestMain(m *testing.M) { testenv.Main(m) }

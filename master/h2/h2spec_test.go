package h2_test

import (
	"path/filepath"
	"testing"

	"github.com/kfelastic/kfelastic/internal/test/h2test"
	"github.com/kfelastic/kfelastic/master/h2"
)

// The server held to h2spec, its known failures in testdata/h2spec.txt
// (grpc-go's server's are master/testdata/h2spec/grpc.txt).
func TestH2spec(t *testing.T) {
	_, addr, _ := serve(t, t.Context(), h2.Config{})
	h2test.H2spec(t, addr, filepath.Join("testdata", "h2spec.txt"))
}

package kubeenv

import (
	"archive/tar"
	"bytes"
	"encoding/binary"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// A layer keeps a tree's Python bytecode only when asked, and a source's
// time as Python checks it against its .pyc: the whole second, truncated
// (a source stamped .7 s past a second kept its .pyc valid in the pod).
func TestWriteTreeBytecode(t *testing.T) {
	root := t.TempDir()
	src := filepath.Join(root, "pkg", "mod.py")
	pyc := filepath.Join(root, "pkg", "__pycache__", "mod.cpython-311.pyc")
	if err := os.MkdirAll(filepath.Dir(pyc), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(src, []byte("x = 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	mtime := time.Unix(1_700_000_000, 700_000_000)
	if err := os.Chtimes(src, mtime, mtime); err != nil {
		t.Fatal(err)
	}
	// A .pyc's header (PEP 552): magic, flags, the source's int(st_mtime), its size.
	header := make([]byte, 16)
	binary.LittleEndian.PutUint32(header[8:], uint32(mtime.Unix()))
	binary.LittleEndian.PutUint32(header[12:], 6)
	if err := os.WriteFile(pyc, header, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, bytecode := range []bool{true, false} {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		if err := writeTree(tw, root, "opt", map[string]bool{}, bytecode); err != nil {
			t.Fatal(err)
		}
		if err := tw.Close(); err != nil {
			t.Fatal(err)
		}
		times := map[string]time.Time{}
		tr := tar.NewReader(&buf)
		for {
			h, err := tr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			times[h.Name] = h.ModTime
		}
		_, hasPyc := times["opt/pkg/__pycache__/mod.cpython-311.pyc"]
		if hasPyc != bytecode {
			t.Errorf("bytecode %v: the layer has the .pyc: %v (%v)", bytecode, hasPyc, times)
		}
		if got := times["opt/pkg/mod.py"]; got.Unix() != mtime.Unix() {
			t.Errorf("bytecode %v: the source's time in the layer %v, its .pyc says %v", bytecode, got, mtime.Unix())
		}
	}
}

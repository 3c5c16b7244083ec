package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// install copies the running binary (here the test binary) into the
// folder, executable, and a second run leaves the same file and no
// temporary one.
func TestInstallCopiesTheRunningBinary(t *testing.T) {
	dir := t.TempDir()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	for run := 1; run <= 2; run++ {
		out, err := runFreshCmd(t, newInstallCmd(), time.Minute, dir)
		if err != nil {
			t.Fatalf("run %d: %v\n%s", run, err, out)
		}
		dst := filepath.Join(dir, "kfelastic")
		if !strings.Contains(out, "installed "+dst) {
			t.Errorf("run %d printed %q", run, out)
		}
		checkInstalled(t, dir, want)
	}
}

// An older file at the destination (another version, not executable) is
// replaced whole.
func TestInstallReplacesAnOlderFile(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(t.TempDir(), "new")
	content := bytes.Repeat([]byte("new binary "), 100_000)
	if err := os.WriteFile(src, content, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "kfelastic"), []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	dst, n, err := installBinary(src, dir)
	if err != nil || n != int64(len(content)) || dst != filepath.Join(dir, "kfelastic") {
		t.Fatalf("installBinary = %q, %d, %v", dst, n, err)
	}
	checkInstalled(t, dir, content)
}

func TestInstallErrors(t *testing.T) {
	src := filepath.Join(t.TempDir(), "bin")
	if err := os.WriteFile(src, []byte("x"), 0o755); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "a-file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	// The destination name taken by a folder: the rename fails, and the
	// temporary file is gone.
	taken := t.TempDir()
	if err := os.Mkdir(filepath.Join(taken, "kfelastic"), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]struct{ src, dir, want string }{
		"no folder":         {src, filepath.Join(t.TempDir(), "missing"), "does not exist"},
		"a file, no folder": {src, file, "is not a folder"},
		"no source":         {filepath.Join(t.TempDir(), "gone"), t.TempDir(), "open this binary"},
		"name taken":        {src, taken, "install: rename"},
	} {
		if _, _, err := installBinary(c.src, c.dir); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error saying %q", name, err, c.want)
		}
	}
	if entries, _ := os.ReadDir(taken); len(entries) != 1 {
		t.Errorf("a failed install left %d entries behind", len(entries))
	}
	if _, err := runFreshCmd(t, newInstallCmd(), time.Minute); err == nil {
		t.Error("install without a folder: no error")
	}
}

// checkInstalled: dir holds kfelastic with content, mode 0755, and nothing else.
func checkInstalled(t *testing.T, dir string, content []byte) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 || entries[0].Name() != "kfelastic" {
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Fatalf("folder holds %q, want only kfelastic", names)
	}
	st, err := os.Stat(filepath.Join(dir, "kfelastic"))
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o755 {
		t.Errorf("mode %v, want 0755", st.Mode().Perm())
	}
	got, err := os.ReadFile(filepath.Join(dir, "kfelastic"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, content) {
		t.Errorf("installed %d bytes, differing from the %d of the source", len(got), len(content))
	}
}

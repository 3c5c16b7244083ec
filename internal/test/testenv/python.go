package testenv

import (
	"os"
	"path/filepath"
	"testing"
)

// SystemPython is Debian's Python 3, with torch 1.13 where scripts/deps.sh
// torch installed it.
const SystemPython = "/usr/bin/python3"

// NeedPython skips a test that runs SystemPython (one that needs no torch;
// those that should hold on every torch run per torch, ForEachTorch): with
// -short, or where there is none.
func NeedPython(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("real python: skipped with -short")
	}
	if _, err := os.Stat(SystemPython); err != nil {
		t.Skipf("no %s", SystemPython)
	}
}

// TempFile writes content to a file called name in a new temporary folder
// and returns its path.
func TempFile(t testing.TB, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

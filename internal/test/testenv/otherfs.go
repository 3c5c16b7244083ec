package testenv

import (
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
)

// OtherFileSystem returns an empty folder on a file system other than
// os.TempDir()'s, so that a write that renames from os.TempDir() into it
// fails as it does on a machine whose /tmp is a tmpfs (EXDEV). As root it
// mounts a tmpfs of sizeBytes (unmounted when the test ends); otherwise it
// uses /dev/shm when that is another file system (sizeBytes is then not
// enforced), and else skips the test.
func OtherFileSystem(t testing.TB, sizeBytes int64) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "tmpfs")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if os.Geteuid() == 0 {
		if sizeBytes <= 0 {
			sizeBytes = 64 << 20
		}
		opts := "size=" + strconv.FormatInt(sizeBytes, 10)
		if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, opts); err == nil {
			t.Cleanup(func() {
				if err := syscall.Unmount(dir, syscall.MNT_DETACH); err != nil {
					t.Errorf("unmount %s: %v", dir, err)
				}
			})
			return dir
		}
	}
	if device("/dev/shm") != device(os.TempDir()) {
		d, err := os.MkdirTemp("/dev/shm", "kfelastic-test-")
		if err == nil {
			t.Cleanup(func() { os.RemoveAll(d) })
			return d
		}
	}
	t.Skip("no second file system: not root (to mount a tmpfs), and /dev/shm is not one")
	return ""
}

func device(path string) uint64 {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return 0
	}
	return uint64(st.Dev)
}

package testenv

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// tmpPrefix names a test process's own temp folder: tmpPrefix + its pid.
const tmpPrefix = "kfelastic-test-"

// privateTmp points TMPDIR, for this test process and everything it
// starts, at a folder of its own in the machine's temp folder, and returns
// what removes it. What the processes a test runs leave there on purpose
// or when killed goes with it: torchrun's and the agent's log folders
// (torchelastic_*, kfelastic_*: kept after a run, as torchrun keeps its),
// multiprocessing's pymp-* folders, flytekit's sandboxes, the tests' own
// builds. A folder left by a killed test process (its pid is gone) is
// removed by the next one.
func privateTmp() (remove func()) {
	base := os.TempDir()
	removeOrphanTmps(base)
	dir := filepath.Join(base, tmpPrefix+strconv.Itoa(os.Getpid()))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return func() {} // the tests run in the machine's temp folder
	}
	os.Setenv("TMPDIR", dir)
	return func() {
		os.Setenv("TMPDIR", base)
		_ = os.RemoveAll(dir)
	}
}

// removeOrphanTmps removes the private temp folders in base of test
// processes that are gone, after killing what still runs from them: the
// servers a killed test process started that no death signal reached
// (envtest's etcd and kube-apiserver, whose data and certificates are
// there).
func removeOrphanTmps(base string) {
	entries, _ := os.ReadDir(base)
	for _, e := range entries {
		pid, err := strconv.Atoi(strings.TrimPrefix(e.Name(), tmpPrefix))
		if !e.IsDir() || !strings.HasPrefix(e.Name(), tmpPrefix) || err != nil || pid <= 0 || Alive(pid) {
			continue
		}
		dir := filepath.Join(base, e.Name())
		killUsing(dir)
		_ = os.RemoveAll(dir)
	}
}

// killUsing SIGKILLs the processes whose command line names a path in dir.
func killUsing(dir string) {
	cmdlines, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, f := range cmdlines {
		b, err := os.ReadFile(f)
		if err != nil || !strings.Contains(string(b), dir+"/") {
			continue
		}
		if pid, err := strconv.Atoi(filepath.Base(filepath.Dir(f))); err == nil && pid != os.Getpid() {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

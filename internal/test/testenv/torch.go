package testenv

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
)

// Torch is a Python with torch that real workers run on: Debian's torch 1.13
// (/usr/bin/python3) or torch 2.14 in the Debian sid root that
// `scripts/deps.sh torch2` builds, run by scripts/torch2.14/python3 (the
// project, /tmp and the current folder visible at their own paths; see
// scripts/torch-python).
type Torch struct {
	// Version is "1.13" or "2.14".
	Version string
	// Python is the interpreter, by a name launchers know as a python.
	Python string
}

// Name is the subtest name for t: "torch1.13", "torch2.14".
func (t Torch) Name() string { return "torch" + t.Version }

// TorchVersions are the torch versions every torch-facing test runs on.
var TorchVersions = []string{"1.13", "2.14"}

// ProjectRoot is the module's folder.
func ProjectRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", "..", ".."))
}

// Cache is $KFELASTIC_CACHE, else ~/.cache/kfelastic.
func Cache() string {
	if c := os.Getenv("KFELASTIC_CACHE"); c != "" {
		return c
	}
	home, _ := os.UserHomeDir()
	return filepath.Join(home, ".cache", "kfelastic")
}

// TorchSidRoot is the root file system holding torch 2.14.
func TorchSidRoot() string { return filepath.Join(Cache(), "torch-sid") }

// TorchFor is the torch of version v and whether it is here. A torch that
// is not here has a note in why.
func TorchFor(v string) (tc Torch, why string) {
	switch v {
	case "1.13":
		tc = Torch{Version: v, Python: "/usr/bin/python3"}
		if TorchImports(tc.Python) != nil {
			return tc, "no torch 1.13: scripts/deps.sh torch installs Debian's python3-torch"
		}
	case "2.14":
		tc = Torch{Version: v, Python: filepath.Join(ProjectRoot(), "scripts", "torch2.14", "python3")}
		if _, err := os.Stat(filepath.Join(TorchSidRoot(), "usr/lib/python3/dist-packages/torch")); err != nil {
			return tc, "no torch 2.14 (scripts/deps.sh torch2 builds it into " + TorchSidRoot() + ")"
		}
	default:
		return tc, "no torch " + v + " in this project"
	}
	return tc, ""
}

// Torches are the torches present, in TorchVersions' order, or those that
// $KFELASTIC_TORCH names (comma-separated, e.g. 2.14). An entry VERSION=PATH
// names an interpreter with that torch from elsewhere, such as a machine's
// own (2.11=/opt/torch/.venv/bin/python3): the torch 2.x checks then run on
// it as they do on Debian's. An absent one is noted in the test's log; with
// none, the test is skipped.
func Torches(t testing.TB) []Torch {
	t.Helper()
	want := TorchVersions
	if env := os.Getenv("KFELASTIC_TORCH"); env != "" {
		want = strings.Split(env, ",")
	}
	var ts []Torch
	for _, v := range want {
		tc, why := TorchNamed(strings.TrimSpace(v))
		if why != "" {
			t.Logf("%s: its tests skip", why)
			continue
		}
		ts = append(ts, tc)
	}
	if len(ts) == 0 {
		t.Skip("no torch here")
	}
	return ts
}

// ForEachTorch runs f as a subtest per torch present (Torches).
func ForEachTorch(t *testing.T, f func(t *testing.T, tc Torch)) {
	t.Helper()
	for _, tc := range Torches(t) {
		t.Run(tc.Name(), func(t *testing.T) { f(t, tc) })
	}
}

// OnTorch runs f as one subtest, on the torch named prefer when it is
// present (Torches), else on the first present: for a test whose subject
// is not torch-facing and that runs a real torch job only as its load.
// Spreading such tests over the torches keeps each torch under every part
// of the engine at half the suite's time (issue 26: a torch 2.14 job
// costs twice a 1.13 one on 2 cores). $KFELASTIC_TORCH_ALL=1 runs f on
// every torch, as ForEachTorch.
func OnTorch(t *testing.T, prefer string, f func(t *testing.T, tc Torch)) {
	t.Helper()
	if os.Getenv("KFELASTIC_TORCH_ALL") == "1" {
		ForEachTorch(t, f)
		return
	}
	ts := Torches(t)
	tc := ts[0]
	for _, c := range ts {
		if c.Version == prefer {
			tc = c
		}
	}
	t.Run(tc.Name(), func(t *testing.T) { f(t, tc) })
}

// TorchNamed is TorchFor(entry), or for VERSION=PATH the interpreter at PATH
// if it imports torch.distributed.
func TorchNamed(entry string) (Torch, string) {
	v, py, ok := strings.Cut(entry, "=")
	if !ok {
		return TorchFor(entry)
	}
	tc := Torch{Version: v, Python: py}
	if err := TorchImports(py); err != nil {
		return tc, fmt.Sprintf("no torch %s at %s (%v)", v, py, err)
	}
	return tc, ""
}

// torchImports holds TorchImports's answer per interpreter.
var torchImports sync.Map // string → func() error

// TorchImports says whether the Python at py imports torch.distributed,
// asked once per test process: the import costs 1.4 s of CPU on 1.13 and
// 2.5 s on 2.14 here, and the tests asked it before each test (≈30 s of
// CPU in local's tests alone).
func TorchImports(py string) error {
	f, _ := torchImports.LoadOrStore(py, sync.OnceValue(func() error {
		if out, err := exec.Command(py, "-c", "import torch.distributed").CombinedOutput(); err != nil {
			return fmt.Errorf("%v: %s", err, bytes.TrimSpace(out))
		}
		return nil
	}))
	return f.(func() error)()
}

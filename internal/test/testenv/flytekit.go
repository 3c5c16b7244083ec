package testenv

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// FlytekitVersion is the real flytekit the tests run (../shared/flytekit).
const FlytekitVersion = "1.16.24"

// FlytekitEnv is real flytekit, unpacked by `scripts/deps.sh flytekit`
// into the cache: its pure-Python site and the console scripts pip would
// have made, run by Debian's Python (SystemPython, torch 1.13) with the
// rest of its dependencies from Debian.
type FlytekitEnv struct {
	// Dir is the unpacked tarball: site/, pyflyte-execute, licenses/.
	Dir string
	// Site is the folder to put on PYTHONPATH.
	Site string
	// PyflyteExecute is the pyflyte-execute script (#!/usr/bin/python3).
	PyflyteExecute string
	// Python is the interpreter that sees both the site and Debian's
	// packages: always SystemPython, never the python3 first on PATH
	// (a pyenv build here, blind to Debian's dist-packages).
	Python string
}

// FlytekitSource is where the tarball is: $KFELASTIC_FLYTEKIT, else
// ../shared/flytekit beside the repository. It is a fixture that never
// enters the repository.
func FlytekitSource() string {
	if d := os.Getenv("KFELASTIC_FLYTEKIT"); d != "" {
		return d
	}
	return filepath.Join(ProjectRoot(), "..", "shared", "flytekit")
}

// FlytekitDir is where scripts/deps.sh flytekit unpacks the tarball.
func FlytekitDir() string { return filepath.Join(CacheDir(), "flytekit-"+FlytekitVersion) }

// Env is base with what a pod's pyflyte-execute needs: the site first on
// PYTHONPATH (then pythonPath, folders of the user's task modules), and on
// PATH the scripts' folder and /usr/bin before the rest, so that a
// `python3` or `pyflyte-execute` found there is flytekit's and Debian's.
// Any PYTHONPATH or PATH of base is replaced.
func (f FlytekitEnv) Env(base []string, pythonPath ...string) []string {
	path := os.Getenv("PATH")
	var env []string
	for _, kv := range base {
		k, v, _ := strings.Cut(kv, "=")
		switch k {
		case "PYTHONPATH":
			continue
		case "PATH":
			path = v
			continue
		}
		env = append(env, kv)
	}
	return append(env,
		"PYTHONPATH="+strings.Join(append([]string{f.Site}, pythonPath...), string(os.PathListSeparator)),
		"PATH="+f.Dir+string(os.PathListSeparator)+"/usr/bin"+string(os.PathListSeparator)+path)
}

var flytekitOnce = sync.OnceValues(func() (FlytekitEnv, string) {
	dir := FlytekitDir()
	f := FlytekitEnv{Dir: dir, Site: filepath.Join(dir, "site"), PyflyteExecute: filepath.Join(dir, "pyflyte-execute"),
		Python: SystemPython}
	tarball := filepath.Join(FlytekitSource(), "flytekit-"+FlytekitVersion+"-site.tar.gz")
	if _, err := os.Stat(filepath.Join(f.Site, "flytekit", "__init__.py")); err != nil {
		if _, err := os.Stat(tarball); err != nil {
			return f, "no real flytekit: no " + tarball + " (KFELASTIC_FLYTEKIT names its folder)"
		}
		return f, "real flytekit not unpacked into " + dir + ": scripts/deps.sh flytekit"
	}
	if _, err := os.Stat(f.PyflyteExecute); err != nil {
		return f, "no " + f.PyflyteExecute + ": scripts/deps.sh flytekit"
	}
	cmd := exec.Command(f.Python, "-c", "import flytekit, flytekitplugins.kfpytorch, torch.distributed")
	cmd.Env = f.Env(os.Environ())
	if out, err := cmd.CombinedOutput(); err != nil {
		lines := strings.Split(string(bytes.TrimSpace(out)), "\n")
		return f, "real flytekit does not import on " + f.Python + " (" + err.Error() + ": " + lines[len(lines)-1] +
			"): scripts/deps.sh flytekit installs the Debian packages it needs"
	}
	return f, ""
})

// Flytekit is real flytekit for t, checked once per test binary (the
// site imports with torch on SystemPython). It skips t with -short, and
// with the reason where flytekit is not here (no tarball, not unpacked,
// a Debian package missing).
func Flytekit(t testing.TB) FlytekitEnv {
	t.Helper()
	if testing.Short() {
		t.Skip("real flytekit: skipped with -short")
	}
	f, why := flytekitOnce()
	if why != "" {
		t.Skip(why)
	}
	return f
}

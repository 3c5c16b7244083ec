package agent

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestPythonScript(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"train.py", "--steps", "5"}, "train.py"},
		{[]string{"-u", "train.py"}, "train.py"},
		{[]string{"-OO", "-B", "train.py", "-m", "x"}, "train.py"},
		{[]string{"--", "train.py"}, "train.py"},
		{[]string{"-m", "torch.distributed.run", "train.py"}, ""},
		{[]string{"-c", "print(1)"}, ""},
		{[]string{"-uc", "print(1)"}, ""},
		{[]string{"-W", "ignore", "train.py"}, ""},
		{[]string{"-Xdev", "train.py"}, ""},
		{[]string{"--check-hash-based-pycs", "always", "train.py"}, ""},
		{[]string{"-"}, ""},
		{[]string{"--", "-"}, ""},
		{nil, ""},
	} {
		if got := pythonScript(c.args); got != c.want {
			t.Errorf("pythonScript(%q) = %q, want %q", c.args, got, c.want)
		}
	}
}

func TestUnstartable(t *testing.T) {
	dir := t.TempDir()
	script := filepath.Join(dir, "train.py")
	if err := os.WriteFile(script, []byte("pass\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, ok := range [][]string{
		{"python3", script}, {"python3", "-m", "nosuchmodule"}, {"sh", "-c", "exit 0"}, {"python3", "-c", "1"},
	} {
		if why := unstartable(ok); why != "" {
			t.Errorf("unstartable(%q) = %q", ok, why)
		}
	}
	for want, cmd := range map[string][]string{
		`python3 cannot open its script "` + filepath.Join(dir, "gone.py") + `": no such file or directory`:   {"python3", filepath.Join(dir, "gone.py")},
		`python3 cannot open its script "` + script + `/x.py": not a directory`:                               {"python3", "-u", script + "/x.py"},
		`the command's program "no-such-program-kfelastic" cannot be run: executable file not found in $PATH`: {"no-such-program-kfelastic"},
		`the command's program "` + script + `" cannot be run: permission denied`:                             {script},
	} {
		if why := unstartable(cmd); !strings.HasPrefix(why, want) || !strings.Contains(why, "working directory ") {
			t.Errorf("unstartable(%q) = %q, want %q (working directory …)", cmd, why, want)
		}
	}
}

// InterpreterOf finds the job's python by name, or through a script's
// shebang, looked up in PATH as the shell would.
func TestInterpreterOf(t *testing.T) {
	dir := t.TempDir()
	script := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	script("pyflyte-execute", "#!/usr/bin/env python3\nprint(1)\n")
	script("envflags", "#!/usr/bin/env -S python3.11 -u\n")
	script("envassign", "#!/usr/bin/env PYTHONUNBUFFERED=1 python3\n")
	script("direct", "#!/opt/venv/bin/python3.12 -u\n")
	script("spaced", "#! /opt/conda/bin/python\n")
	script("shell", "#!/bin/sh\nexec python3 \"$@\"\n")
	script("notes", "python3 is not a shebang\n")
	script("noexec", "#!/usr/bin/python3\n")
	_ = os.Chmod(filepath.Join(dir, "noexec"), 0o644)
	t.Setenv("PATH", dir+":/usr/bin:/bin")
	for _, c := range []struct {
		cmd  []string
		want string
	}{
		{[]string{"python3", "train.py"}, "python3"},
		{[]string{"/usr/bin/python3.11", "-m", "x"}, "/usr/bin/python3.11"},
		{[]string{"python"}, "python"},
		{[]string{"pyflyte-execute", "--task-module", "m"}, "python3"},
		{[]string{filepath.Join(dir, "pyflyte-execute")}, "python3"},
		{[]string{"envflags"}, "python3.11"},
		{[]string{"envassign"}, "python3"},
		{[]string{"direct"}, "/opt/venv/bin/python3.12"},
		{[]string{"spaced"}, "/opt/conda/bin/python"},
		{[]string{"shell"}, ""},
		{[]string{"notes"}, ""},
		{[]string{"noexec"}, ""},
		{[]string{"sh", "-c", "python3 x.py"}, ""},
		{[]string{"no-such-command-here"}, ""},
		{nil, ""},
	} {
		if got := InterpreterOf(c.cmd); got != c.want {
			t.Errorf("InterpreterOf(%q) = %q, want %q", c.cmd, got, c.want)
		}
	}
}

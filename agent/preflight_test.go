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

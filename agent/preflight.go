package agent

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"

	"golang.org/x/sys/unix"
)

// unstartable says why the workers' command cannot run, whoever starts
// it, or "" when it can as far as the agent can tell: its program is not
// found or not executable, or it is `python [FLAGS] SCRIPT …` and the
// script does not exist or cannot be read. Such a failure is the same on
// every restart, so the pod fails at once and says what is missing,
// instead of restarting into it (a missing script ended as NonZeroExit
// after 4 attempts, without naming the file). Only the cases known to be
// permanent are judged; anything else is left to the start itself.
func unstartable(command []string) string {
	if len(command) == 0 {
		return ""
	}
	if _, err := exec.LookPath(command[0]); err != nil {
		var ee *exec.Error
		if errors.As(err, &ee) {
			err = unwrapPath(ee.Err)
		}
		return fmt.Sprintf("the command's program %q cannot be run: %v%s", command[0], err, workingDir())
	}
	if !pythonName.MatchString(filepath.Base(command[0])) {
		return ""
	}
	script := pythonScript(command[1:])
	if script == "" {
		return ""
	}
	if _, err := os.Stat(script); err != nil {
		return fmt.Sprintf("%s cannot open its script %q: %v%s", command[0], script, unwrapPath(err), workingDir())
	}
	if err := unix.Access(script, unix.R_OK); err != nil {
		return fmt.Sprintf("%s cannot read its script %q: %v%s", command[0], script, err, workingDir())
	}
	return ""
}

// pythonScript is the script of a Python command line's arguments, after
// the interpreter: the first argument that is not a flag. Flags that take
// no value (-u, -B, -OO, …) are skipped; "" where there is no script file
// or the agent cannot tell (-c, -m, -W/-X and the long options, stdin).
func pythonScript(args []string) string {
	for i, a := range args {
		switch {
		case a == "--":
			if i+1 < len(args) && args[i+1] != "-" {
				return args[i+1]
			}
			return ""
		case a == "-":
			return ""
		case strings.HasPrefix(a, "-"):
			if strings.Trim(a[1:], "bBdEiIOPqRsSuvx") != "" {
				return "" // -c, -m, -W, -X, --long, or one this does not know
			}
		default:
			return a
		}
	}
	return ""
}

func unwrapPath(err error) error {
	if pe, ok := err.(*os.PathError); ok {
		return pe.Err
	}
	return err
}

func workingDir() string {
	if wd, err := os.Getwd(); err == nil {
		return " (working directory " + wd + ")"
	}
	return ""
}

var pythonName = regexp.MustCompile(`^python[0-9.]*$`)

// InterpreterOf is the Python interpreter a job's command runs: its first
// word if that is python*, else the interpreter named in the shebang of the
// script it starts (pyflyte-execute, a torchrun-style entry point); "" if
// neither.
func InterpreterOf(command []string) string {
	if len(command) == 0 {
		return ""
	}
	if pythonName.MatchString(filepath.Base(command[0])) {
		return command[0]
	}
	path, err := exec.LookPath(command[0])
	if err != nil {
		return ""
	}
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	head := make([]byte, 256)
	n, _ := io.ReadFull(f, head)
	first, _, _ := bytes.Cut(head[:n], []byte("\n"))
	shebang, ok := bytes.CutPrefix(first, []byte("#!"))
	if !ok {
		return ""
	}
	words := strings.Fields(string(shebang))
	switch {
	case len(words) == 0:
		return ""
	case filepath.Base(words[0]) == "env":
		// env's flags (-S, -i) and NAME=VALUE come first.
		for _, w := range words[1:] {
			if pythonName.MatchString(filepath.Base(w)) {
				return w
			}
			if !strings.HasPrefix(w, "-") && !strings.Contains(w, "=") {
				return ""
			}
		}
	case pythonName.MatchString(filepath.Base(words[0])):
		return words[0]
	}
	return ""
}

package agent

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
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

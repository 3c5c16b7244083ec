package agent

import (
	"path/filepath"
	"strings"
)

// forkable reports whether the fork server can stand in for the command:
// `python[3[.x]] SCRIPT ARGS` or `python… -m MODULE ARGS`, with no other
// interpreter flags.
func forkable(command []string) bool {
	if len(command) < 2 || !pythonName.MatchString(filepath.Base(command[0])) {
		return false
	}
	if command[1] == "-m" {
		return len(command) >= 3 && !strings.HasPrefix(command[2], "-")
	}
	return !strings.HasPrefix(command[1], "-")
}

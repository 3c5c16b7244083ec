package agent

import (
	"path/filepath"
	"strings"

	"github.com/kfelastic/kfelastic/agent/forkserver"
)

// How a worker's process starts (docs/DESIGN.md §4.7). Starting Python and
// importing torch is most of a restart, so the agent's own workers start in
// one of three ways, chosen once per group (workerGroups.launcher):
//
//   - exec: a new interpreter per worker, as torchrun does; always works;
//   - the fork server (the default for `python SCRIPT` and `python -m
//     MODULE` commands): forked from one interpreter that has imported the
//     preloads (agent/forkserver);
//   - warm spares (--warm-spares): interpreters started ahead during the
//     last attempt, their imports done, handed the worker's environment
//     (spare.go).
//
// The two fast ways fall back to exec for a worker they cannot start, so a
// launch fails only where exec fails. --launcher command's child is always
// exec'd.

// launcher starts the process of one worker of a group.
type launcher interface {
	// launch runs w with env as its whole environment and returns the
	// worker whose process now runs as w: w itself, or the warm spare
	// that stands in for it.
	launch(gs groupStart, w *worker, env []string) (*worker, error)
}

// execLauncher execs the worker command: a new interpreter per worker.
type execLauncher struct{}

func (execLauncher) launch(gs groupStart, w *worker, env []string) (*worker, error) {
	return w, w.spawn(gs, gs.command, env, nil)
}

// forkLauncher forks the workers from a fork server that is ready. A worker
// it cannot fork is exec'd, and so is the rest of the group: a server that
// failed once is not asked again for this attempt (the loop decides at the
// next group start whether it is given up or replaced).
type forkLauncher struct {
	server *forkserver.Server
	failed bool
}

func (f *forkLauncher) launch(gs groupStart, w *worker, env []string) (*worker, error) {
	if !f.failed {
		err := w.fork(gs, f.server, env)
		if err == nil {
			return w, nil
		}
		gs.log.Warn("the fork server did not start the worker; starting this attempt's workers with exec",
			"attempt", w.attempt, "local_rank", w.localRank, "err", err)
		f.failed = true
	}
	return execLauncher{}.launch(gs, w, env)
}

// spareLauncher releases the warm spares started for the attempt, by local
// rank (nil where none was started); a worker whose spare is gone is
// exec'd. Spares not released are the caller's to discard.
type spareLauncher struct{ spares []*worker }

func (s spareLauncher) launch(gs groupStart, w *worker, env []string) (*worker, error) {
	if w.localRank < len(s.spares) {
		if spare := s.spares[w.localRank]; spare != nil && spare.attempt == w.attempt {
			if err := spare.release(env); err == nil {
				return spare, nil
			}
			spare.discard()
		}
	}
	return execLauncher{}.launch(gs, w, env)
}

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

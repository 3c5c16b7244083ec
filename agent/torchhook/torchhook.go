// Package torchhook is the agent's hook inside a --launcher command's Python
// (docs/DESIGN.md §4.4): it makes torch's own elastic agent there restart
// its workers as fast as the agent's fork server does under --launcher
// agent, and see a completed rendezvous at once.
//
// Under --launcher command torch's elastic agent inside the command starts
// the workers, not the agent, and flytekit has it use multiprocessing's
// "spawn": every worker, at every restart, is a new interpreter that imports
// torch and the task's module again (2–3 s on torch 2.x, most of a restart;
// under load far more), and in a replacement pod that comes after the
// command's own import of torch. The agent cannot fork those workers from
// outside; the only place is inside the command's Python. So the agent puts
// a sitecustomize.py (this package's) first on the command's PYTHONPATH.
// With Preload, once the command has imported torch it forks itself into
// multiprocessing's forkserver (forkserver.main, in a fork instead of a
// fresh interpreter), and has torch elastic's MultiprocessContext use it
// where it was told "spawn". torch is then imported once in the pod: a
// fresh server importing it beside the command took the replacement pod's
// start from 1.4 s to 5 s under a 1-CPU limit. When the command imports
// torch elastic's multiprocessing, the server is forked again if it has
// served nothing, so that it has the launcher's modules too. The server
// keeps only the Python installation's modules (the standard library,
// site- and dist-packages) and a blank __main__: a worker imports the
// user's modules afresh. A command that runs a thread when it imports
// torch is not forked (a lock another thread holds would stay locked in
// the fork): its server is a fresh interpreter that imports torch, with a
// line on stderr. A worker is a fork of that server: it gets its own
// environment and files as torch gives them, only without importing torch
// again: each request carries the command's environment, umask and
// rlimits of the moment, which the forked child takes before it imports
// the task's module, as a spawned interpreter would have them (spawn stays
// where a fork cannot have them). The server's workers wait for their
// process group's store to listen (torch 1.13 waits a whole second after a
// refused connection). A fork of the command (torch's start method "fork")
// forgets the server. Python 3.14 made the forkserver multiprocessing's
// default on Linux; flytekit asks for spawn to be safe from a parent's
// threads and CUDA: the server is forked before the command can have
// started either.
//
// With Poll, c10d's rendezvous reads its state that often while it waits
// for other nodes, instead of once a second: its store is then the master,
// through the agent's relay. With RoundFile, c10d's rendezvous completes as
// soon as it has as many nodes as the master's round (the agent keeps that
// file), instead of waiting out its last call for nodes up to max_nodes
// that the master knows are not coming: 30 s of every round of an elastic
// task such as flytekit's Elastic(nnodes="2:3").
//
// It is off with --fork-server=false (Preload) and without a relay (Poll).
// It runs only in the topmost Python below the caller of Env (ParentEnv):
// below a command's Python that ran without it (python -I, -E, -S) it is
// nowhere. It starts no forkserver under torchrun, whose workers are
// subprocesses;
// it never fails the command (whatever goes wrong leaves torch as it was,
// with a line on stderr), runs the sitecustomize it hides, and takes itself
// out of the environment, so that nothing below the command sees it.
package torchhook

import (
	_ "embed"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

//go:embed sitecustomize.py
var program []byte

// ServerComm is the hook's forkserver's process name (/proc/PID/comm): its
// command line is the command's, whose fork it is, so the agent knows it
// by this name (its children are the workers). The workers take the
// command's name back.
const ServerComm = "kfe-forkserver"

const (
	// PreloadEnv turns the forkserver on, with the modules it imports
	// (comma-separated).
	PreloadEnv = "KFELASTIC_SPAWN_PRELOAD"
	// PollEnv is c10d's rendezvous poll interval in seconds.
	PollEnv = "KFELASTIC_RDZV_POLL"
	// DrainEnv has the hook read spawned workers' error queues as they
	// are written (Options.DrainErrors).
	DrainEnv = "KFELASTIC_DRAIN_ERRORS"
	// RoundEnv is the file the agent keeps the master's round in
	// (WriteRound): c10d's rendezvous completes once it has as many nodes.
	RoundEnv = "KFELASTIC_RDZV_ROUND_FILE"
	// ParentEnv is the pid of the process that starts the command (the
	// caller of Env): the hook runs only in the topmost Python below it,
	// never below a command's Python that ran without it (python -I, -E, -S).
	ParentEnv = "KFELASTIC_HOOK_PARENT"
)

// Install writes the hook into dir/torchhook (created if needed) and
// returns that folder, for Env.
func Install(dir string) (string, error) {
	dir = filepath.Join(dir, "torchhook")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(dir, "sitecustomize.py"), program, 0o644); err != nil {
		return "", err
	}
	return dir, nil
}

// Options are what the hook does; the zero value nothing.
type Options struct {
	// Preload are the modules the forkserver imports ("": no forkserver).
	Preload string
	// Poll is c10d's rendezvous poll interval in seconds ("": torch's 1 s).
	Poll string
	// DrainErrors has the command read its spawned workers' error queues
	// as they are written: torch reads one only after its worker exited,
	// and a worker whose traceback is past the pipe's 64 KiB never exits.
	DrainErrors bool
	// RoundFile is where the agent keeps the master's current round
	// (WriteRound; "": nowhere). c10d's rendezvous in the command then
	// completes as soon as it has that many nodes, instead of waiting
	// out its last call (last_call_timeout, 30 s) for nodes up to
	// max_nodes that the master already knows are not coming.
	RoundFile string
}

// WriteRound records the master's round number and its number of nodes in
// path (Options.RoundFile), replacing it whole (a rename), so that the hook
// never reads half of it.
func WriteRound(path string, round int64, nodes int) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(fmt.Sprintf("%d %d\n", nodes, round)), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// Env adds the hook in folder (from Install) to a command's environment:
// folder first on PYTHONPATH, and the variables of o. Nothing when o asks
// for nothing. The command must be a child of the calling process.
func Env(env map[string]string, folder string, o Options) {
	if folder == "" || (o.Preload == "" && o.Poll == "" && !o.DrainErrors && o.RoundFile == "") {
		return
	}
	path := folder
	if old := env["PYTHONPATH"]; old != "" {
		path += string(os.PathListSeparator) + old
	}
	env["PYTHONPATH"] = path
	if o.Preload != "" {
		env[PreloadEnv] = strings.TrimSpace(o.Preload)
	}
	if o.Poll != "" {
		env[PollEnv] = o.Poll
	}
	if o.DrainErrors {
		env[DrainEnv] = "1"
	}
	if o.RoundFile != "" {
		env[RoundEnv] = o.RoundFile
	}
	env[ParentEnv] = strconv.Itoa(os.Getpid())
}

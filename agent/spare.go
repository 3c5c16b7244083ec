package agent

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// Warm spares cut the restart time of Python workers to what is left after
// the interpreter has started and imported torch (≈ 0.8 s of a ≈ 1 s
// restart here): while a group trains, the agent starts the next attempt's
// interpreters, which import the preload modules and block on a pipe. A
// restart hands each spare its worker environment and it runs the script
// with runpy, as `torchrun --run_path` does, with sys.argv and sys.path[0]
// as `python SCRIPT ARGS` would set them. The price is a second set of idle
// interpreters' memory, so it is opt-in (--warm-spares).
//
// spareBoot is the spare's program. Its stdin-like pipe is fd 3: one JSON
// line with the environment, or EOF (discarded: exit 0). A spare that is not
// global rank 0 waits until the rank-0 store accepts connections before it
// runs the script: torch 1.13's store client retries a refused connection
// only after a whole second, which a released spare would always meet. With
// the store proxy (the default) the proxy accepts at once and this wait ends
// at its first try; it matters with --store-proxy=false.
const spareBoot = `import os, sys, json, importlib, importlib.util
fd = int(os.environ.pop("KFELASTIC_SPARE_FD"))
for m in os.environ.pop("KFELASTIC_SPARE_PRELOAD", "").split(","):
    if m:
        try:
            importlib.import_module(m)
        except Exception:
            pass
# torch 2.x imports torch._dynamo lazily at the first forward or optimizer
# step (forkserver.py says more): imported here too when torch is.
if "torch" in sys.modules and importlib.util.find_spec("torch._dynamo") is not None:
    try:
        importlib.import_module("torch._dynamo")
    except Exception:
        pass
with os.fdopen(fd) as f:
    line = f.readline()
if not line:
    sys.exit(0)
env = json.loads(line)
if env.get("RANK", "0") != "0" and env.get("MASTER_PORT"):
    import socket, time
    end = time.monotonic() + 10
    while time.monotonic() < end:
        try:
            socket.create_connection((env["MASTER_ADDR"], int(env["MASTER_PORT"])), timeout=1).close()
            break
        except OSError:
            time.sleep(0.005)
    del socket, time, end
os.environ.clear()
os.environ.update(env)
sys.argv = sys.argv[1:]
sys.path[0] = os.path.dirname(os.path.abspath(sys.argv[0]))
del os, sys, json, importlib, fd, m, f, line, env
import runpy
runpy.run_path(__import__("sys").argv[0], run_name="__main__")
`

// spareArgv returns the spare's command line for a worker command, and false
// if the command is not `python[3[.x]] SCRIPT ARGS` (no interpreter flags,
// no -m/-c), which are the only commands a spare can stand in for.
func spareArgv(command []string) ([]string, bool) {
	if len(command) < 2 || !strings.HasPrefix(filepath.Base(command[0]), "python") || strings.HasPrefix(command[1], "-") {
		return nil, false
	}
	return append([]string{command[0], "-c", spareBoot}, command[1:]...), true
}

// startSpare starts a spare for attempt's local rank. The env (the current
// round's, with the next attempt's files) is what the interpreter sees while
// it imports; release replaces it.
func startSpare(gs groupStart, attempt, local int, env []string, preload string) (*worker, error) {
	argv, ok := spareArgv(gs.command)
	if !ok {
		return nil, errors.New("not a python SCRIPT command")
	}
	r, wp, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	w := newWorker(gs, attempt, local)
	env = append(env, "KFELASTIC_SPARE_FD=3", "KFELASTIC_SPARE_PRELOAD="+preload)
	err = w.spawn(gs, argv, env, []*os.File{r})
	r.Close()
	if err != nil {
		wp.Close()
		return nil, err
	}
	w.releasePipe = wp
	return w, nil
}

// release hands a spare its worker environment; it then runs the script.
func (w *worker) release(env []string) error {
	if w.releasePipe == nil || w.exited.Load() {
		return errors.New("spare gone")
	}
	data, err := json.Marshal(envMap(env))
	if err != nil {
		return err
	}
	_, err = w.releasePipe.Write(append(data, '\n'))
	w.releasePipe.Close()
	w.releasePipe = nil
	if err == nil {
		w.lastOutput.Store(nowNano())
		w.startedAt.Store(nowNano())
		w.active.Store(true)
	}
	return err
}

// discard ends an unused spare: EOF on its pipe makes it exit; the group
// kill covers one stuck in an import.
func (w *worker) discard() {
	if w.releasePipe != nil {
		w.releasePipe.Close()
		w.releasePipe = nil
	}
	if w.pgid != 0 && !w.exited.Load() {
		_ = syscall.Kill(-w.pgid, syscall.SIGKILL)
	}
}

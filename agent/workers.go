package agent

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/kfelastic/kfelastic/agent/forkserver"
	"github.com/kfelastic/kfelastic/agent/guardian"
	"github.com/kfelastic/kfelastic/agent/storeproxy"
	kferrors "github.com/kfelastic/kfelastic/errors"
)

// group is one attempt's local workers, each the leader of its own process
// group so that a stop reaches whatever the worker spawned.
type group struct {
	attempt int
	dir     string
	workers []*worker
	// proxy is the store proxy of this group (group rank 0 only), stopped
	// when the group ends.
	proxy *storeproxy.Proxy
	// mark is what every process of the group carries (agent/guardian).
	mark string
	// command: the one worker is --launcher command's child, whose
	// children get the dump signal (command.go).
	command bool
	// forkMark and forkPid are the fork server's mark and pid when the
	// group's workers were forked: its forks carry its mark (agent/forkserver).
	forkMark string
	forkPid  int
	// swept: end has run.
	swept bool
}

// stopProxy stops the group's store proxy, if any; idempotent.
func (g *group) stopProxy() {
	if g.proxy != nil {
		g.proxy.Stop()
	}
}

// end is called once every worker of the group has exited: the store
// proxy stops (the store is gone with rank 0) and whatever the workers
// started that still lives, a daemon in a session of its own included, is
// killed, so that nothing of this attempt outlives it. Idempotent; called
// by the loop only.
func (g *group) end() {
	if g.swept {
		return
	}
	g.swept = true
	g.stopProxy()
	var marks []string
	for _, m := range []string{g.mark, g.forkMark} {
		if m != "" {
			marks = append(marks, m)
		}
	}
	if len(marks) > 0 {
		// The fork server carries its mark and lives on: it forks the
		// next group.
		guardian.Sweep(marks, false, nil, g.forkPid)
	}
}

// ended reports whether every worker of the group has exited.
func (g *group) ended() bool {
	for _, w := range g.workers {
		if !w.exited.Load() {
			return false
		}
	}
	return true
}

type worker struct {
	localRank    int
	attempt      int
	name         string
	dir          string
	cmd          *exec.Cmd
	pgid         int
	errorFile    string
	progressFile string
	lastOutput   atomic.Int64 // unix ns of the last output line
	// startedAt (unix ns) is when the process started as this worker: its
	// start, or a spare's release. An error file's time before it is not
	// this worker's.
	startedAt atomic.Int64
	exited    atomic.Bool
	// releasePipe is the write end of a warm spare's env pipe, nil otherwise.
	releasePipe *os.File
	// active: a worker, not a spare waiting for release; spoken: it has
	// printed a line since.
	active, spoken atomic.Bool
	// signaler, when set, takes the group's signals instead of the
	// worker's process group (pgid is 0): a launcher that runs no process,
	// the tests' in-process stand-in (Config.launcher).
	signaler func(syscall.Signal)
}

// tee is the agent's own stdout/stderr, shared by the workers' tee.
type tee struct {
	mu             sync.Mutex
	stdout, stderr io.Writer
}

// line writes one teed line, prefixed, in one write: w is a
// nonblocking.Output, which never blocks, and keeps a write whole.
func (o *tee) line(w io.Writer, prefix string, line []byte) {
	o.mu.Lock()
	defer o.mu.Unlock()
	_, _ = w.Write(append([]byte(prefix), line...))
}

// groupStart is what startGroup needs besides the StartGroup action.
type groupStart struct {
	command []string
	runDir  string
	pod     string
	workers int
	// env is a worker's whole environment, given the mark of its attempt:
	// WorkerEnv's, or CommandEnv's for --launcher command's child.
	env func(w *worker, mark string) []string
	// launcher starts the workers' processes: exec'd, forked from the fork
	// server or released from warm spares (launch.go).
	launcher launcher
	// commandMode: the one worker is --launcher command's child, whose
	// children (torch's workers) get the dump signal (command.go).
	commandMode bool
	out         *tee
	oomBaseline int64
	oomKnown    bool
	// oom dates the OOM kills that the count's rise above oomBaseline
	// shows (nil where the count cannot be read).
	oom *oomClock
	// send delivers an event to the loop; it returns false once the loop
	// is gone.
	send func(Event) bool
	// spoke, if set, is called once per worker on its first output line.
	spoke func(*worker)
	// agentID names the agent in its workers' marks; guard is its guardian
	// (nil without one), told of every worker's process group.
	agentID string
	guard   *guardian.Guardian
	// stop, closed by a stop signal, interrupts a start in progress.
	stop <-chan struct{}
	log  *slog.Logger
}

// startGroup starts the workers of sg with gs.launcher. A worker that fails
// to start is returned as a WorkerExited with StartError, for the loop to
// step (not sent: the loop is the caller, and hundreds of failures would
// fill its queue); the others run on, and the policy stops them. A stop
// signal (gs.stop) ends the start: the workers not started yet are returned
// as such too, so that the stop does not wait for a thousand workers to
// start first.
func startGroup(gs groupStart, sg StartGroup) (*group, []WorkerExited) {
	g := &group{attempt: sg.Attempt, dir: attemptDir(gs.runDir, sg.Attempt), command: gs.commandMode}
	if gs.agentID != "" {
		g.mark = guardian.AttemptMark(gs.agentID, sg.Attempt)
	}
	var failed []WorkerExited
	notStarted := func(w *worker, why string) {
		w.exited.Store(true)
		failed = append(failed, WorkerExited{Attempt: sg.Attempt, LocalRank: w.localRank,
			Exit: kferrors.WorkerExit{Worker: w.name, ExitCode: 127, ObservedAt: time.Now()}, StartError: why})
	}
	if why := unstartable(gs.command); why != "" {
		for local := range gs.workers {
			w := newWorker(gs, sg.Attempt, local)
			g.workers = append(g.workers, w)
			notStarted(w, why)
			failed[len(failed)-1].Permanent = true
		}
		return g, failed
	}
	for local := range gs.workers {
		w := newWorker(gs, sg.Attempt, local)
		select {
		case <-gs.stop:
			g.workers = append(g.workers, w)
			notStarted(w, "not started: the agent got a stop signal while it started the group")
			continue
		default:
		}
		run, err := gs.launcher.launch(gs, w, gs.env(w, g.mark))
		g.workers = append(g.workers, run)
		if err != nil {
			notStarted(run, err.Error())
		}
	}
	return g, failed
}

func attemptDir(runDir string, attempt int) string {
	return filepath.Join(runDir, fmt.Sprintf("attempt_%d", attempt))
}

func newWorker(gs groupStart, attempt, local int) *worker {
	dir := filepath.Join(attemptDir(gs.runDir, attempt), fmt.Sprint(local))
	return &worker{localRank: local, attempt: attempt, name: workerName(gs.pod, local), dir: dir,
		errorFile: filepath.Join(dir, "error.json"), progressFile: filepath.Join(dir, "progress")}
}

// spawn starts argv with env as this worker: its own process group, output
// teed line by line to its log files and the agent's output, and a goroutine
// that turns its end into a WorkerExited event. extra become fds 3, 4, ….
func (w *worker) spawn(gs groupStart, argv, env []string, extra []*os.File) error {
	stdout, stderr, readers, err := w.outputs(gs)
	if err != nil {
		return err
	}
	w.cmd = exec.Command(argv[0], argv[1:]...)
	w.cmd.Env = env
	w.cmd.ExtraFiles = extra
	// Own process group: a stop signal reaches the worker's children too.
	// Pdeathsig: the worker dies with the agent even if the agent is SIGKILLed.
	w.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	w.cmd.Stdout, w.cmd.Stderr = stdout, stderr
	err = w.cmd.Start()
	// The parent's write ends close once the child has them (or start
	// failed, which ends the readers).
	stdout.Close()
	stderr.Close()
	if err != nil {
		return err
	}
	w.started(gs, w.cmd.Process.Pid, len(extra) == 0) // only a spare gets extra files (its env pipe)
	go w.wait(gs, readers, func() (syscall.Signal, int) {
		_ = w.cmd.Wait()
		if ws, ok := w.cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return ws.Signal(), 0
		}
		return 0, w.cmd.ProcessState.ExitCode()
	})
	return nil
}

// fork starts the worker from the fork server (agent/forkserver), with env
// as its whole environment, its output teed as spawn's.
func (w *worker) fork(gs groupStart, server *forkserver.Server, env []string) error {
	stdout, stderr, readers, err := w.outputs(gs)
	if err != nil {
		return err
	}
	pid, exit, err := server.Fork(gs.command[1:], envMap(env), stdout, stderr)
	stdout.Close()
	stderr.Close()
	if err != nil {
		return err
	}
	w.started(gs, pid, true)
	go w.wait(gs, readers, func() (syscall.Signal, int) {
		e := <-exit
		switch {
		case e.Lost: // it died with the server (PR_SET_PDEATHSIG)
			return syscall.SIGKILL, 0
		case e.Status.Signaled():
			return e.Status.Signal(), 0
		}
		return 0, e.Status.ExitStatus()
	})
	return nil
}

// outputs makes the worker's folder and log files, and the pipes of its
// stdout and stderr, which goroutines tee line by line. The caller hands
// the write ends to the worker's process and closes its own copies; the
// readers end when every copy is closed.
func (w *worker) outputs(gs groupStart) (stdout, stderr *os.File, readers *sync.WaitGroup, err error) {
	if err := os.MkdirAll(w.dir, 0o755); err != nil {
		return nil, nil, nil, err
	}
	prefix := fmt.Sprintf("[%s%d]:", RoleName, w.localRank)
	readers = &sync.WaitGroup{}
	var ends []*os.File
	for _, s := range []struct {
		name string
		dst  io.Writer
	}{{"stdout.log", gs.out.stdout}, {"stderr.log", gs.out.stderr}} {
		logFile, err := os.Create(filepath.Join(w.dir, s.name))
		if err != nil {
			for _, f := range ends {
				f.Close()
			}
			return nil, nil, nil, err
		}
		// An *os.File pipe (not an io.Writer) so that the worker's end is
		// seen when it exits, even if a grandchild still holds the pipe open.
		r, pw, err := os.Pipe()
		if err != nil {
			logFile.Close()
			for _, f := range ends {
				f.Close()
			}
			return nil, nil, nil, err
		}
		ends = append(ends, pw)
		readers.Add(1)
		go func() {
			defer readers.Done()
			defer r.Close()
			defer logFile.Close()
			w.copyLines(r, logFile, gs.out, s.dst, prefix, gs.spoke)
		}()
	}
	return ends[0], ends[1], readers, nil
}

// started records that the worker's process (pid, the leader of its own
// process group) runs; active: as a worker, not a spare.
func (w *worker) started(gs groupStart, pid int, active bool) {
	w.pgid = pid
	// The worker's pid, for tools outside the agent (kfelastic local's
	// kill-worker): a forked worker's /proc environ is its fork server's,
	// so its LOCAL_RANK cannot be read from there.
	if os.MkdirAll(w.dir, 0o755) == nil {
		_ = os.WriteFile(filepath.Join(w.dir, "pid"), []byte(strconv.Itoa(pid)+"\n"), 0o644)
	}
	gs.guard.Register(w.pgid, true)
	w.lastOutput.Store(time.Now().UnixNano())
	w.startedAt.Store(time.Now().UnixNano())
	w.active.Store(active)
}

// copyLines tees a worker's output, line by line, to its log file and, with
// torchrun's "[default<local rank>]:" prefix, to the agent's own output.
func (w *worker) copyLines(r io.Reader, logFile io.Writer, out *tee, dst io.Writer, prefix string, spoke func(*worker)) {
	br := bufio.NewReaderSize(r, 64<<10)
	for {
		line, err := br.ReadSlice('\n')
		if len(line) > 0 {
			w.lastOutput.Store(time.Now().UnixNano())
			if spoke != nil && w.active.Load() && w.spoken.CompareAndSwap(false, true) {
				spoke(w)
			}
			_, _ = logFile.Write(line)
			if dst != nil {
				if line[len(line)-1] != '\n' && err != bufio.ErrBufferFull {
					line = append(line, '\n')
				}
				out.line(dst, prefix, line)
			}
		}
		if err != nil && !errors.Is(err, bufio.ErrBufferFull) {
			return
		}
	}
}

// wait turns the worker's end into a WorkerExited event, with what the
// classifier needs: exit code or signal, the torch error file, flytekit's
// recoverable marker and OOM evidence.
func (w *worker) wait(gs groupStart, readers *sync.WaitGroup, status func() (syscall.Signal, int)) {
	sig, code := status()
	at := time.Now()
	w.exited.Store(true)
	// The group's leader is gone: whatever it left in its group is an orphan.
	_ = syscall.Kill(-w.pgid, syscall.SIGKILL)
	gs.guard.Register(w.pgid, false)
	// Let the last lines (a traceback) reach the log before the event, but
	// never wait long: a grandchild may hold the pipe.
	done := make(chan struct{})
	go func() { readers.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(100 * time.Millisecond):
	}
	e := kferrors.WorkerExit{Worker: w.name, ObservedAt: at, StartedAt: time.Unix(0, w.startedAt.Load()), Signal: sig, ExitCode: code}
	if e.Signal != 0 || e.ExitCode != 0 {
		te, recoverable, err := kferrors.ReadTorchError(w.errorFile)
		if err == nil {
			e.TorchError = te
		} else {
			e.ErrorFileProblem = err.Error()
		}
		e.RecoverableMarker = recoverable
		// A worker of the command's that the OOM killer ended fails the
		// command, whatever status torch's agent then exits with.
		if (e.Signal == syscall.SIGKILL || gs.commandMode) && gs.oomKnown {
			if n, ok := oomKills(); ok && n > gs.oomBaseline {
				e.OOM = true
				e.OOMSeenAt, _ = gs.oom.firstAbove(gs.oomBaseline)
			}
		}
	}
	gs.send(WorkerExited{Attempt: w.attempt, LocalRank: w.localRank, Exit: e, from: w})
}

// signal sends sig to every live worker: SIGTERM and SIGKILL to the whole
// process group, other signals (the dump signal) to the worker alone so that
// its helpers (data loader processes) are not killed by a default action;
// under --launcher command to the child's children, its workers.
func (g *group) signal(sig syscall.Signal) {
	for _, w := range g.workers {
		if w.exited.Load() {
			continue
		}
		if w.signaler != nil {
			w.signaler(sig)
			continue
		}
		if w.pgid == 0 {
			continue
		}
		switch {
		case sig == syscall.SIGTERM || sig == syscall.SIGKILL:
			_ = syscall.Kill(-w.pgid, sig)
		case g.command:
			signalWorkers(w.pgid, sig) // the child leads its group
		default:
			_ = syscall.Kill(w.pgid, sig) // the group's leader
		}
	}
}

// progress is the latest sign of life of a worker: its last output line or
// the modification time of its progress file. A file dated in the future
// (touch -d 2100) is no sign of life: taken as one it would switch the
// watchdog off for good.
func (w *worker) progress() time.Time {
	t := time.Unix(0, w.lastOutput.Load())
	if fi, err := os.Stat(w.progressFile); err == nil && fi.ModTime().After(t) && !fi.ModTime().After(time.Now()) {
		t = fi.ModTime()
	}
	return t
}

func nowNano() int64 { return time.Now().UnixNano() }

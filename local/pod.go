package local

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	kferrors "github.com/kfelastic/kfelastic/errors"
	"github.com/kfelastic/kfelastic/internal/shmsem"
)

// The pods' processes: the engine's I/O around the Job's bookkeeping. Each
// pod is one `kfelastic agent` process in its own process group (and
// cgroup); its output goes to pods/<pod>.log, and the engine reads two
// things from it: the training's step lines, and the restart count of
// torchrun's rendezvous block. Everything else about rounds comes from the
// master (master.Options.OnRound).

// podProc is one pod's agent process.
type podProc struct {
	pod     Pod
	cmd     *exec.Cmd
	cg      *Cgroup
	started time.Time
	done    chan struct{}
	// sems are the named semaphores the pod's processes had mapped when
	// the engine killed them (killPod), unlinked when the pod has exited.
	semMu sync.Mutex
	sems  []string
}

// killing kills pids with SIGKILL, first noting the named semaphores they
// have mapped (shmsem.Mapped), for exited to unlink.
func (p *podProc) killing(pids []int) {
	found := shmsem.Mapped(pids)
	p.semMu.Lock()
	p.sems = append(p.sems, found...)
	p.semMu.Unlock()
	killAll(pids, syscall.SIGKILL)
}

// start runs a pod's agent (with e.mu held) and returns its pid.
func (e *Engine) start(p Pod) (int, error) {
	o := &e.opts
	cgroup := p.Name
	if p.Incarnation > 0 {
		cgroup = fmt.Sprintf("%s.%d", p.Name, p.Incarnation)
	}
	cg, err := e.limits.Pod(cgroup, p.Memory)
	if err != nil {
		return 0, fmt.Errorf("its cgroup: %w", err)
	}
	logDir := filepath.Join(o.Out, "pods", p.Name)
	var args, podEnv, prefix []string
	if e.tf != nil {
		if args, podEnv, err = e.tf.podArgs(o, p, e.errURL, logDir); err != nil {
			return 0, err
		}
	} else {
		args = []string{"agent", "--nnodes", fmt.Sprintf("%d:%d", o.MinNodes, o.MaxNodes), "--nproc-per-node", strconv.Itoa(o.NProcPerNode),
			"--max-restarts", strconv.Itoa(o.MaxRestarts), "--rdzv-backend", "kfelastic", "--rdzv-endpoint", e.addr, "--rdzv-id", o.Job,
			"--token-file", e.tokenPath, "--node-rank", strconv.Itoa(p.Rank), "--error-prefix", e.errURL, "--log-dir", logDir,
			"--launcher", o.Launcher, "--stop-grace", o.Grace.String()}
		if e.net != nil {
			var addr string
			if prefix, addr, err = e.net.pod(p.Index); err != nil {
				return 0, fmt.Errorf("its network namespace: %w", err)
			}
			// The pod's own address for its store, and gloo's interface.
			args = append(args, "--master-addr", addr)
		}
		args = append(args, o.AgentArgs...)
		args = append(args, "--")
		args = append(args, o.Command...)
	}
	// A shell joins the pod's cgroups (or sets its address-space limit)
	// and execs the agent, so that no process of the pod ever runs outside.
	script := `for f in $KFELASTIC_LOCAL_CGROUPS; do echo $$ > "$f" || exit 111; done
[ -z "$KFELASTIC_LOCAL_RLIMIT_KB" ] || ulimit -v "$KFELASTIC_LOCAL_RLIMIT_KB" || exit 111
exec "$@"`
	argv := append([]string{"-c", script, "sh"}, prefix...)
	cmd := exec.Command("/bin/sh", append(append(argv, o.Binary), args...)...)
	// A pod dies with the engine, even a SIGKILLed one (Ctrl-C stops
	// them in order): the signal goes when the thread that started it
	// ends, which for Go's unlocked threads is the process's end; exec
	// (the shell's, the agent's) keeps it. The agent does the same for its
	// workers.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Env = append(append(os.Environ(), o.Env...), podEnv...)
	cmd.Env = append(cmd.Env, "POD_NAME="+p.Name, "HOSTNAME="+p.Name,
		// What the plugin injects into every replica (kfoperator's
		// addErrorPropagationEnv): flytekit in the pod writes its own
		// error-<uuid>.pb naming the pod.
		"_F_WN="+p.Name, "_F_DES=Earliest",
		// Each pod is its own machine: a relaunch "elsewhere" is another name.
		"KFELASTIC_NODE_NAME="+fmt.Sprintf("%s-node-%d", o.Job, p.Index),
		"KFELASTIC_LOCAL_JOB="+e.jobMark, "KFELASTIC_LOCAL_CGROUPS="+strings.Join(cg.ProcsFiles(), " "))
	if e.net != nil {
		cmd.Env = append(cmd.Env, "GLOO_SOCKET_IFNAME=eth0")
	}
	if e.limits.Mode == "rlimit" && p.Memory > 0 {
		cmd.Env = append(cmd.Env, "KFELASTIC_LOCAL_RLIMIT_KB="+strconv.FormatInt(p.Memory>>10, 10))
	}
	logFile, err := os.OpenFile(filepath.Join(o.Out, "pods", p.Name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return 0, err
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		logFile.Close()
		return 0, err
	}
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		pr.Close()
		pw.Close()
		logFile.Close()
		return 0, err
	}
	pw.Close()
	pp := &podProc{pod: p, cmd: cmd, cg: cg, started: time.Now(), done: make(chan struct{})}
	e.procs[p.Name] = pp
	output := make(chan struct{})
	go func() {
		defer close(output)
		e.follow(pp, pr, logFile)
	}()
	go func() {
		<-output // the agent's last words are in before its exit is handled
		err := cmd.Wait()
		e.exited(pp, err)
	}()
	if e.limits.Mode == "cgroup v1" && p.Memory > 0 {
		go e.watchOOM(pp)
	}
	return cmd.Process.Pid, nil
}

var (
	// stepRE is a training step the user's script printed ("step = 12").
	stepRE = regexp.MustCompile(`\bstep(?:\s*=\s*|\s+)(\d+)`)
	// restartCountRE is the restart count in the rendezvous block the
	// agent prints as torchrun does (docs/DESIGN.md §4.2): torchrun's
	// format, kept by the agent for the tools that read it.
	restartCountRE = regexp.MustCompile(`^\s*restart_count=(\d+)$`)
)

// follow copies a pod's output to its log and reads what the view and the
// chaos triggers need: the training's steps, and the agent's restart count.
func (e *Engine) follow(p *podProc, r io.ReadCloser, logFile *os.File) {
	defer r.Close()
	defer logFile.Close()
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		_, _ = logFile.WriteString(line + "\n")
		if m := restartCountRE.FindStringSubmatch(line); m != nil {
			n, _ := strconv.ParseInt(m[1], 10, 64)
			e.update(func(j *Job) { j.Restarts(p.pod.Name, n) })
			continue
		}
		if strings.Contains(line, "Rendezvous complete") || strings.Contains(line, "level=") {
			continue // the agent's own output, not a worker's step
		}
		if m := stepRE.FindStringSubmatch(line); m != nil {
			if n, err := strconv.ParseInt(m[1], 10, 64); err == nil {
				e.update(func(j *Job) { j.Step(p.pod.Name, n, time.Now()) })
			}
		}
	}
}

// exited handles an agent's end: the Job's book, the pod's document, its
// owner (the master: a pod that died without its agent saying so; a TF
// job's owner), and a relaunch waiting for it.
func (e *Engine) exited(p *podProc, werr error) {
	now := time.Now()
	close(p.done)
	ws, _ := p.cmd.ProcessState.Sys().(syscall.WaitStatus)
	// Whatever the agent left behind (its guardian kills its workers; a
	// SIGKILLed pod may leave a helper): the pod is gone as a whole. A
	// Python resource tracker left behind unlinks its process's semaphores
	// once the processes it serves are gone: it gets a moment to finish
	// after them, off this path (below), and is killed then if still there.
	trackers, others := splitTrackers(podPids(p))
	p.killing(others)
	end := PodEnd{Succeeded: werr == nil, OOMKilled: p.cg.OOMKills() > 0}
	if ws.Signaled() {
		end.Signal = ws.Signal()
	} else {
		end.ExitStatus = ws.ExitStatus()
	}
	var ending Ending
	e.update(func(j *Job) { ending = j.Exited(p.pod.Name, end, now) })
	if f := ending.Document; f != nil {
		e.document(*f)
		if e.tf == nil {
			e.podGone(p.pod.Name, *f)
		}
	}
	var tfFailure *kferrors.Failure
	if e.tf != nil && !ending.CleanedUp {
		tfFailure = e.tfFailure(p, ending, now)
	}
	go func() {
		awaitTrackers(trackers, 2*time.Second)
		p.killing(trackers)
		p.semMu.Lock()
		shmsem.Unlink(p.sems)
		p.semMu.Unlock()
		for range 50 {
			if os.Remove(p.cg.mem) == nil || p.cg.mem == "" {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		p.cg.Remove()
	}()
	e.update(func(j *Job) {
		j.Reported(p.pod.Name)
		if e.tf == nil || ending.CleanedUp {
			return
		}
		e.tf.tell(j, p.pod, tfFailure, now)
	})
	e.signal()
}

// supersede moves the documents of a pod that was replaced, dated before
// its replacement joined a round, out of the reader's way, as its agent
// does for the failures it restarted from (kferrors.Supersede): the
// replacement's round is their recovery. On Kubernetes the training
// operator recreates a pod under its own name and the new agent does this;
// here the replacement has the next index, so its owner does it.
func (e *Engine) supersede(old, by string, before time.Time) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := kferrors.OpenPrefix(ctx, e.errURL, true)
	if err != nil {
		e.log.Warn("cannot open the documents", "err", err)
		return
	}
	defer b.Close()
	// The old pod's agent may still be uploading: wait for its exit.
	e.mu.Lock()
	p := e.procs[old]
	e.mu.Unlock()
	if p != nil && old != by { // (a TF pod recreated under its name: the old one is gone)
		<-p.done
	}
	moved, err := kferrors.Supersede(ctx, b, old, before)
	if err != nil {
		e.log.Warn("cannot supersede a replaced pod's documents", "pod", old, "err", err)
	}
	if len(moved) > 0 {
		e.note("recovered", "%s's failure is recovered (%s trains in its place): its documents moved to %s", old, by, kferrors.SupersededPrefix)
	}
}

// document writes the document of a pod that died without writing one (its
// agent was killed with it): what the plugin synthesizes from the pod's
// status on Kubernetes (OOMKilled, a lost node), written here so that the
// report draws it and a recovery supersedes it like any other. A document
// that cannot be written is kept for the root cause all the same.
func (e *Engine) document(f kferrors.Failure) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := kferrors.OpenPrefix(ctx, e.errURL, true)
	if err == nil {
		_, err = kferrors.NewWriter(b, nil).Write(ctx, f)
		b.Close()
	}
	if err != nil {
		e.log.Warn("cannot write a dead pod's document", "pod", f.Worker, "err", err)
		e.update(func(j *Job) { j.Unwritten(f) })
	}
}

// podGone tells the master, retried while it restarts.
func (e *Engine) podGone(pod string, f kferrors.Failure) {
	for range 100 {
		s := e.masterServer()
		if s != nil {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			err := s.PodGone(ctx, pod, f)
			cancel()
			if err == nil {
				return
			}
		}
		e.mu.Lock()
		fin := e.job.Finished()
		e.mu.Unlock()
		if fin {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// killPod kills every process of the pod at once (a machine that dies);
// cause is the failure the engine reports for it ("" keeps what it had).
func (e *Engine) killPod(p *podProc, cause string) {
	e.update(func(j *Job) { j.Caused(p.pod.Name, cause) })
	pid := p.cmd.Process.Pid
	for range 3 { // SIGKILL stops nothing from forking in between: twice more
		p.killing(podPids(p))
		_ = syscall.Kill(-pid, syscall.SIGKILL)
	}
}

// deletePod is Kubernetes' pod deletion: SIGTERM to the pod's main
// process, then SIGKILL to everything after the grace.
func (e *Engine) deletePod(p *podProc, sig syscall.Signal, cause string) {
	e.update(func(j *Job) { j.Caused(p.pod.Name, cause) })
	_ = p.cmd.Process.Signal(sig)
	select {
	case <-p.done:
	case <-time.After(e.opts.Grace + time.Second):
		e.killPod(p, "")
	}
}

// reap kills a pod that has not ended by itself within the grace: one the
// master gave up on (lost to the network, frozen), or one still running
// when the job is over.
func (e *Engine) reap(p *podProc, r Reap) {
	select {
	case <-p.done:
	case <-time.After(e.opts.Grace):
		e.note("pod", "%s", r.Note)
		e.killPod(p, r.Cause)
	}
}

// stopAll stops every running pod with sig, grace, SIGKILL, and waits.
func (e *Engine) stopAll(sig syscall.Signal) {
	e.mu.Lock()
	var ps []*podProc
	for _, p := range e.procs {
		if !isDone(p) {
			ps = append(ps, p)
		}
	}
	e.mu.Unlock()
	var wg sync.WaitGroup
	for _, p := range ps {
		wg.Go(func() {
			e.deletePod(p, sig, "")
			<-p.done
		})
	}
	wg.Wait()
}

// watchOOM is memory.oom.group for cgroup v1: when the kernel OOM-kills a
// process of the pod, the whole pod dies, as a Kubernetes container.
func (e *Engine) watchOOM(p *podProc) {
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-p.done:
			return
		case <-t.C:
			if p.cg.OOMKills() > 0 {
				e.note("pod", "%s: the kernel OOM-killed a process (limit %s): the pod is OOMKilled", p.pod.Name, bytesText(p.pod.Memory))
				e.killPod(p, kferrors.CodeOOMKilled)
				return
			}
		}
	}
}

func isDone(p *podProc) bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

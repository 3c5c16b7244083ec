package local

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	kferrors "github.com/kfelastic/kfelastic/errors"
)

// apply carries out a pod's chaos for real.
func (e *Engine) apply(c Chaos, p *podProc) {
	name := p.pod.Name
	switch c.Action {
	case DeletePod:
		e.note("chaos", "delete-pod: SIGTERM to %s (grace %s, then SIGKILL)", name, e.opts.Grace)
		e.deletePod(p, syscall.SIGTERM, kferrors.CodePreempted)
	case KillWorker:
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			if pid := e.worker(p, c.Worker); pid > 0 {
				_ = syscall.Kill(pid, syscall.SIGKILL)
				e.note("chaos", "kill-worker: kill -9 of %s's local rank %d (pid %d)", name, c.Worker, pid)
				return
			}
			if isDone(p) {
				break
			}
		}
		e.note("chaos", "kill-worker: %s has no worker of local rank %d running", name, c.Worker)
	case Straggler:
		if p.cg.Throttle(stragglerShare) {
			e.note("chaos", "straggler: %s throttled to %.0f%% of one CPU (%s cpu quota)", name, stragglerShare*100, e.limits.Mode)
			return
		}
		e.note("chaos", "straggler: %s is paused 80%% of the time (SIGSTOP/SIGCONT: no cpu cgroup here)", name)
		go e.pauseInBursts(p)
	case BreakCheck:
		e.note("chaos", "break-check: %s's health-check processes are killed, every round", name)
		go e.breakChecks(p)
	case CutNetwork:
		if e.net != nil {
			if err := e.net.cut(p.pod.Index); err != nil {
				e.note("chaos", "cut-network: %v", err)
				return
			}
			e.note("chaos", "cut-network: %s's link is down (its network namespace is cut off the bridge)", name)
			return
		}
		// Without a network namespace per pod the pod is frozen: the
		// master and the peers see what they would see of a lost network
		// (no heartbeat, no answer on its sockets), the pod sees nothing.
		e.note("chaos", "cut-network: %s is frozen (SIGSTOP to all its processes), which the master and its peers see as a lost network", name)
		go e.freeze(p)
	case OOM:
		e.oom(p)
	case FailPod:
		e.note("chaos", "fail-pod: %s's machine fails (SIGKILL to every process); its relaunches fail too", name)
		e.killPod(p, kferrors.CodeNodeLost)
	}
}

// podPids is every process of the pod.
func podPids(p *podProc) []int {
	return append(descendants(p.cmd.Process.Pid), p.cg.Procs()...)
}

// worker finds the training process of a local rank: the agent starts
// its workers with torchrun's environment (LOCAL_RANK) and its own mark
// (KFELASTIC_AGENT); the node check's processes carry KFELASTIC_NODE_CHECK.
func (e *Engine) worker(p *podProc, localRank int) int {
	want := strconv.Itoa(localRank)
	alive := map[int]bool{}
	for _, pid := range descendants(p.cmd.Process.Pid) {
		alive[pid] = true
		env := environ(pid)
		if env["LOCAL_RANK"] == want && env["KFELASTIC_AGENT"] != "" && env["KFELASTIC_NODE_CHECK"] == "" {
			return pid
		}
	}
	// A worker forked by the agent's fork server shows the server's
	// environment in /proc; the agent writes each worker's pid in its
	// attempt's folder (<log-dir>/<run>/attempt_<n>/<local rank>/pid).
	files, _ := filepath.Glob(filepath.Join(e.opts.Out, "pods", p.pod.Name, "*", "attempt_*", want, "pid"))
	best, bestAttempt := 0, -1
	for _, f := range files {
		n, err := strconv.Atoi(strings.TrimPrefix(filepath.Base(filepath.Dir(filepath.Dir(f))), "attempt_"))
		b, rerr := os.ReadFile(f)
		pid, perr := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || rerr != nil || perr != nil || !alive[pid] || n <= bestAttempt {
			continue
		}
		best, bestAttempt = pid, n
	}
	return best
}

// breakChecks kills the pod's health-check processes as they appear.
func (e *Engine) breakChecks(p *podProc) {
	killed := map[int]bool{}
	for !isDone(p) {
		for _, pid := range descendants(p.cmd.Process.Pid) {
			if killed[pid] {
				continue
			}
			if environ(pid)["KFELASTIC_NODE_CHECK"] == "1" {
				killed[pid] = true
				_ = syscall.Kill(pid, syscall.SIGKILL)
				e.note("chaos", "break-check: killed %s's check process (pid %d)", p.pod.Name, pid)
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// pauseInBursts slows a pod without a cpu cgroup: stopped 80 ms of 100.
func (e *Engine) pauseInBursts(p *podProc) {
	for !isDone(p) {
		pids := podPids(p)
		killAll(pids, syscall.SIGSTOP)
		time.Sleep(80 * time.Millisecond)
		killAll(pids, syscall.SIGCONT)
		time.Sleep(20 * time.Millisecond)
	}
}

// freeze stops every process of the pod until it is killed.
func (e *Engine) freeze(p *podProc) {
	for !isDone(p) {
		killAll(podPids(p), syscall.SIGSTOP)
		time.Sleep(100 * time.Millisecond)
	}
}

// oom starts a process in the pod's memory cgroup that allocates without
// bound (tail of /dev/zero keeps its one endless line in memory) until the
// kernel OOM-kills it, and the pod with it.
func (e *Engine) oom(p *podProc) {
	files := p.cg.ProcsFiles()
	if len(files) == 0 {
		e.note("chaos", "oom: %s has no memory cgroup here (%s): the allocation fails in its own process, no OOM kill", p.pod.Name, e.limits.Mode)
	} else {
		e.note("chaos", "oom: a process in %s's cgroup allocates past its limit of %s", p.pod.Name, bytesText(p.pod.Memory))
	}
	cmd := exec.Command("/bin/sh", "-c", `for f in $KFELASTIC_LOCAL_CGROUPS; do echo $$ > "$f" || exit 111; done
[ -z "$KFELASTIC_LOCAL_RLIMIT_KB" ] || ulimit -v "$KFELASTIC_LOCAL_RLIMIT_KB"
exec tail /dev/zero`)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Env = append(os.Environ(), "KFELASTIC_LOCAL_JOB="+e.jobMark, "KFELASTIC_LOCAL_CGROUPS="+strings.Join(files, " "))
	if len(files) == 0 && p.pod.Memory > 0 {
		cmd.Env = append(cmd.Env, "KFELASTIC_LOCAL_RLIMIT_KB="+strconv.FormatInt(p.pod.Memory>>10, 10))
	}
	if err := cmd.Start(); err != nil {
		e.note("chaos", "oom: cannot start the allocation: %v", err)
		return
	}
	go func() {
		select {
		case <-p.done:
			_ = cmd.Process.Kill()
		case <-time.After(time.Minute):
			_ = cmd.Process.Kill()
		}
	}()
	go func() { _ = cmd.Wait() }()
}

// failOnJoin fails a fail-pod rank's replacement once the master knows it
// (so that the master counts the relaunch).
func (e *Engine) failOnJoin(p *podProc) {
	for !isDone(p) {
		if s := e.masterServer(); s != nil {
			if st, err := s.Status(e.mctx); err == nil {
				for _, n := range st.GetNodes() {
					if n.GetPod() == p.pod.Name {
						e.note("chaos", "fail-pod: %s, rank %d's replacement, fails too", p.pod.Name, p.pod.Rank)
						e.killPod(p, kferrors.CodeNodeLost)
						return
					}
				}
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// stragglerShare is the CPU a straggler gets: 10% of one CPU makes the node
// check's compute (tens of milliseconds) clearly slower than twice the
// others' even on a loaded machine, where 20% was lost in the noise of
// the check's fixed costs (5% made its check outlast a 60 s check timeout).
const stragglerShare = 0.1

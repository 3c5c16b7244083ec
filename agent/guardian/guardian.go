// Package guardian sees that no process of a pod outlives its agent: the
// mark every worker's process carries, the sweep that kills what carries
// it, and the guardian, a process that sweeps for an agent that was
// SIGKILLed (MaybeRun, Start).
package guardian

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// No process of a pod outlives its agent. Three layers see to it:
//
//  1. Each worker leads its own process group, and dies with the agent
//     (Pdeathsig SIGKILL, even when the agent is SIGKILLed). When a worker
//     ends, its group is killed; a stop signals whole groups.
//  2. Every worker carries KFELASTIC_AGENT=<agent id>/<attempt> in its
//     environment, which its children inherit, including those that leave
//     its process group or session (a setsid daemon, `sh -c 'python …;
//     echo'`). When a group has ended, and when the agent exits, every
//     process still carrying its mark is killed (Sweep): nothing of an
//     attempt survives into the next.
//  3. A SIGKILLed agent cannot sweep. A guardian does it for it: a small
//     process the agent starts first (this binary, re-executed; see
//     MaybeRun), in a session of its own so that a terminal's signals
//     spare it. It holds the read end of a pipe that only the agent can
//     write; when the agent dies, however it dies, the kernel closes the
//     pipe, and the guardian kills every process group the agent
//     registered and every process with the agent's mark, then exits.
//
// A subreaper (PR_SET_CHILD_SUBREAPER) would keep orphans under the agent
// but not help once the agent is dead, and would make the agent reap
// processes it did not start, beside os/exec's own waits; a cgroup would
// need a writable cgroupfs, which pods do not have. A process that both
// leaves the process group and clears its environment escapes layer 2 and
// 3; a worker's own helpers do neither.

// MarkEnv marks every process of a pod's workers (layer 2).
const MarkEnv = "KFELASTIC_AGENT"

// NewAgentID names one agent run: unique on the node, and in its marks.
func NewAgentID() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%d-%s", os.Getpid(), hex.EncodeToString(b[:]))
}

// AttemptMark is the mark of one attempt's workers.
func AttemptMark(agentID string, attempt int) string {
	return agentID + "/" + strconv.Itoa(attempt)
}

// Sweep kills, with SIGKILL, the process groups pgids and every live
// process whose mark (MarkEnv) is one of marks, or starts with one when
// prefix, but the processes keep. It goes again, 10 ms later, while it finds
// marked processes (one may fork while it dies), twice at least, for at most
// a second. It returns how many marked processes it killed.
func Sweep(marks []string, prefix bool, pgids []int, keep ...int) int {
	match := func(v string) bool {
		return slices.ContainsFunc(marks, func(m string) bool { return v == m || (prefix && strings.HasPrefix(v, m)) })
	}
	self := os.Getpid()
	killed := 0
	for round, end := 0, time.Now().Add(time.Second); ; round++ {
		// A group's kill succeeds while zombies are left in it: it does
		// not count as found.
		for _, pg := range pgids {
			_ = syscall.Kill(-pg, syscall.SIGKILL)
		}
		found := 0
		for _, pid := range marked(match) {
			if pid != self && !slices.Contains(keep, pid) && syscall.Kill(pid, syscall.SIGKILL) == nil {
				found++
			}
		}
		killed += found
		if (found == 0 && round > 0) || time.Now().After(end) {
			return killed
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// marked lists the live processes whose MarkEnv matches. Processes
// this one may not read (another user's) and zombies (no environment left)
// are not listed.
func marked(match func(string) bool) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	key := []byte(MarkEnv + "=")
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		env, err := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if err != nil {
			continue
		}
		for kv := range bytes.SplitSeq(env, []byte{0}) {
			if v, ok := bytes.CutPrefix(kv, key); ok && match(string(v)) {
				pids = append(pids, pid)
				break
			}
		}
	}
	return pids
}

// Guardian plumbing. guardEnv carries the agent id to the re-executed
// binary; guardLogEnv a file the guardian notes what it killed in.
const (
	guardEnv    = "KFELASTIC_GUARDIAN"
	guardLogEnv = "KFELASTIC_GUARDIAN_LOG"
)

// guardable is set by MaybeRun: the binary runs a guardian when asked.
var guardable atomic.Bool

// MaybeRun runs the guardian (layer 3 above) and exits, when this process
// is one Start started; otherwise it returns at once, and lets Start start
// guardians by re-executing this binary. Call it first in main (and in
// TestMain) of a binary that calls the agent's Run; without it the agent
// runs without a guardian, and says so in its log.
func MaybeRun() {
	id, ok := os.LookupEnv(guardEnv)
	if !ok {
		guardable.Store(true)
		return
	}
	os.Exit(runGuardian(id, os.NewFile(3, "agent"), os.Getenv(guardLogEnv)))
}

// runGuardian reads the agent's registrations ("+pgid", "-pgid") until the
// pipe closes, then sweeps what is left of the agent's processes.
func runGuardian(agentID string, agent *os.File, logPath string) int {
	pgids := map[int]bool{}
	sc := bufio.NewScanner(agent)
	for sc.Scan() {
		line := sc.Text()
		if len(line) < 2 {
			continue
		}
		if pg, err := strconv.Atoi(line[1:]); err == nil && pg > 1 {
			pgids[pg] = line[0] == '+'
		}
	}
	var live []int
	for pg, ok := range pgids {
		if ok {
			live = append(live, pg)
		}
	}
	if n := Sweep([]string{agentID + "/"}, true, live); n > 0 && logPath != "" {
		msg := fmt.Sprintf("%s guardian: agent %s is gone; killed %d of its processes, and its process groups %v\n",
			time.Now().UTC().Format(time.RFC3339Nano), agentID, n, live)
		if f, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644); err == nil {
			_, _ = f.WriteString(msg)
			f.Close()
		}
	}
	return 0
}

// Guardian is the agent's side of its guardian: the pipe's write end,
// written by one goroutine so that registering never blocks the agent.
type Guardian struct {
	cmd     *exec.Cmd
	pipe    *os.File
	queue   chan string
	done    chan struct{}
	mu      sync.Mutex
	stopped bool
}

// Start starts the agent's guardian, or returns nil and why not.
func Start(agentID, logPath string) (*Guardian, error) {
	if !guardable.Load() {
		return nil, fmt.Errorf("this binary does not run guardians (guardian.MaybeRun is not called in its main)")
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer r.Close()
	// /proc/self/exe is this binary even if its file was replaced since.
	cmd := exec.Command("/proc/self/exe")
	cmd.Args = []string{"kfelastic-guardian"}
	cmd.Env = []string{guardEnv + "=" + agentID, guardLogEnv + "=" + logPath}
	cmd.ExtraFiles = []*os.File{r}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		w.Close()
		return nil, err
	}
	g := &Guardian{cmd: cmd, pipe: w, queue: make(chan string, 1024), done: make(chan struct{})}
	go g.write()
	return g, nil
}

func (g *Guardian) write() {
	defer close(g.done)
	for line := range g.queue {
		// An error means the guardian is gone; the agent goes on without.
		_, _ = g.pipe.WriteString(line)
	}
}

// Register tells the guardian about a worker's process group (+) or that
// it is gone (-); nil-safe, never blocks (a full queue drops the line).
func (g *Guardian) Register(pgid int, live bool) {
	if g == nil {
		return
	}
	sign := "-"
	if live {
		sign = "+"
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.stopped {
		return
	}
	select {
	case g.queue <- sign + strconv.Itoa(pgid) + "\n":
	default:
	}
}

// Stop ends the guardian: the closed pipe makes it sweep (there is nothing
// left by then) and exit. It is reaped in the background: the agent does
// not wait for it to start up and finish.
func (g *Guardian) Stop() {
	if g == nil {
		return
	}
	g.mu.Lock()
	if g.stopped {
		g.mu.Unlock()
		return
	}
	g.stopped = true
	close(g.queue)
	g.mu.Unlock()
	<-g.done
	g.pipe.Close()
	go func() { _ = g.cmd.Wait() }()
}

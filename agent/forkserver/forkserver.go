// Package forkserver is the agent's side of a fork server: one Python
// interpreter per pod that has imported the preload modules (torch) and
// forks each worker from itself (forkserver.py), so that a restart costs a
// fork instead of an interpreter start and the imports.
package forkserver

import (
	"bufio"
	_ "embed"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/kfelastic/kfelastic/internal/procmem"
)

// The fork server makes a restart as fast as a fork (docs/DESIGN.md §4.7):
// starting
// Python and importing torch is most of a restart, so the agent keeps one
// interpreter per pod that has imported the preload modules (forkserver.py,
// run with the worker command's own interpreter) and forks each worker from
// it. The workers share its pages copy-on-write; its own memory is one idle
// interpreter per pod, logged when it is ready. It never initialises CUDA
// or starts a thread, and refuses to fork if it finds one (a fork copies
// only the forking thread; the locks of the others stay locked in the
// child); the agent then starts workers with exec.
//
// Whose children the workers are. A forked worker is the fork server's
// child, not the agent's: the server tells the agent its pid as soon as it
// has forked it (the agent signals, kills and watches its process group as
// an exec'd worker's), waits for it, and sends its raw wait status, from
// which the agent tells an exit code from a signal exactly as from its own
// wait; OOM evidence is the cgroup's count as for any worker. The other way,
// a double fork with the agent as PR_SET_CHILD_SUBREAPER, would make
// the workers the agent's own children, but also every orphan of theirs
// (data loader processes), which the agent would then have to reap beside
// os/exec's waits without stealing their statuses (agent/guardian). The
// price of this way is that a worker's status is only known through the
// server: each worker dies with the server (PR_SET_PDEATHSIG), so a dead
// server is a SIGKILL of its workers, reported as such, and the group
// restarts with a new server (and exec for that attempt, while the new one
// imports).
//
// A forked process's /proc/PID/environ is its parent's: the server's, with
// its mark (guardian.MarkEnv, in the environment Start is given). A worker
// writes its own environment over it (forkserver.py), so that it and what it
// forks carry the attempt's mark, and tools that find workers by their
// environment (LOCAL_RANK) find them. Where that could not be done the
// server's mark stays: when a group has ended, every process with the
// server's mark but the server belongs to it and is swept too.

//go:embed forkserver.py
var forkServerProgram string

const (
	// readyTimeout bounds how long a group start waits for the server's
	// imports; after it the group is exec'd and the server kept for later.
	readyTimeout = 2 * time.Minute
	// forkTimeout bounds one fork; a server that does not answer is killed.
	forkTimeout = 30 * time.Second
	// envPad is the room the server's environment keeps for what a
	// worker's adds (≈1–2 KiB of torchrun's variables and paths).
	envPad = 16 << 10
)

// Server is the agent's side of one fork server.
type Server struct {
	cmd     *exec.Cmd
	conn    *net.UnixConn
	pid     int
	logPath string
	log     *slog.Logger
	started time.Time

	// mu serialises forks: one request in flight, matched by id.
	mu      sync.Mutex
	id      int
	replies chan forkReply
	ready   chan struct{}
	// dead is closed when the server's connection ends: it died or was
	// stopped. Every worker not reported by then died with it.
	dead chan struct{}

	emu   sync.Mutex
	exits map[int]chan End
	// refusal is why the server refused to fork (threads, CUDA), "" if it
	// did not; it will not fork again.
	refusal string
}

// End is a forked worker's end: its wait status, or Lost when the server
// died before it reported one.
type End struct {
	Status syscall.WaitStatus
	Lost   bool
}

type forkReply struct {
	id   int
	pid  int
	err  string
	exit chan End
}

// forkMessage is a line from the server.
type forkMessage struct {
	T      string `json:"t"`
	ID     int    `json:"id"`
	PID    int    `json:"pid"`
	Error  string `json:"error"`
	Status int    `json:"status"`
	// Failed: the preloads that did not import, with their errors.
	Failed map[string]string `json:"failed"`
}

// Start starts a fork server with python; env is its environment (the
// workers' defaults: OMP_NUM_THREADS is read when torch loads OpenMP, and
// the mark its forks carry until they write their own), its output goes to
// logPath.
func Start(python string, env []string, preload, logPath string, log *slog.Logger) (*Server, error) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	ours, theirs := os.NewFile(uintptr(fds[0]), "fork-server"), os.NewFile(uintptr(fds[1]), "fork-server")
	defer theirs.Close()
	fc, err := net.FileConn(ours)
	ours.Close()
	if err != nil {
		return nil, err
	}
	logFile, err := os.Create(logPath)
	if err != nil {
		fc.Close()
		return nil, err
	}
	defer logFile.Close()
	cmd := exec.Command(python, "-c", forkServerProgram)
	// The pad makes room in the server's environment block for each
	// worker's, which a forked worker writes over it (forkserver.py,
	// expose): its torchrun variables are the difference.
	cmd.Env = append(env, "KFELASTIC_FORK_PRELOAD="+preload, "KFELASTIC_FORK_PAD="+strings.Repeat("-", envPad))
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.ExtraFiles = []*os.File{theirs}
	// Its own process group, and it dies with the agent; its workers die
	// with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		fc.Close()
		return nil, err
	}
	s := &Server{cmd: cmd, conn: fc.(*net.UnixConn), pid: cmd.Process.Pid, logPath: logPath, log: log,
		started: time.Now(), replies: make(chan forkReply, 1), ready: make(chan struct{}), dead: make(chan struct{}),
		exits: map[int]chan End{}}
	go s.read()
	go func() { _ = cmd.Wait() }()
	return s, nil
}

// read dispatches the server's lines until its connection ends.
func (s *Server) read() {
	sc := bufio.NewScanner(s.conn)
	sc.Buffer(make([]byte, 4096), 1<<20)
	for sc.Scan() {
		var m forkMessage
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			s.log.Warn("fork server: unreadable line", "line", sc.Text(), "err", err)
			continue
		}
		switch m.T {
		case "ready":
			rss, pss, _ := procmem.Rollup(s.pid)
			s.log.Info("fork server ready", "pid", s.pid, "after", time.Since(s.started).Round(time.Millisecond),
				"rss_mib", rss/1024, "pss_mib", pss/1024)
			if len(m.Failed) > 0 {
				s.log.Warn("fork server: preloads not imported; the workers import them", "failed", m.Failed)
			}
			close(s.ready)
		case "forked":
			r := forkReply{id: m.ID, pid: m.PID, err: m.Error}
			if m.Error == "" {
				// Registered before the next line is read: a worker's exit
				// can only follow its fork.
				r.exit = make(chan End, 1)
				s.emu.Lock()
				s.exits[m.PID] = r.exit
				s.emu.Unlock()
			}
			select {
			case s.replies <- r:
			default: // nobody waits: the request timed out and killed the server
			}
		case "exit":
			s.emu.Lock()
			ch := s.exits[m.PID]
			delete(s.exits, m.PID)
			s.emu.Unlock()
			if ch != nil {
				ch <- End{Status: syscall.WaitStatus(m.Status)}
			}
		}
	}
	s.conn.Close()
	close(s.dead) // before the lost exits: a restart that follows sees it dead
	s.emu.Lock()
	lost := len(s.exits)
	for pid, ch := range s.exits {
		ch <- End{Lost: true}
		delete(s.exits, pid)
	}
	s.emu.Unlock()
	if lost > 0 {
		s.log.Warn("fork server died; its workers died with it (reported as SIGKILL)", "pid", s.pid, "workers", lost,
			"its_log", s.LogTail(2048))
	}
}

// WaitReady waits until the server has imported its preloads; false if it
// died, stop was closed or readyTimeout passed.
func (s *Server) WaitReady(stop <-chan struct{}) bool {
	t := time.NewTimer(readyTimeout)
	defer t.Stop()
	select {
	case <-s.ready:
		return true
	case <-s.dead:
	case <-stop:
	case <-t.C:
		s.log.Warn("fork server not ready in time; starting the workers with exec", "after", readyTimeout)
	}
	return false
}

// IsReady reports whether the server has imported its preloads (it may
// have died since).
func (s *Server) IsReady() bool { return closed(s.ready) }

// IsDead reports whether the server's connection has ended.
func (s *Server) IsDead() bool { return closed(s.dead) }

func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// Fork asks the server for a worker running argv (the command after the
// interpreter) with env as its whole environment, in the agent's working
// directory, with stdout and stderr as its fds 1 and 2. It returns the
// worker's pid, which leads its own process group, and the channel of its
// end.
func (s *Server) Fork(argv []string, env map[string]string, stdout, stderr *os.File) (int, <-chan End, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.refusal != "" {
		return 0, nil, errors.New(s.refusal)
	}
	if s.IsDead() {
		return 0, nil, errors.New("fork server died")
	}
	cwd, err := os.Getwd()
	if err != nil {
		return 0, nil, err
	}
	s.id++
	body, err := json.Marshal(map[string]any{"id": s.id, "argv": argv, "env": env, "cwd": cwd})
	if err != nil {
		return 0, nil, err
	}
	frame := binary.BigEndian.AppendUint32(nil, uint32(len(body)))
	frame = append(frame, body...)
	// The descriptors go with the first bytes; a stream socket may take
	// fewer than all of them at once.
	n, _, err := s.conn.WriteMsgUnix(frame, syscall.UnixRights(int(stdout.Fd()), int(stderr.Fd())), nil)
	if err == nil && n < len(frame) {
		_, err = s.conn.Write(frame[n:])
	}
	if err != nil {
		return 0, nil, fmt.Errorf("fork server died or stopped: %w", err)
	}
	t := time.NewTimer(forkTimeout)
	defer t.Stop()
	for {
		select {
		case r := <-s.replies:
			if r.id != s.id {
				continue
			}
			if r.err != "" {
				s.refusal = "fork server refused: " + r.err
				return 0, nil, errors.New(s.refusal)
			}
			return r.pid, r.exit, nil
		case <-s.dead:
			return 0, nil, errors.New("fork server died")
		case <-t.C:
			s.Stop()
			return 0, nil, fmt.Errorf("fork server did not answer in %v; killed it", forkTimeout)
		}
	}
}

// Stop ends the server and, by PR_SET_PDEATHSIG, any worker of its still
// alive; idempotent.
func (s *Server) Stop() {
	s.conn.Close()
	_ = syscall.Kill(-s.pid, syscall.SIGKILL)
}

// Refused is why the server refused to fork, "" if it has not.
func (s *Server) Refused() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.refusal
}

// Pid is the server's pid, the leader of its own process group.
func (s *Server) Pid() int { return s.pid }

// LogTail is the last n bytes of the server's log, for a log line.
func (s *Server) LogTail(n int64) string {
	f, err := os.Open(s.logPath)
	if err != nil {
		return ""
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil && st.Size() > n {
		_, _ = f.Seek(st.Size()-n, 0)
	}
	b := make([]byte, n)
	k, _ := f.Read(b)
	return strings.TrimSpace(string(b[:k]))
}

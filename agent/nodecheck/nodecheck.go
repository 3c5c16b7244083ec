// Package nodecheck is the node health check: this node's part of one
// check round of the master (docs/DESIGN.md §5.4), a small compute and an
// all-reduce with its group, in a child process that can be killed and
// slowed like training: the job's interpreter with torch and gloo, or,
// without torch, the Go check (GoMain, `kfelastic node-check`).
package nodecheck

import (
	"bytes"
	"context"
	_ "embed"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	kferrors "github.com/kfelastic/kfelastic/errors"
)

// The node health check, one node's part of one round (docs/DESIGN.md §5.4): the
// master puts the waiting nodes in groups of two (three when odd) and gives
// each a Task; the node runs a small compute and an all-reduce with its
// group in a child process and reports how it went. The check is a process
// so that it can be killed (a broken machine, or the local engine's
// break-check chaos) and slowed (a straggler) like the training itself.
//
// Two checks, one result: the job's own interpreter with torch and gloo
// (nodecheck.py, embedded), which exercises what training will use; or,
// where there is no torch, a Go check (GoMain, run as `kfelastic
// node-check`) that does the same with a Go matmul and a TCP all-reduce.

//go:embed nodecheck.py
var nodeCheckScript string

// Task is one node's part in one health-check round.
type Task struct {
	Check      int64
	Round      int
	Group      int
	GroupRank  int
	GroupSize  int
	LeaderAddr string
	LeaderPort int
	Timeout    time.Duration
}

// Result is how the round went on this node. Elapsed is the measured
// work (compute + all-reduce), not the process's life: Python's ~1 s import
// of torch would otherwise make every torch check look slow, and a partner
// arriving late would make a fast node look slow.
type Result struct {
	OK bool
	// Self: the failure is this node's own (its check process was killed or
	// crashed, its compute failed), not its group's.
	Self    bool
	Elapsed time.Duration
	// Ready is how long after its launch the check reached its group
	// (its interpreter started, torch imported, the compute done), as the
	// agent saw it; 0 if it never did. A group whose all-reduce timed out
	// waiting for one member tells that member by it: the others were
	// ready long before (master.Verdicts).
	Ready   time.Duration
	Message string
	// How is "torch" or "go".
	How string
}

// Checker runs check rounds.
type Checker struct {
	// Python is the job's interpreter for the torch check; "" runs the Go
	// check.
	Python string
	// GoCheck is the argv prefix of the Go check; default: this executable
	// with the node-check subcommand.
	GoCheck []string
	// Env is the job's environment; nil: os.Environ().
	Env []string
	// Dir keeps each run's output (check<N>_round<R>_<how>.log, stdout and
	// stderr); "" keeps none.
	Dir    string
	Logger *slog.Logger
}

// MarkEnv marks the check's processes (the local engine's break-check chaos
// finds them by it).
const MarkEnv = "KFELASTIC_NODE_CHECK"

// exitNoTorch is nodecheck.py's status when torch cannot be imported.
const exitNoTorch = 3

// Run runs this node's part of task t; any failure is a result with OK
// false, never an error or a panic. It returns within t.Timeout (and a
// moment), or when ctx ends, and leaves no process behind.
func (c *Checker) Run(ctx context.Context, t Task) (res Result) {
	defer func() {
		if p := recover(); p != nil {
			res = Result{Self: true, How: res.How, Message: fmt.Sprintf("node check: internal error: %v", p)}
		}
	}()
	if t.Timeout <= 0 {
		t.Timeout = time.Minute
	}
	if t.GroupSize < 1 || t.GroupRank < 0 || t.GroupRank >= t.GroupSize {
		return Result{Message: fmt.Sprintf("bad check task: group rank %d of %d", t.GroupRank, t.GroupSize)}
	}
	ctx, cancel := context.WithTimeout(ctx, t.Timeout)
	defer cancel()
	if c.Python != "" {
		res, noTorch := c.runTorch(ctx, t)
		if !noTorch {
			return res
		}
		c.logger().Info("no torch with the job's interpreter; running the Go node check", "python", c.Python)
	}
	return c.runGo(ctx, t)
}

func (c *Checker) logger() *slog.Logger {
	if c.Logger == nil {
		return slog.Default()
	}
	return c.Logger
}

// checkEnv is the job's environment without what torchrun set for the
// training workers (the check is its own little job), plus the check's own.
func (c *Checker) checkEnv(t Task) []string {
	base := c.Env
	if base == nil {
		base = os.Environ()
	}
	drop := map[string]bool{"RANK": true, "LOCAL_RANK": true, "WORLD_SIZE": true, "LOCAL_WORLD_SIZE": true, "GROUP_RANK": true,
		"GROUP_WORLD_SIZE": true, "ROLE_RANK": true, "ROLE_WORLD_SIZE": true, "ROLE_NAME": true, "MASTER_ADDR": true,
		"MASTER_PORT": true, "OMP_NUM_THREADS": true}
	var env []string
	for _, kv := range base {
		k, _, _ := strings.Cut(kv, "=")
		if drop[k] || strings.HasPrefix(k, "TORCHELASTIC_") {
			continue
		}
		env = append(env, kv)
	}
	return append(env, MarkEnv+"=1", "OMP_NUM_THREADS=1",
		"MASTER_ADDR="+t.LeaderAddr, "MASTER_PORT="+strconv.Itoa(t.LeaderPort),
		"RANK="+strconv.Itoa(t.GroupRank), "WORLD_SIZE="+strconv.Itoa(t.GroupSize),
		// The check gives up on its group before the agent gives up on it,
		// so that a partner that never comes is reported, not a hang. A
		// point in time, not a duration: Python spends a second or more of
		// it importing torch.
		"KFELASTIC_CHECK_DEADLINE="+strconv.FormatFloat(float64(time.Now().Add(innerTimeout(t.Timeout)).UnixMilli())/1e3, 'f', 3, 64))
}

func (c *Checker) runTorch(ctx context.Context, t Task) (res Result, noTorch bool) {
	if _, err := exec.LookPath(c.Python); err != nil {
		return Result{}, true // no interpreter, no torch
	}
	res, code := c.runProcess(ctx, t, "torch", append([]string{c.Python, "-c", nodeCheckScript}, "kfelastic-node-check"))
	return res, code == exitNoTorch
}

func (c *Checker) runGo(ctx context.Context, t Task) Result {
	argv := c.GoCheck
	if len(argv) == 0 {
		self, err := os.Executable()
		if err != nil {
			return Result{How: "go", Message: fmt.Sprintf("cannot find this executable for the Go check: %v", err)}
		}
		argv = []string{self, "node-check"}
	}
	// A point in time, as the torch check's: a loaded node starts the
	// process late, and a duration counted from its start would outlast
	// the agent's bound (the group's failure then went unnamed).
	argv = append(append([]string{}, argv...), "--leader", net.JoinHostPort(t.LeaderAddr, strconv.Itoa(t.LeaderPort)),
		"--rank", strconv.Itoa(t.GroupRank), "--size", strconv.Itoa(t.GroupSize),
		"--deadline", strconv.FormatFloat(float64(time.Now().Add(innerTimeout(t.Timeout)).UnixMilli())/1e3, 'f', 3, 64))
	res, _ := c.runProcess(ctx, t, "go", argv)
	return res
}

// innerTimeout is the check process's own bound on waiting for its group:
// it gives up and reports before the agent kills it, with a fifth of the
// task's timeout to spare, at least a second (a loaded node starts and
// schedules processes late), at most half.
func innerTimeout(d time.Duration) time.Duration { return d - min(max(d/5, time.Second), d/2) }

// checkLine is the JSON line both checks print last, their result:
//
//	{"ok":true,"self":false,"elapsed":0.061,"compute":0.060,"allreduce":0.001}
//
// elapsed = compute + allreduce, in seconds; error says why when ok is
// false, self whether the failure is the node's own. Before it meets its
// group a check prints a progress line, {"phase":"group"}, so
// that a check killed at the deadline while it waits for its group is not
// blamed for it.
type checkLine struct {
	Phase     string  `json:"phase,omitempty"`
	OK        bool    `json:"ok"`
	Self      bool    `json:"self"`
	Elapsed   float64 `json:"elapsed"`
	Compute   float64 `json:"compute"`
	AllReduce float64 `json:"allreduce"`
	Error     string  `json:"error,omitempty"`
}

// runProcess runs one check process in its own process group, killed with
// its group when ctx ends, and reads its JSON line.
func (c *Checker) runProcess(ctx context.Context, t Task, how string, argv []string) (Result, int) {
	res := Result{How: how}
	// Pdeathsig fires when the thread that started the child ends, not the
	// agent: keep this goroutine on its thread until the child is gone.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = c.checkEnv(t)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 2 * time.Second
	var stdout bytes.Buffer
	stderr := &tailBuffer{max: 4 << 10}
	ready := &readyClock{start: time.Now()}
	cmd.Stdout = io.MultiWriter(&limitedWriter{w: &stdout, n: 64 << 10}, ready)
	cmd.Stderr = stderr
	if c.Dir != "" {
		if err := os.MkdirAll(c.Dir, 0o755); err == nil {
			if f, err := os.Create(filepath.Join(c.Dir, fmt.Sprintf("check%d_round%d_%s.log", t.Check, t.Round, how))); err == nil {
				defer f.Close()
				cmd.Stdout, cmd.Stderr = io.MultiWriter(cmd.Stdout, f), io.MultiWriter(stderr, f)
			}
		}
	}
	err := cmd.Run()
	// Whatever the way out, the group goes with it (a torch check leaves
	// gloo threads' children behind only in theory; a broken one, anything).
	if cmd.Process != nil {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
	code := -1
	if cmd.ProcessState != nil {
		code = cmd.ProcessState.ExitCode()
	}
	var line checkLine
	found, phase := false, ""
	for l := range strings.Lines(stdout.String()) {
		var x checkLine
		if !strings.HasPrefix(l, "{") || json.Unmarshal([]byte(l), &x) != nil {
			continue // not ours: the job's sitecustomize, a warning
		}
		if x.Phase != "" {
			phase = x.Phase
			continue
		}
		line, found = x, true
	}
	res.Self = true // unless it reported a failure of its group below
	res.Ready = ready.at()
	switch {
	case found && (err == nil || ctx.Err() != nil):
		// It printed its result (and was killed afterwards only by us, if
		// at all: the line and our deadline can cross).
		res.OK, res.Self = line.OK, !line.OK && line.Self
		// The work the check measured, not the process's life: Python's
		// import of torch (≈1 s, more on a loaded node) would make every
		// torch check look slow, and the wait for a late partner would make
		// a fast node look slow.
		res.Elapsed = time.Duration(line.Elapsed * float64(time.Second))
		if !line.OK {
			res.Message = fmt.Sprintf("%s check: %s", how, line.Error)
		}
	case errors.Is(ctx.Err(), context.Canceled):
		res.Self, res.Message = false, fmt.Sprintf("%s check cancelled", how)
	case ctx.Err() != nil && phase == "group":
		res.Self = false
		res.Message = fmt.Sprintf("%s check: the group did not finish its all-reduce within %s (a member missing or stuck)%s",
			how, t.Timeout, lastLines(stderr.String()))
	case ctx.Err() != nil:
		res.Message = fmt.Sprintf("%s check did not finish within %s%s", how, t.Timeout, lastLines(stderr.String()))
	case err != nil && cmd.ProcessState != nil && cmd.ProcessState.Sys().(syscall.WaitStatus).Signaled():
		sig := cmd.ProcessState.Sys().(syscall.WaitStatus).Signal()
		res.Message = fmt.Sprintf("%s check process killed by %s", how, unix.SignalName(sig))
	case err != nil && code == exitNoTorch && how == "torch":
		res.Message = "no torch"
	case err != nil:
		res.Message = fmt.Sprintf("%s check failed (%v)%s", how, err, lastLines(stderr.String()))
	default:
		res.Message = fmt.Sprintf("%s check printed no result%s", how, lastLines(stderr.String()))
	}
	return res, code
}

// lastLines is the end of a check's stderr for its failure message.
func lastLines(s string) string {
	s = strings.TrimSpace(kferrors.ValidUTF8(s))
	if s == "" {
		return ""
	}
	lines := strings.Split(s, "\n")
	if len(lines) > 3 {
		lines = lines[len(lines)-3:]
	}
	return ": " + kferrors.CapMessage(strings.Join(lines, " | "), 1000)
}

// readyClock notes when a check printed its progress line (it reached its
// group): the check's whole way there, as this node lived it, interpreter
// start and torch's import included. A check that never met a group (a
// group of one, a failed compute) leaves it 0.
type readyClock struct {
	mu    sync.Mutex
	start time.Time
	tail  []byte // the end of the last write, for a marker cut in two
	ready time.Duration
}

var phaseMarker = []byte(`"phase"`)

func (r *readyClock) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ready == 0 {
		if bytes.Contains(append(r.tail, p...), phaseMarker) {
			r.ready = max(time.Since(r.start), time.Nanosecond)
		}
		r.tail = append(r.tail[:0], p[max(len(p)-len(phaseMarker), 0):]...)
	}
	return len(p), nil
}

func (r *readyClock) at() time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ready
}

// tailBuffer keeps the last max bytes written.
type tailBuffer struct {
	buf []byte
	max int
}

func (b *tailBuffer) Write(p []byte) (int, error) {
	b.buf = append(b.buf, p...)
	if len(b.buf) > b.max {
		b.buf = append(b.buf[:0], b.buf[len(b.buf)-b.max:]...)
	}
	return len(p), nil
}

func (b *tailBuffer) String() string { return string(b.buf) }

// limitedWriter drops what is written past n bytes.
type limitedWriter struct {
	w io.Writer
	n int
}

func (l *limitedWriter) Write(p []byte) (int, error) {
	if l.n <= 0 {
		return len(p), nil
	}
	q := p
	if len(q) > l.n {
		q = q[:l.n]
	}
	l.n -= len(q)
	_, err := l.w.Write(q)
	return len(p), err
}

// GoMain is `kfelastic node-check`: the node check without torch, as
// a process of its own so that it can be killed and slowed like training.
// It times a float64 matmul on this node alone, then meets its group over
// TCP and times a star all-reduce: group rank 0 listens on --leader's port,
// the others connect and say who they are; once the whole group is there
// (the barrier), the leader says go, each member sends a small vector, the
// leader sends back the sum and every member checks it. It prints the JSON
// line nodecheck.py prints and exits 0; 2 for bad arguments.
//
//	node-check --leader HOST:PORT --rank R --size N [--timeout D | --deadline T] [--work N]
//
// --timeout bounds the whole check (listening, connecting, every read),
// --deadline the same as a point in time (Unix seconds, the agent's);
// --work is the number of 128×128 matmuls (≈1–2 ms each here).
func GoMain(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("node-check", flag.ContinueOnError)
	fs.SetOutput(stderr)
	leader := fs.String("leader", "", "HOST:PORT where group rank 0 listens")
	rank := fs.Int("rank", 0, "this node's rank in its group")
	size := fs.Int("size", 1, "the group's size")
	timeout := fs.Duration("timeout", time.Minute, "bound of the whole check")
	until := fs.Float64("deadline", 0, "bound of the whole check as a point in time (Unix seconds), instead of --timeout")
	work := fs.Int("work", 30, "matmul repetitions")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	_, port, perr := net.SplitHostPort(*leader)
	if *size < 1 || *size > 1<<10 || *rank < 0 || *rank >= *size || *work < 1 || *work > 1<<16 || *timeout <= 0 || (*size > 1 && perr != nil) {
		fmt.Fprintf(stderr, "node-check: bad --leader %q / --rank %d / --size %d / --work %d / --timeout %s\n",
			*leader, *rank, *size, *work, *timeout)
		return 2
	}
	deadline := time.Now().Add(*timeout)
	if *until > 0 {
		deadline = time.UnixMilli(int64(*until * 1e3))
	}
	line := checkLine{OK: true}
	// The leader listens before it computes: a port it cannot have is known
	// at once, and members that come early wait in the backlog.
	var l net.Listener
	if *size > 1 && *rank == 0 {
		var err error
		if l, err = net.Listen("tcp", net.JoinHostPort("", port)); err != nil {
			line.OK, line.Self, line.Error = false, true, fmt.Sprintf("the group's leader cannot listen: %v", err)
		} else {
			defer l.Close()
		}
	}
	// The compute is timed alone, before the group meets, so that a slow
	// partner does not make this node look slow.
	t0 := time.Now()
	sum := matmulWork(*work)
	line.Compute = time.Since(t0).Seconds()
	if math.IsNaN(sum) || math.IsInf(sum, 0) {
		line.OK, line.Self, line.Error = false, true, "the compute gave non-finite numbers"
	}
	if line.OK && *size > 1 {
		progress, _ := json.Marshal(struct {
			Phase   string  `json:"phase"`
			Compute float64 `json:"compute"`
		}{"group", line.Compute})
		fmt.Fprintln(stdout, string(progress))
		var d time.Duration
		var err error
		if *rank == 0 {
			d, err = leadAllReduce(l.(*net.TCPListener), *size, deadline)
		} else {
			d, err = joinAllReduce(*leader, *rank, *size, deadline)
		}
		if err != nil {
			line.OK, line.Error = false, err.Error()
		}
		line.AllReduce = d.Seconds()
	}
	line.Elapsed = line.Compute + line.AllReduce
	b, _ := json.Marshal(line)
	fmt.Fprintln(stdout, string(b))
	return 0
}

// matmulWork multiplies two 128×128 matrices n times.
func matmulWork(n int) float64 {
	const dim = 128
	a, b, c := make([]float64, dim*dim), make([]float64, dim*dim), make([]float64, dim*dim)
	for i := range a {
		a[i] = float64(i%7) / 7
		b[i] = float64(i%5) / 5
	}
	for range n {
		for i := range dim {
			for k := range dim {
				aik := a[i*dim+k]
				row := b[k*dim : k*dim+dim]
				out := c[i*dim : i*dim+dim]
				for j := range row {
					out[j] += aik * row[j]
				}
			}
		}
		a, c = c, a
		for i := range a {
			a[i] = math.Tanh(a[i] / dim)
			c[i] = 0
		}
	}
	s := 0.0
	for _, x := range a {
		s += x
	}
	return s
}

// The Go check's wire: a member's hello is checkMagic, its group rank and
// the group's size (uint16 each); the leader's go is one byte; vectors are
// vecLen float64s; all little-endian.
const (
	checkMagic = "KFNC"
	helloLen   = len(checkMagic) + 4
	checkGo    = 'G'
	vecLen     = 256
)

// vector is what group rank r contributes; the sum of a group of n is
// n(n+1)/2 in every element.
func vector(rank int) []float64 {
	v := make([]float64, vecLen)
	for i := range v {
		v[i] = float64(rank + 1)
	}
	return v
}

func checkSum(v []float64, size int) error {
	want := float64(size*(size+1)) / 2
	for i, x := range v {
		if x != want {
			return fmt.Errorf("the all-reduce gave %g at %d, want %g", x, i, want)
		}
	}
	return nil
}

// leadAllReduce is group rank 0's side: it waits for every member's hello
// (strangers and duplicates are dropped), says go, sums and answers. The
// time returned starts at go.
func leadAllReduce(l *net.TCPListener, size int, deadline time.Time) (time.Duration, error) {
	_ = l.SetDeadline(deadline)
	type joined struct {
		rank int
		conn net.Conn
	}
	arrivals := make(chan joined)
	done := make(chan struct{})
	defer close(done)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return // the deadline, or the listener closed on return
			}
			go func() {
				_ = c.SetDeadline(deadline)
				r, err := readHello(c, size)
				if err != nil || r == 0 {
					c.Close()
					return
				}
				select {
				case arrivals <- joined{r, c}:
				case <-done:
					c.Close()
				}
			}()
		}
	}()
	members := make([]net.Conn, size)
	defer func() {
		for _, c := range members {
			if c != nil {
				c.Close()
			}
		}
	}()
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	for n := 1; n < size; {
		select {
		case j := <-arrivals:
			if members[j.rank] != nil {
				j.conn.Close() // a second hello for a rank: keep the first
				continue
			}
			members[j.rank] = j.conn
			n++
		case <-timer.C:
			var missing []string
			for r := 1; r < size; r++ {
				if members[r] == nil {
					missing = append(missing, strconv.Itoa(r))
				}
			}
			return 0, fmt.Errorf("group %s %s did not come to the leader on port %s before the deadline",
				plural(len(missing), "rank", "ranks"), strings.Join(missing, ", "), portOf(l.Addr()))
		}
	}
	for r := 1; r < size; r++ {
		if _, err := members[r].Write([]byte{checkGo}); err != nil {
			return 0, fmt.Errorf("group rank %d left before the all-reduce: %w", r, err)
		}
	}
	start := time.Now()
	sum := vector(0)
	for r := 1; r < size; r++ {
		v, err := readVec(members[r])
		if err != nil {
			return 0, fmt.Errorf("group rank %d's vector: %w", r, err)
		}
		for i := range sum {
			sum[i] += v[i]
		}
	}
	for r := 1; r < size; r++ {
		if err := writeVec(members[r], sum); err != nil {
			return 0, fmt.Errorf("sending the sum to group rank %d: %w", r, err)
		}
	}
	return time.Since(start), checkSum(sum, size)
}

// joinAllReduce is a member's side: it connects to the leader (retrying
// until the deadline: the leader may not be listening yet), says hello,
// waits for go, sends its vector and checks the sum. The time returned
// starts at go.
func joinAllReduce(leader string, rank, size int, deadline time.Time) (time.Duration, error) {
	var c net.Conn
	for {
		var err error
		d := net.Dialer{Deadline: deadline}
		if c, err = d.Dial("tcp", leader); err == nil {
			break
		}
		if time.Until(deadline) < 50*time.Millisecond {
			return 0, fmt.Errorf("cannot reach the group's leader %s before the deadline: %w", leader, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	defer c.Close()
	_ = c.SetDeadline(deadline)
	hello := binary.LittleEndian.AppendUint16(binary.LittleEndian.AppendUint16([]byte(checkMagic), uint16(rank)), uint16(size))
	if _, err := c.Write(hello); err != nil {
		return 0, fmt.Errorf("hello to the group's leader %s: %w", leader, err)
	}
	var goByte [1]byte
	if _, err := io.ReadFull(c, goByte[:]); err != nil || goByte[0] != checkGo {
		if err == nil {
			err = fmt.Errorf("got %q, not go", goByte[0])
		}
		return 0, fmt.Errorf("the group did not meet at the leader %s (a member missing, or the leader gone): %w", leader, err)
	}
	start := time.Now()
	if err := writeVec(c, vector(rank)); err != nil {
		return 0, fmt.Errorf("sending the vector to the leader %s: %w", leader, err)
	}
	sum, err := readVec(c)
	if err != nil {
		return 0, fmt.Errorf("the sum from the leader %s: %w", leader, err)
	}
	return time.Since(start), checkSum(sum, size)
}

// readHello reads a member's hello and returns its group rank.
func readHello(r io.Reader, size int) (int, error) {
	b := make([]byte, helloLen)
	if _, err := io.ReadFull(r, b); err != nil {
		return 0, err
	}
	rank, n := int(binary.LittleEndian.Uint16(b[4:])), int(binary.LittleEndian.Uint16(b[6:]))
	if string(b[:4]) != checkMagic || n != size || rank >= size {
		return 0, fmt.Errorf("not a member's hello: %q", b)
	}
	return rank, nil
}

func writeVec(w io.Writer, v []float64) error {
	b := make([]byte, 8*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint64(b[8*i:], math.Float64bits(x))
	}
	_, err := w.Write(b)
	return err
}

func readVec(r io.Reader) ([]float64, error) {
	b := make([]byte, 8*vecLen)
	if _, err := io.ReadFull(r, b); err != nil {
		return nil, err
	}
	v := make([]float64, vecLen)
	for i := range v {
		v[i] = math.Float64frombits(binary.LittleEndian.Uint64(b[8*i:]))
	}
	return v, nil
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

func portOf(a net.Addr) string {
	if t, ok := a.(*net.TCPAddr); ok {
		return strconv.Itoa(t.Port)
	}
	return a.String()
}

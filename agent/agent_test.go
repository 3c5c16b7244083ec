package agent

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kfelastic/kfelastic/agent/guardian"
	"github.com/kfelastic/kfelastic/agent/tcpstore"
	kferrors "github.com/kfelastic/kfelastic/errors"
	podevents "github.com/kfelastic/kfelastic/events"
	"github.com/kfelastic/kfelastic/internal/nonblocking"
	"github.com/kfelastic/kfelastic/internal/stopsignal"
	"github.com/kfelastic/kfelastic/internal/termsafe"
	"github.com/kfelastic/kfelastic/internal/test/testenv"
	"github.com/kfelastic/kfelastic/master"
	"github.com/kfelastic/kfelastic/outputreader"
)

// helperEnv selects the helper mode of a re-executed test binary. Its value
// is a ';'-separated list indexed by TORCHELASTIC_RESTART_COUNT (the last one
// repeats), each a ','-separated list of modes indexed by LOCAL_RANK:
//
//	ok                 print a line, exit 0
//	exit:N             print a line, exit N
//	exitlater:N        sleep 500ms, exit N
//	exitwhen:FILE      wait for FILE to exist, exit 1
//	hang               sleep without output
//	ignoreterm         ignore SIGTERM, sleep without output
//	signal:NAME        die of signal NAME (via an exec'd shell)
//	grandchild:FILE    start a sleeping grandchild, write its pid to FILE, exit 1
//	torcherr:TYPE      write a torch error file (TYPE: msg, timestamp), exit 1
//	torchts:TS         write a torch error file whose timestamp is TS (verbatim), exit 1
//	bigerror:MB        write a sparse error file of MB megabytes, exit 1
//	chatty:DUR         print a 200-byte line every millisecond for DUR, exit 0
//	family:DIR         start a sleeping child in its group and a sleeping daemon in a session of its
//	                   own, write DIR/{worker,child,daemon}-<rank> with their pids, then sleep
//	daemon:FILE        start a sleeping daemon in a session of its own, write its pid to FILE, exit 1
//	checkdead:FILE     exit 5 if the pid in FILE lives; else start a daemon as daemon:FILE.next, exit 0
//	touch:DUR          touch $KFELASTIC_PROGRESS_FILE every 100ms without output for DUR, exit 0
//	futuretouch        date $KFELASTIC_PROGRESS_FILE in the year 2100, then hang without output
//	dump:DIR           on SIGUSR1 write DIR/dumped-<rank>, exit 0; else sleep
//	flytedoc:DIR       write a flytekit-style error document into DIR, exit 1
//	pyflyte:DIR|S|MS|LINE|N  as pyflyte-execute after a worker failed: a torch error file dated
//	                   S (epoch s) + MS ms, flytekit's document into DIR (internal/test/flytekitdoc:
//	                   _F_WN, torch's whole second S, the exception LINE), exit N
//	breakprefix:DIR    replace the folder DIR by a file, exit 3
//	envdump:DIR        write DIR/<pod>-<rank>-<restart>.json, then wait for DIR/stop, exit 0
//	store:DUR          rank 0: after DUR (its imports) serve WORLD_SIZE-1 line echoes on MASTER_PORT, as
//	                   the store would; others: connect once to MASTER_PORT (a refusal exits 4), get the echo
//	sleep              sleep forever (a grandchild)
const helperEnv = "KFELASTIC_AGENT_HELPER"

func TestMain(m *testing.M) {
	guardian.MaybeRun()
	if modes, ok := os.LookupEnv(helperEnv); ok {
		os.Exit(runHelper(modes))
	}
	if spec, ok := os.LookupEnv(agentProcessEnv); ok {
		os.Exit(runAgentProcess(spec))
	}
	testenv.Main(m)
}

// agentProcessEnv makes the re-executed test binary an agent process, wired
// as `kfelastic agent` is (NotifyContext, Outputs), over helper workers: the
// tests that signal the agent, SIGKILL it or leave its output unread.
const agentProcessEnv = "KFELASTIC_AGENT_PROCESS"

// agentProcess is an agent process's configuration, as JSON in
// agentProcessEnv.
type agentProcess struct {
	NProc          int
	Modes          string // helper modes of the workers (helperEnv)
	MaxRestarts    int
	HangTimeout    time.Duration
	StopGrace      time.Duration
	DumpSignal     syscall.Signal
	DumpTimeout    time.Duration
	ErrorPrefix    string
	LogDir         string
	StorageTimeout time.Duration
	// Command replaces the helper workers (the test binary) when set.
	Command []string
}

func runAgentProcess(spec string) int {
	var p agentProcess
	if err := json.Unmarshal([]byte(spec), &p); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	ctx, stop := stopsignal.NotifyContext(context.Background())
	defer stop()
	if p.Command == nil {
		p.Command = []string{os.Args[0]}
	}
	stdout, stderr := nonblocking.NewOutput(os.Stdout), nonblocking.NewOutput(os.Stderr)
	defer nonblocking.CloseOutputs(500*time.Millisecond, stdout, stderr) // the command waits 2 s
	err := Run(ctx, Config{
		Command: p.Command, NProcPerNode: p.NProc, MinNodes: 1, MaxNodes: 1, NodeRank: -1, MaxRestarts: p.MaxRestarts,
		RdzvID: "proc", LogDir: p.LogDir, Pod: "pod-0", StopGrace: p.StopGrace, HangTimeout: p.HangTimeout,
		DumpSignal: p.DumpSignal, DumpTimeout: p.DumpTimeout, ErrorPrefix: p.ErrorPrefix, StorageTimeout: p.StorageTimeout,
		Tee: true, Stdout: stdout, Stderr: stderr, MasterAddr: "127.0.0.1", Logger: slog.New(slog.NewTextHandler(stderr, nil)),
		Env: append(os.Environ(), helperEnv+"="+p.Modes),
	})
	var ee *ExitError
	switch {
	case errors.As(err, &ee):
		fmt.Fprintln(stderr, "agent:", ee)
		return ee.Code
	case err != nil:
		fmt.Fprintln(stderr, "agent:", err)
		return 2
	}
	return 0
}

// startAgentProcess starts an agent process with p; stdout and stderr are
// what the test gives it (a buffer, a pipe nobody reads, a closed pipe).
// The process is SIGKILLed when the test ends.
func startAgentProcess(t *testing.T, p agentProcess, stdout, stderr io.Writer) *exec.Cmd {
	t.Helper()
	if p.LogDir == "" {
		p.LogDir = t.TempDir()
	}
	spec, _ := json.Marshal(p)
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), agentProcessEnv+"="+string(spec))
	cmd.Stdout, cmd.Stderr = stdout, stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	return cmd
}

// waitExit waits for an agent process, at most limit, and returns its
// exit code (-1 if a signal ended it).
func waitExit(t *testing.T, cmd *exec.Cmd, limit time.Duration) int {
	t.Helper()
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(limit):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("agent process still running after %v", limit)
	}
	return cmd.ProcessState.ExitCode()
}

func runHelper(modes string) int {
	restart, _ := strconv.Atoi(os.Getenv("TORCHELASTIC_RESTART_COUNT"))
	local, _ := strconv.Atoi(os.Getenv("LOCAL_RANK"))
	byRestart := strings.Split(modes, ";")
	byRank := strings.Split(byRestart[min(restart, len(byRestart)-1)], ",")
	mode, arg, _ := strings.Cut(byRank[min(local, len(byRank)-1)], ":")
	// Signal dispositions are set before the line a test may wait for.
	if mode == "ignoreterm" {
		signal.Ignore(syscall.SIGTERM)
	}
	dumped := make(chan os.Signal, 1)
	if mode == "dump" {
		signal.Notify(dumped, syscall.SIGUSR1)
	}
	fmt.Printf("helper %s rank %s restart %d pid %d\n", mode, os.Getenv("RANK"), restart, os.Getpid())
	switch mode {
	case "ok":
		return 0
	case "exit":
		n, _ := strconv.Atoi(arg)
		fmt.Fprintf(os.Stderr, "exiting with %d\n", n)
		return n
	case "signal":
		// The Go runtime turns SIGSEGV into a panic; a shell exec'd in our
		// place dies of the signal itself.
		_ = syscall.Exec("/bin/sh", []string{"sh", "-c", "kill -" + arg + " $$; sleep 10"}, os.Environ())
		return 99
	case "exitlater":
		time.Sleep(500 * time.Millisecond)
		n, _ := strconv.Atoi(arg)
		return n
	case "exitwhen":
		for {
			if _, err := os.Stat(arg); err == nil {
				return 1
			}
			time.Sleep(20 * time.Millisecond)
		}
	case "hang", "sleep":
		time.Sleep(time.Hour)
	case "storepoll":
		return storePoll()
	case "ignoreterm":
		time.Sleep(time.Hour)
	case "grandchild":
		cmd := exec.Command(os.Args[0])
		cmd.Env = append(os.Environ(), helperEnv+"=sleep")
		if err := cmd.Start(); err != nil {
			return 98
		}
		_ = os.WriteFile(arg, []byte(strconv.Itoa(cmd.Process.Pid)), 0o644)
		return 1
	case "torcherr":
		// torch's @record format, whole-second timestamp.
		doc := map[string]any{"message": map[string]any{
			"message":   arg + ": failed on purpose",
			"extraInfo": map[string]string{"py_callstack": "Traceback (most recent call last):\n" + arg + ": failed on purpose", "timestamp": strconv.FormatInt(time.Now().Unix(), 10)},
		}}
		data, _ := json.Marshal(doc)
		_ = os.WriteFile(os.Getenv("TORCHELASTIC_ERROR_FILE"), data, 0o644)
		return 1
	case "touch":
		d, _ := time.ParseDuration(arg)
		end := time.Now().Add(d)
		p := os.Getenv(ProgressFileEnv)
		for time.Now().Before(end) {
			_ = os.WriteFile(p, nil, 0o644)
			time.Sleep(100 * time.Millisecond)
		}
		return 0
	case "futuretouch":
		p := os.Getenv(ProgressFileEnv)
		_ = os.WriteFile(p, nil, 0o644)
		future := time.Date(2100, 1, 1, 0, 0, 0, 0, time.UTC)
		_ = os.Chtimes(p, future, future)
		time.Sleep(time.Hour)
	case "dump":
		<-dumped
		_ = os.WriteFile(filepath.Join(arg, "dumped-"+os.Getenv("RANK")), nil, 0o644)
		return 0
	case "torchts":
		data := `{"message":{"message":"ValueError: stamped ` + arg + `","extraInfo":{"py_callstack":"Traceback","timestamp":"` + arg + `"}}}`
		_ = os.WriteFile(os.Getenv("TORCHELASTIC_ERROR_FILE"), []byte(data), 0o644)
		return 1
	case "bigerror":
		mb, _ := strconv.Atoi(arg)
		p := os.Getenv("TORCHELASTIC_ERROR_FILE")
		_ = os.WriteFile(p, []byte(`{"message":"`), 0o644)
		_ = os.Truncate(p, int64(mb)<<20)
		return 1
	case "chatty":
		d, _ := time.ParseDuration(arg)
		line := strings.Repeat("x", 199) + "\n"
		for end := time.Now().Add(d); time.Now().Before(end); {
			_, _ = os.Stdout.WriteString(line)
			time.Sleep(time.Millisecond)
		}
		return 0
	case "family":
		rank := os.Getenv("LOCAL_RANK")
		_ = os.WriteFile(filepath.Join(arg, "worker-"+rank), []byte(strconv.Itoa(os.Getpid())), 0o644)
		for _, kind := range []string{"child", "daemon"} {
			pid, err := startSleeper(kind == "daemon")
			if err != nil {
				return 98
			}
			_ = os.WriteFile(filepath.Join(arg, kind+"-"+rank), []byte(strconv.Itoa(pid)), 0o644)
		}
		time.Sleep(time.Hour)
	case "daemon":
		pid, err := startSleeper(true)
		if err != nil {
			return 98
		}
		_ = os.WriteFile(arg, []byte(strconv.Itoa(pid)), 0o644)
		return 1
	case "checkdead":
		data, _ := os.ReadFile(arg)
		if pid, _ := strconv.Atoi(string(data)); pid == 0 || testenv.Alive(pid) {
			fmt.Fprintf(os.Stderr, "the daemon of the last attempt (pid %s) lives\n", data)
			return 5
		}
		pid, err := startSleeper(true)
		if err != nil {
			return 98
		}
		_ = os.WriteFile(arg+".next", []byte(strconv.Itoa(pid)), 0o644)
		return 0
	case "breakprefix":
		// The error prefix becomes unwritable while the pod runs (storage
		// gone): a regular file where its folder was.
		_ = os.RemoveAll(arg)
		_ = os.WriteFile(arg, []byte("not a folder"), 0o644)
		return 3
	case "flytedoc":
		// What flytekit does with _F_DES set: its own document, named by uuid.
		f := kferrors.UserError("ValueError", "flytekit wrote this", os.Getenv("_F_WN"), time.Now())
		data, _ := kferrors.Encode(f.Document(0))
		_ = os.WriteFile(filepath.Join(arg, "error-0123456789abcdef0123456789abcdef.pb"), data, 0o644)
		return 1
	case "pyflyte":
		return pyflyteHelper(arg)
	case "store":
		return storeHelper(arg)
	case "envdump":
		env := map[string]string{}
		for _, kv := range os.Environ() {
			k, v, _ := strings.Cut(kv, "=")
			env[k] = v
		}
		data, _ := json.Marshal(env)
		name := fmt.Sprintf("%s-gws%s.json", strings.ReplaceAll(os.Getenv("_F_WN"), "/", "-"), os.Getenv("GROUP_WORLD_SIZE"))
		_ = os.WriteFile(filepath.Join(arg, name), data, 0o644)
		for {
			if _, err := os.Stat(filepath.Join(arg, "stop")); err == nil {
				return 0
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return 97
}

// startSleeper starts this binary sleeping (helper mode "sleep"), in a
// session of its own when daemon (as a daemon detaches), and returns its pid.
// It inherits this process's environment, the agent's mark included.
func startSleeper(daemon bool) (int, error) {
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), helperEnv+"=sleep")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: daemon}
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	return cmd.Process.Pid, nil
}

func storeHelper(delay string) int {
	port := os.Getenv("MASTER_PORT")
	fmt.Printf("master_port %s\n", port)
	if os.Getenv("RANK") == "0" {
		d, _ := time.ParseDuration(delay)
		time.Sleep(d)
		ln, err := net.Listen("tcp", ":"+port)
		if err != nil {
			fmt.Fprintln(os.Stderr, "store:", err)
			return 3
		}
		ws, _ := strconv.Atoi(os.Getenv("WORLD_SIZE"))
		for range ws - 1 {
			c, err := ln.Accept()
			if err != nil {
				return 3
			}
			line, _ := bufio.NewReader(c).ReadString('\n')
			_, _ = io.WriteString(c, line)
			c.Close()
		}
		return 0
	}
	c, err := net.Dial("tcp", net.JoinHostPort(os.Getenv("MASTER_ADDR"), port))
	if err != nil {
		fmt.Fprintln(os.Stderr, "store refused:", err)
		return 4
	}
	defer c.Close()
	want := "rank " + os.Getenv("RANK") + "\n"
	_, _ = io.WriteString(c, want)
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if line, err := bufio.NewReader(c).ReadString('\n'); err != nil || line != want {
		fmt.Fprintf(os.Stderr, "store answered %q, %v\n", line, err)
		return 5
	}
	fmt.Println("store answered")
	return 0
}

// syncBuffer is a goroutine-safe bytes.Buffer for the agent's output.
type syncBuffer = testenv.SyncBuffer

// helperConfig runs nproc copies of the test binary in helper modes.
func helperConfig(t *testing.T, nproc int, modes string) (Config, *syncBuffer) {
	out := &syncBuffer{}
	env := append(os.Environ(), helperEnv+"="+modes)
	return Config{
		Command: []string{os.Args[0]}, NProcPerNode: nproc, MinNodes: 1, MaxNodes: 1, NodeRank: -1,
		RdzvID: "test", LogDir: t.TempDir(), Pod: "pod-0", StopGrace: 2 * time.Second, Tee: true,
		Stdout: out, Stderr: out, Env: env, MasterAddr: "127.0.0.1",
		Logger: slog.New(slog.NewTextHandler(out, nil)),
	}, out
}

func runAgent(t *testing.T, ctx context.Context, cfg Config) (*ExitError, time.Duration) {
	t.Helper()
	start := time.Now()
	err := Run(ctx, cfg)
	took := time.Since(start)
	if err == nil {
		return nil, took
	}
	var ee *ExitError
	if !errors.As(err, &ee) {
		t.Fatalf("Run: %v", err)
	}
	return ee, took
}

func TestRunSucceeds(t *testing.T) {
	cfg, out := helperConfig(t, 2, "ok")
	if ee, _ := runAgent(t, t.Context(), cfg); ee != nil {
		t.Fatalf("Run: %v\n%s", ee, out)
	}
	for _, want := range []string{"[default0]:helper ok rank 0", "[default1]:helper ok rank 1",
		"Rendezvous complete for workers. Result:\n  restart_count=0\n  master_addr=127.0.0.1\n",
		"  group_rank=0\n  group_world_size=1\n  local_ranks=[0, 1]\n  role_ranks=[0, 1]\n  global_ranks=[0, 1]\n  role_world_sizes=[2, 2]\n  global_world_sizes=[2, 2]\n"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	logs, _ := filepath.Glob(filepath.Join(cfg.LogDir, "test_*", "attempt_1", "1", "stdout.log"))
	if len(logs) != 1 {
		t.Fatalf("no stdout.log of worker 1 under %s", cfg.LogDir)
	}
	if data, _ := os.ReadFile(logs[0]); !strings.HasPrefix(string(data), "helper ok rank 1") {
		t.Errorf("stdout.log = %q", data)
	}
}

// A failure restarts the group with TORCHELASTIC_RESTART_COUNT=1 (the helper
// picks its mode by that count) and the run then succeeds.
func TestRestartWithinBudget(t *testing.T) {
	cfg, out := helperConfig(t, 2, "exit:3,hang;ok,ok")
	cfg.MaxRestarts = 1
	if ee, _ := runAgent(t, t.Context(), cfg); ee != nil {
		t.Fatalf("Run: %v\n%s", ee, out)
	}
	if !strings.Contains(out.String(), "restart_count=1") || !strings.Contains(out.String(), "[default1]:helper ok rank 1 restart 1") {
		t.Errorf("no restart into restart_count=1:\n%s", out)
	}
}

// Budget exhausted after a worker left a torch error file: the pod document
// carries the exception type, the worker and a time refined below the second.
func TestBudgetExhaustedWritesDocument(t *testing.T) {
	cfg, out := helperConfig(t, 2, "hang,torcherr:ValueError")
	cfg.MaxRestarts = 1
	dir := t.TempDir()
	cfg.ErrorPrefix = "file://" + dir
	start := time.Now()
	ee, _ := runAgent(t, t.Context(), cfg)
	if ee == nil || ee.Code != 1 {
		t.Fatalf("want exit 1, got %v\n%s", ee, out)
	}
	f := ee.Failure
	if f.Code != "ValueError" || f.Worker != "pod-0/1" || f.Recoverable {
		t.Errorf("failure = %+v", f)
	}
	// Within the run. Its sub-second refinement by the file's mtime is
	// ParseTorchError's (errors' TestParseTorchErrorRefinesSeconds): under
	// load the file may be written over a second after torch's whole-second
	// timestamp, and the refinement then rightly keeps that second.
	if f.Time.Before(start.Truncate(time.Second)) || f.Time.After(time.Now()) {
		t.Errorf("time %v not within the run", f.Time)
	}
	got := readDocument(t, dir, ee.Document)
	if got.Code != "ValueError" || !got.Time.Equal(f.Time) || got.Worker != "pod-0/1" || !strings.Contains(got.Message, "failed on purpose") {
		t.Errorf("document = %+v", got)
	}
	if n := strings.Count(out.String(), "Rendezvous complete"); n != 2 {
		t.Errorf("%d rendezvous, want 2 (one restart)", n)
	}
	checkEvents(t, dir, ee)
}

// checkEvents: the pod's event log next to its document tells the story of
// TestBudgetExhaustedWritesDocument: two groups, a restart between them, the
// failing worker's exits with their code, its peer's stopped by the agent,
// then the pod's failure naming its document.
func checkEvents(t *testing.T, dir string, ee *ExitError) {
	t.Helper()
	b, err := kferrors.OpenPrefix(t.Context(), "file://"+dir, false)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	log, err := podevents.Read(t.Context(), b, nil)
	if err != nil || len(log.Skipped) > 0 {
		t.Fatalf("events: %v, skipped %v", err, log.Skipped)
	}
	var story []string
	exits := map[string]int{}
	for _, ev := range log.Events {
		if ev.Pod != "pod-0" {
			t.Errorf("event of pod %q", ev.Pod)
		}
		switch ev.Kind {
		case podevents.WorkerExited:
			exits[fmt.Sprintf("%s code=%s stopped=%t", ev.Worker, ev.Code, ev.Stopped)]++
		case podevents.GroupStarted:
			story = append(story, fmt.Sprintf("%s attempt=%d restart=%d", ev.Kind, ev.Attempt, ev.RestartCount))
		case podevents.Restart:
			story = append(story, fmt.Sprintf("%s attempt=%d restart=%d reason=%s", ev.Kind, ev.Attempt, ev.RestartCount, ev.Reason))
		case podevents.PodFailed:
			story = append(story, fmt.Sprintf("%s code=%s exit=%d document=%t", ev.Kind, ev.Code, *ev.ExitCode, ev.Document == ee.Document))
		}
	}
	want := "group-started attempt=1 restart=0|restart attempt=2 restart=1 reason=failure|group-started attempt=2 restart=1|pod-failed code=ValueError exit=1 document=true"
	if got := strings.Join(story, "|"); got != want {
		t.Errorf("events\n got %s\nwant %s", got, want)
	}
	if exits["pod-0/1 code=ValueError stopped=false"] != 2 || exits["pod-0/0 code=SignalSIGTERM stopped=true"] != 2 {
		t.Errorf("worker exits %v", exits)
	}
}

func TestSignalExitCode(t *testing.T) {
	cfg, out := helperConfig(t, 1, "signal:SEGV")
	ee, _ := runAgent(t, t.Context(), cfg)
	if ee == nil || ee.Code != 139 || ee.Failure.Code != "SignalSIGSEGV" || !ee.Failure.Recoverable {
		t.Fatalf("want SignalSIGSEGV exit 139, got %+v\n%s", ee, out)
	}
}

// A worker's grandchild does not survive the worker: no orphans. The exit is
// seen as an event: the agent is done well within a second of the failure.
func TestNoOrphans(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "pid")
	cfg, out := helperConfig(t, 1, "grandchild:"+pidFile)
	ee, took := runAgent(t, t.Context(), cfg)
	if ee == nil || ee.Failure.Code != kferrors.CodeNonZeroExit {
		t.Fatalf("want NonZeroExit, got %+v\n%s", ee, out)
	}
	data, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	pid, _ := strconv.Atoi(string(data))
	deadline := time.Now().Add(2 * time.Second)
	for testenv.Alive(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("grandchild %d still alive after the agent returned", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if took > 3*time.Second {
		t.Errorf("agent took %v for an immediate failure", took)
	}
}

// A worker that ignores SIGTERM is SIGKILLed after the stop grace.
func TestStopEscalatesToSIGKILL(t *testing.T) {
	cfg, out := helperConfig(t, 2, "exitlater:2,ignoreterm")
	cfg.StopGrace = 300 * time.Millisecond
	ee, took := runAgent(t, t.Context(), cfg)
	if ee == nil || ee.Failure.Worker != "pod-0/0" || ee.Failure.Code != kferrors.CodeNonZeroExit {
		t.Fatalf("want worker 0's NonZeroExit, got %+v\n%s", ee, out)
	}
	if !strings.Contains(out.String(), "signal=killed") {
		t.Errorf("no SIGKILL in the log:\n%s", out)
	}
	if took < 800*time.Millisecond || took > 3*time.Second {
		t.Errorf("took %v, want about the 300ms grace", took)
	}
}

// The watchdog's clock runs from the hung worker's last output line, so the
// test times the detection from that line (seen in the agent's output,
// after the agent read it), not from the agent's start: a helper's own
// start is slow on a loaded machine, and under -race.
func TestHangWatchdog(t *testing.T) {
	// The timeout is counted from a worker's start too: under -race on a
	// loaded machine the helper takes over 700 ms to print its first line,
	// and was then called hung before it said so. Worker 1 touches its
	// progress file well past worker 0's hang.
	cfg, out := helperConfig(t, 2, "hang,touch:8s")
	cfg.HangTimeout = 2 * time.Second
	silent := make(chan time.Time, 1)
	go func() {
		waitFor(t, out, "[default0]:helper hang", 20*time.Second)
		silent <- time.Now()
	}()
	ee, _ := runAgent(t, t.Context(), cfg)
	returned := time.Now()
	if ee == nil || ee.Code != kferrors.ExitHang || ee.Failure.Code != kferrors.CodeHang || ee.Failure.Worker != "pod-0/0" {
		t.Fatalf("want Hang of worker 0, got %+v\n%s", ee, out)
	}
	lastLine := <-silent
	if deadline := lastLine.Add(cfg.HangTimeout); ee.Failure.Time.After(deadline) {
		t.Errorf("Hang dated %v, after its deadline %v (last output + %v)", ee.Failure.Time, deadline, cfg.HangTimeout)
	}
	if d := returned.Sub(lastLine); d > cfg.HangTimeout+1100*time.Millisecond {
		t.Errorf("hang detected and the workers stopped %v after the worker's last output, timeout %v", d, cfg.HangTimeout)
	}
}

// Touching the progress file counts as progress even without output.
// The timeout covers the helper's own start, which under -race alone takes
// 0.6 s here.
func TestHangProgressFile(t *testing.T) {
	// 3 s, not 1.2: under a cold make test's load the helper's first touch
	// came later than 1.2 s after its start.
	cfg, out := helperConfig(t, 1, "touch:6s")
	cfg.HangTimeout = 3 * time.Second
	if ee, _ := runAgent(t, t.Context(), cfg); ee != nil {
		t.Fatalf("Run: %v\n%s", ee, out)
	}
}

// SIGTERM to the agent (ctx ends): the dump signal lets workers checkpoint
// and exit, then a Preempted document, exit 143.
func TestPreemptedWithDump(t *testing.T) {
	dumpDir := t.TempDir()
	cfg, out := helperConfig(t, 2, "dump:"+dumpDir)
	cfg.DumpSignal, cfg.DumpTimeout = syscall.SIGUSR1, 5*time.Second
	docs := t.TempDir()
	cfg.ErrorPrefix = "file://" + docs
	ctx, cancel := context.WithCancel(t.Context())
	go func() {
		waitFor(t, out, "[default1]:helper dump", 5*time.Second)
		waitFor(t, out, "[default0]:helper dump", 5*time.Second)
		cancel()
	}()
	ee, _ := runAgent(t, ctx, cfg)
	if ee == nil || ee.Code != 143 || ee.Failure.Code != kferrors.CodePreempted || ee.Failure.Worker != "pod-0" {
		t.Fatalf("want Preempted 143, got %+v\n%s", ee, out)
	}
	for _, r := range []string{"0", "1"} {
		if _, err := os.Stat(filepath.Join(dumpDir, "dumped-"+r)); err != nil {
			t.Errorf("worker %s did not get the dump signal: %v", r, err)
		}
	}
	if ee.Document == "" {
		t.Error("no document written")
	}
}

func TestPreemptedWithoutDump(t *testing.T) {
	cfg, out := helperConfig(t, 2, "hang")
	ctx, cancel := context.WithCancel(t.Context())
	go func() {
		waitFor(t, out, "[default1]:helper hang", 5*time.Second)
		cancel()
	}()
	ee, took := runAgent(t, ctx, cfg)
	if ee == nil || ee.Code != 143 || ee.Failure.Code != kferrors.CodePreempted {
		t.Fatalf("want Preempted 143, got %+v\n%s", ee, out)
	}
	if took > 3*time.Second {
		t.Errorf("took %v", took)
	}
}

func waitFor(t *testing.T, out fmt.Stringer, s string, d time.Duration) {
	deadline := time.Now().Add(d)
	for !strings.Contains(out.String(), s) {
		if time.Now().After(deadline) {
			t.Errorf("no %q in %v", s, d)
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Two agents on a real master (1..2 nodes, gRPC on loopback): the first
// trains alone, the second's arrival is a membership change the master
// brings on the first's heartbeat, and both restart into a 2-node round
// without spending budget (restart count stays 0).
func TestScaleUpThroughMaster(t *testing.T) {
	dir := t.TempDir()
	endpoint, tokenFile := startMaster(t, master.Config{JobID: "test", MinNodes: 1, MaxNodes: 2, WaitingTimeout: 100 * time.Millisecond})
	run := func(pod string, rank int) (chan error, *syncBuffer) {
		cfg, out := helperConfig(t, 2, "envdump:"+dir)
		cfg.Pod, cfg.NodeRank, cfg.MinNodes, cfg.MaxNodes = pod, rank, 1, 2
		cfg.RdzvBackend, cfg.RdzvEndpoint, cfg.TokenFile = "c10d", endpoint, tokenFile
		done := make(chan error, 1)
		go func() { done <- Run(t.Context(), cfg) }()
		return done, out
	}
	doneA, outA := run("pod-a", 0)
	waitFor(t, outA, "[default1]:helper envdump", 5*time.Second)
	doneB, outB := run("pod-b", 1)
	waitFor(t, outB, "[default1]:helper envdump", 5*time.Second)
	waitFor(t, outA, "attempt=2", 5*time.Second)
	deadline := time.Now().Add(5 * time.Second)
	for {
		files, _ := filepath.Glob(filepath.Join(dir, "*.json"))
		if len(files) >= 6 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	_ = os.WriteFile(filepath.Join(dir, "stop"), nil, 0o644)
	for _, d := range []chan error{doneA, doneB} {
		if err := <-d; err != nil {
			t.Fatalf("Run: %v\nA:\n%s\nB:\n%s", err, outA, outB)
		}
	}
	if !strings.Contains(outA.String(), "group_world_size=2") || strings.Contains(outA.String(), "restart_count=1") {
		t.Errorf("pod-a did not restart into a 2-node round for free:\n%s", outA)
	}
	// The env of the 2-node round: 4 distinct global ranks, one master.
	ranks := map[string]bool{}
	ports := map[string]bool{}
	var rank0 string
	for _, name := range []string{"pod-a-0", "pod-a-1", "pod-b-0", "pod-b-1"} {
		var env map[string]string
		data, err := os.ReadFile(filepath.Join(dir, name+"-gws2.json"))
		if err != nil {
			t.Fatal(err)
		}
		_ = json.Unmarshal(data, &env)
		if env["WORLD_SIZE"] != "4" || env["GROUP_WORLD_SIZE"] != "2" || env["TORCHELASTIC_RESTART_COUNT"] != "0" {
			t.Errorf("%s: WORLD_SIZE=%s GROUP_WORLD_SIZE=%s RESTART=%s", name, env["WORLD_SIZE"], env["GROUP_WORLD_SIZE"], env["TORCHELASTIC_RESTART_COUNT"])
		}
		ranks[env["RANK"]] = true
		if env["RANK"] == "0" {
			rank0 = env["MASTER_ADDR"] + ":" + env["MASTER_PORT"]
		} else {
			ports[env["MASTER_ADDR"]+":"+env["MASTER_PORT"]] = true
		}
	}
	// Global rank 0's store has a private port behind pod-a's store proxy.
	if len(ranks) != 4 || len(ports) != 1 || ports[rank0] || !strings.HasPrefix(rank0, "127.0.0.1:") {
		t.Errorf("ranks %v, masters %v, rank 0's %s", ranks, ports, rank0)
	}
}

var _ io.Writer = (*syncBuffer)(nil)

// Torchrun's static backend on two nodes without a master: node rank is the
// group rank, the workers meet at the given address; ranks follow.
func TestFixedRendezvousTwoNodes(t *testing.T) {
	dir := t.TempDir()
	port := 29999
	done := make(chan error, 2)
	outs := make([]*syncBuffer, 2)
	for rank := range 2 {
		cfg, out := helperConfig(t, 2, "envdump:"+dir)
		outs[rank] = out
		cfg.Pod, cfg.NodeRank, cfg.MinNodes, cfg.MaxNodes = fmt.Sprintf("job-worker-%d", rank), rank, 2, 2
		cfg.RdzvBackend, cfg.MasterAddr, cfg.MasterPort = "static", "job-worker-0", port
		go func() { done <- Run(t.Context(), cfg) }()
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		files, _ := filepath.Glob(filepath.Join(dir, "*.json"))
		if len(files) == 4 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	_ = os.WriteFile(filepath.Join(dir, "stop"), nil, 0o644)
	for range 2 {
		if err := <-done; err != nil {
			t.Fatalf("Run: %v\n%s\n%s", err, outs[0], outs[1])
		}
	}
	for node := range 2 {
		for local := range 2 {
			var env map[string]string
			data, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("job-worker-%d-%d-gws2.json", node, local)))
			if err != nil {
				t.Fatal(err)
			}
			_ = json.Unmarshal(data, &env)
			want := map[string]string{"RANK": strconv.Itoa(2*node + local), "GROUP_RANK": strconv.Itoa(node),
				"LOCAL_RANK": strconv.Itoa(local), "WORLD_SIZE": "4", "MASTER_ADDR": "job-worker-0", "MASTER_PORT": "29999",
				"_F_WN": fmt.Sprintf("job-worker-%d/%d", node, local), "_F_DES": "Earliest", "ROLE_NAME": "default"}
			if node == 0 && local == 0 {
				// Global rank 0's store binds a private port behind node 0's
				// store proxy, which listens on the operator's port.
				if env["MASTER_PORT"] == "" || env["MASTER_PORT"] == "29999" {
					t.Errorf("rank 0: MASTER_PORT=%q, want its private store port", env["MASTER_PORT"])
				}
				delete(want, "MASTER_PORT")
			}
			for k, v := range want {
				if env[k] != v {
					t.Errorf("node %d local %d: %s=%q, want %q", node, local, k, env[k], v)
				}
			}
		}
	}
}

// Config errors are clear and happen before anything starts.
func TestConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		mutate func(*Config)
		want   string
	}{
		{func(c *Config) { c.Command = nil }, "no worker command"},
		{func(c *Config) { c.NProcPerNode = 0 }, "--nproc-per-node"},
		{func(c *Config) { c.MinNodes, c.MaxNodes = 2, 1 }, "--nnodes"},
		{func(c *Config) { c.MinNodes, c.MaxNodes = 1, 4 }, "kfelastic master"},
		{func(c *Config) { c.MinNodes, c.MaxNodes, c.RdzvBackend, c.MasterAddr = 2, 2, "static", "" }, "--master-addr"},
	} {
		cfg, _ := helperConfig(t, 1, "ok")
		tc.mutate(&cfg)
		err := Run(t.Context(), cfg)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("err = %v, want one mentioning %q", err, tc.want)
		}
	}
}

// A worker that wrote its own document (flytekit, _F_DES set) is not
// documented twice; a failure that left none (a peer's or another pod's
// document does not count) gets the agent's.
func TestWorkerOwnDocument(t *testing.T) {
	dir := t.TempDir()
	cfg, out := helperConfig(t, 1, "flytedoc:"+dir)
	cfg.ErrorPrefix = "file://" + dir
	ee, _ := runAgent(t, t.Context(), cfg)
	if ee == nil || ee.Document != "error-0123456789abcdef0123456789abcdef.pb" {
		t.Fatalf("want flytekit's document reused, got %+v\n%s", ee, out)
	}
	if files, _ := filepath.Glob(filepath.Join(dir, "error-*.pb")); len(files) != 1 {
		t.Errorf("documents %v, want flytekit's only", files)
	}
	// Another pod's document in the same prefix does not stand in for ours.
	cfg2, out2 := helperConfig(t, 1, "exit:5")
	cfg2.ErrorPrefix, cfg2.Pod = "file://"+dir, "pod-1"
	ee, _ = runAgent(t, t.Context(), cfg2)
	if ee == nil || !strings.HasPrefix(ee.Document, "error-") || strings.Contains(ee.Document, "0123456789abcdef0123") {
		t.Fatalf("want a document of our own, got %+v\n%s", ee, out2)
	}
}

// A failure the agent recovered from no longer decides the task: flytekit's
// document of the failed attempt moves to superseded/ when the next group
// starts, so a job that then succeeds is not reported failed (and a
// recovered early failure cannot beat a later real root cause).
func TestRecoveredFailureSuperseded(t *testing.T) {
	dir := t.TempDir()
	cfg, out := helperConfig(t, 2, "flytedoc:"+dir+",hang;ok,ok")
	cfg.ErrorPrefix = "file://" + dir
	cfg.MaxRestarts = 1
	if ee, _ := runAgent(t, t.Context(), cfg); ee != nil {
		t.Fatalf("Run: %v\n%s", ee, out)
	}
	if files, _ := filepath.Glob(filepath.Join(dir, "error*.pb")); len(files) != 0 {
		t.Errorf("documents of a recovered failure still decide the task: %v\n%s", files, out)
	}
	if _, err := os.Stat(filepath.Join(dir, "superseded", "error-0123456789abcdef0123456789abcdef.pb")); err != nil {
		t.Errorf("the recovered failure's document was lost: %v\n%s", err, out)
	}
}

// readDocument decodes the error document the agent wrote under dir.
func readDocument(t *testing.T, dir, key string) kferrors.Failure {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, key))
	if err != nil {
		t.Fatalf("document %q: %v", key, err)
	}
	f, err := kferrors.DecodeFailure(data, 0)
	if err != nil {
		t.Fatalf("document %q: %v", key, err)
	}
	return f
}

// A prefix that cannot be opened is refused before any worker starts.
func TestBadErrorPrefixRefusedAtStart(t *testing.T) {
	for _, bad := range []string{"nosuch://bucket/prefix", "not a url"} {
		cfg, out := helperConfig(t, 1, "ok")
		cfg.ErrorPrefix = bad
		err := Run(t.Context(), cfg)
		if err == nil || !strings.Contains(err.Error(), "--error-prefix") {
			t.Errorf("%q: want a clear --error-prefix error, got %v", bad, err)
		}
		if strings.Contains(out.String(), "helper ok") {
			t.Errorf("%q: a worker ran with an unusable error prefix:\n%s", bad, out)
		}
	}
}

// Storage that fails when the pod's root cause is written does not lose it:
// the document is kept in the run's log folder, after the retries of
// StorageTimeout.
func TestErrorDocumentKeptLocallyWhenPrefixFails(t *testing.T) {
	prefix := filepath.Join(t.TempDir(), "outputs")
	cfg, out := helperConfig(t, 1, "breakprefix:"+prefix)
	cfg.ErrorPrefix = "file://" + prefix
	cfg.StorageTimeout = time.Second
	ee, _ := runAgent(t, t.Context(), cfg)
	if ee == nil || ee.Code != 1 || !strings.HasPrefix(ee.Document, cfg.LogDir) {
		t.Fatalf("want exit 1 with a local document under %s, got %+v\n%s", cfg.LogDir, ee, out)
	}
	f := readDocument(t, filepath.Dir(ee.Document), filepath.Base(ee.Document))
	if f.Code != kferrors.CodeNonZeroExit || f.Worker != "pod-0/0" {
		t.Errorf("local document = %+v", f)
	}
}

// A torch error file whose timestamp is in milliseconds (or beyond the year
// 9999) does not name the document by a wrapped-around time: the agent
// falls back to the observed exit time, and the reader ranks the document
// by it.
func TestTorchErrorTimestampValidated(t *testing.T) {
	for _, ts := range []string{strconv.FormatInt(time.Now().UnixMilli(), 10), "253402300800", "-3"} {
		cfg, out := helperConfig(t, 1, "torchts:"+ts)
		dir := t.TempDir()
		cfg.ErrorPrefix = "file://" + dir
		start := time.Now()
		ee, _ := runAgent(t, t.Context(), cfg)
		if ee == nil || ee.Failure.Code != "ValueError" {
			t.Fatalf("%s: want the ValueError, got %+v\n%s", ts, ee, out)
		}
		if ee.Failure.Time.Before(start) || ee.Failure.Time.After(time.Now()) {
			t.Errorf("%s: document time %v, want the observed exit in the run", ts, ee.Failure.Time)
		}
		keyTime, ok := kferrors.TimeFromKey(ee.Document)
		if !ok || !keyTime.Equal(ee.Failure.Time) {
			t.Errorf("%s: key %s does not carry the document's time", ts, ee.Document)
		}
		if got := readDocument(t, dir, ee.Document); !got.Time.Equal(ee.Failure.Time) {
			t.Errorf("%s: stored time %v", ts, got.Time)
		}
	}
}

// An error file of 300 MB is not read: the exit is documented with the
// reason, and the agent's memory does not follow the file.
func TestHugeErrorFileIsCapped(t *testing.T) {
	cfg, out := helperConfig(t, 1, "bigerror:300")
	ee, _ := runAgent(t, t.Context(), cfg)
	if ee == nil || ee.Failure.Code != kferrors.CodeNonZeroExit || !strings.Contains(ee.Failure.Message, "error file was not usable") ||
		!strings.Contains(ee.Failure.Message, "too large") {
		t.Fatalf("want a NonZeroExit naming the oversized error file, got %+v\n%s", ee, out)
	}
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	if ru.Maxrss > 250<<10 { // KiB
		t.Errorf("max RSS %d MiB after a 300 MB error file", ru.Maxrss>>10)
	}
}

// An S3 endpoint that accepts connections and never answers: the pod's
// document is kept locally and the agent exits within StorageTimeout (it
// used to wait 30 s, then write nowhere). The test bounds itself.
func TestErrorDocumentKeptLocallyWhenStorageIsSilent(t *testing.T) {
	silent := testenv.Silent(t)
	testenv.SetCredentialEnv()
	cfg, out := helperConfig(t, 1, "exit:3")
	cfg.ErrorPrefix = silent.URL("flyte", "metadata/attempt-0")
	cfg.StorageTimeout = 1500 * time.Millisecond
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	ee, took := runAgent(t, ctx, cfg)
	if ee == nil || ee.Code != 1 || !strings.HasPrefix(ee.Document, cfg.LogDir) {
		t.Fatalf("want exit 1 with a local document under %s, got %+v\n%s", cfg.LogDir, ee, out)
	}
	if f := readDocument(t, filepath.Dir(ee.Document), filepath.Base(ee.Document)); f.Code != kferrors.CodeNonZeroExit || f.Worker != "pod-0/0" {
		t.Errorf("local document = %+v", f)
	}
	if took > 5*time.Second {
		t.Errorf("agent took %v with a 1.5s storage timeout", took)
	}
}

// Storage that comes back while the agent still retries gets the document:
// the first attempts meet a silent endpoint, a later one MinIO, under the
// same key (one document, not two), and the local copy stays.
func TestErrorDocumentUploadRetried(t *testing.T) {
	minio := testenv.MinIO(t)
	silent := testenv.Silent(t)
	cfg, out := helperConfig(t, 1, "exit:3")
	cfg.ErrorPrefix = silent.URL(minio.Bucket, "metadata/attempt-0")
	cfg.StorageTimeout = 3 * time.Second
	go func() {
		waitFor(t, out, "error document not uploaded yet", 10*time.Second)
		silent.ForwardTo(minio.Endpoint)
	}()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	ee, _ := runAgent(t, ctx, cfg)
	if ee == nil || ee.Code != 1 || !strings.HasPrefix(ee.Document, "error-") {
		t.Fatalf("want the document uploaded after a retry, got %+v\n%s", ee, out)
	}
	b, err := kferrors.OpenPrefix(ctx, minio.MinIOProcess.URL(minio.Bucket, "metadata/attempt-0"), false)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	r, err := outputreader.Read(ctx, outputreader.NewBucketSource(b), nil)
	if err != nil || r.RootCause == nil || r.RootCause.Key != ee.Document || len(r.Others) != 0 || r.RootCause.Failure.Worker != "pod-0/0" {
		t.Fatalf("in MinIO: %+v, %v", r, err)
	}
	if local, _ := filepath.Glob(filepath.Join(cfg.LogDir, "*", ee.Document)); len(local) != 1 {
		t.Errorf("no local copy of %s under %s", ee.Document, cfg.LogDir)
	}
}

// runBounded runs the agent in the background and fails the test if it has
// not returned within limit (a deadlock must not stall the suite).
func runBounded(t *testing.T, ctx context.Context, cfg Config, limit time.Duration) (*ExitError, time.Duration) {
	t.Helper()
	type result struct {
		ee   *ExitError
		took time.Duration
	}
	done := make(chan result, 1)
	go func() {
		start := time.Now()
		err := Run(ctx, cfg)
		var ee *ExitError
		if err != nil && !errors.As(err, &ee) {
			t.Errorf("Run: %v", err)
		}
		done <- result{ee, time.Since(start)}
	}()
	select {
	case r := <-done:
		return r.ee, r.took
	case <-time.After(limit):
		t.Fatalf("Run still running after %v", limit)
		return nil, 0
	}
}

// Workers that cannot start, more of them than the loop's event queue
// holds, fail the pod with StartFailed; the agent used to deadlock on its
// own queue.
func TestManyStartFailuresDoNotDeadlock(t *testing.T) {
	cfg, out := helperConfig(t, 40, "ok")
	cfg.Command = []string{filepath.Join(t.TempDir(), "no-such-program")}
	ee, _ := runBounded(t, t.Context(), cfg, 20*time.Second)
	if ee == nil || ee.Code != 1 || ee.Failure.Code != "StartFailed" {
		t.Fatalf("want StartFailed, got %+v\n%s", ee, out)
	}
}

// A stop signal during the start of a large group ends the start: the rest
// is not started, the started are stopped, the pod is Preempted at once.
func TestStopInterruptsStart(t *testing.T) {
	cfg, out := helperConfig(t, MaxNProcPerNode, "ok")
	cfg.Command = []string{"/bin/sleep", "3600"}
	cfg.StopGrace = time.Second
	ctx, cancel := context.WithCancel(t.Context())
	go func() {
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			if dirs, _ := filepath.Glob(filepath.Join(cfg.LogDir, "test_*", "attempt_1", "0")); len(dirs) > 0 {
				break
			}
			time.Sleep(time.Millisecond)
		}
		cancel()
	}()
	ee, took := runBounded(t, ctx, cfg, 30*time.Second)
	if ee == nil || ee.Code != 143 || ee.Failure.Code != kferrors.CodePreempted {
		t.Fatalf("want Preempted, got %+v\n%s", ee, out)
	}
	started, _ := filepath.Glob(filepath.Join(cfg.LogDir, "test_*", "attempt_1", "*"))
	if len(started) >= MaxNProcPerNode {
		t.Errorf("all %d workers started before the stop (took %v)", len(started), took)
	}
	t.Logf("%d of %d workers started; agent done in %v", len(started), MaxNProcPerNode, took)
}

// The agent's own lines (its log, the rendezvous block, its error) show
// pod names, addresses and messages with control characters escaped; only
// the workers' own output, teed, passes as it is.
func TestAgentLinesEscapeControlCharacters(t *testing.T) {
	cfg, out := helperConfig(t, 1, "torcherr:Bad\x1b[2J\x1b[H")
	cfg.Pod = "pod\x1b]0;pwned\x07\n*fake"
	cfg.MasterAddr = "127.0.0.1\x1b[1A"
	ee, _ := runAgent(t, t.Context(), cfg)
	if ee == nil {
		t.Fatalf("want a failure\n%s", out)
	}
	for _, line := range strings.Split(out.String(), "\n") {
		if !strings.HasPrefix(line, "[default0]:") && strings.ContainsAny(line, "\x1b\x07") {
			t.Errorf("raw control character in %q", line)
		}
	}
	if msg := termsafe.Text(ee.Error()); strings.ContainsAny(msg, "\x1b\x07") {
		t.Errorf("error as printed: %q", msg)
	}
}

// A progress file dated in the future does not switch the watchdog off.
func TestHangWatchdogProgressFileInTheFuture(t *testing.T) {
	cfg, out := helperConfig(t, 1, "futuretouch")
	cfg.HangTimeout = 500 * time.Millisecond
	ee, took := runBounded(t, t.Context(), cfg, 20*time.Second)
	if ee == nil || ee.Failure.Code != kferrors.CodeHang || took > 5*time.Second {
		t.Fatalf("want Hang within seconds, got %+v after %v\n%s", ee, took, out)
	}
}

// storePoll plays torch's elastic agent under --launcher command: a store
// client on PET_RDZV_ENDPOINT (the agent's relay) that reads c10d's state
// every 20 ms, as torch's monitor loop does, and fails as torch does when
// the store fails it: a traceback and exit 1.
func storePoll() int {
	c, err := net.Dial("tcp", os.Getenv("PET_RDZV_ENDPOINT"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "torch.distributed.DistStoreError:", err)
		return 1
	}
	r := bufio.NewReader(c)
	call := func(req tcpstore.Request, reply int) error {
		b, _ := tcpstore.AppendRequest(nil, tcpstore.Torch113, req)
		if _, err := c.Write(b); err != nil {
			return err
		}
		_, err := io.ReadFull(r, make([]byte, reply))
		return err
	}
	if err := call(tcpstore.Request{Cmd: tcpstore.Add, Key: "/torch.rendezvous.poll", Delta: 1}, 8); err != nil {
		fmt.Fprintln(os.Stderr, "torch.distributed.DistStoreError:", err)
		return 1
	}
	fmt.Println("helper storepoll connected")
	for {
		if err := call(tcpstore.Request{Cmd: tcpstore.Add, Key: "/torch.rendezvous.poll", Delta: 0}, 8); err != nil {
			fmt.Fprintln(os.Stderr, "Traceback (most recent call last):\ntorch.distributed.DistNetworkError: Connection reset by peer:", err)
			return 1
		}
		time.Sleep(20 * time.Millisecond)
	}
}

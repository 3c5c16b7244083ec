// Command store-bench measures the agent's store relay (agent/storerelay)
// beside torch's own TCPStore, in one run on this machine:
//
//   - rendezvous: torch elastic's c10d rendezvous of -n real torch agents
//     (python processes, each a DynamicRendezvousHandler), timed from "every
//     agent starts its rendezvous" to "every agent has its rank", once with
//     each agent pointed at its own relay (one gRPC connection each, as one
//     agent per pod has) to a `kfelastic master` process with a file://
//     state, and once with torch's layout: the first agent hosts the
//     TCPStore (is_host) and the others connect to it;
//   - per operation: latency of set, get and add from one torch client,
//     through a relay and against torch's own store server.
//
// Run it with `make bench-store` (needs bin/kfelastic and a python with
// torch; -python picks it: scripts/torch2.14/python3 runs torch 2.14, from
// the root `scripts/deps.sh torch2` builds).
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kfelastic/kfelastic/agent"
	"github.com/kfelastic/kfelastic/agent/storerelay"
)

var (
	kfelastic = flag.String("kfelastic", "bin/kfelastic", "the kfelastic binary (its master)")
	python    = flag.String("python", "/usr/bin/python3", "a python with torch")
	sizes     = flag.String("n", "2,4,8", "torch agent counts")
	runs      = flag.Int("runs", 3, "rendezvous per size and side (the median is printed)")
	ops       = flag.Int("ops", 2000, "operations per kind for the latency")
)

// pythonCmd runs -python with args.
func pythonCmd(args ...string) *exec.Cmd { return exec.Command(*python, args...) }

const token = "bench-token"

func main() {
	flag.Parse()
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "bench-store:", err)
		os.Exit(1)
	}
}

func run() error {
	dir, err := os.MkdirTemp("", "bench-store")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	ctx := context.Background()
	addr, stop, err := startMaster(dir)
	if err != nil {
		return err
	}
	defer stop()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	relay := func() (string, func(), error) {
		m, err := agent.DialMaster(agent.MasterConfig{Endpoint: addr, Token: token, Logger: quiet})
		if err != nil {
			return "", nil, err
		}
		r, err := storerelay.Start(ctx, m.Client(), m.Incarnation(), quiet)
		if err != nil {
			m.Close()
			return "", nil, err
		}
		return r.Addr(), func() { r.Close(); m.Close() }, nil
	}

	who := *python
	fmt.Printf("torch c10d rendezvous (%s), median of %d, from every agent starting to the last one ranked:\n", who, *runs)
	fmt.Printf("%-8s %18s %18s %14s\n", "agents", "torch's TCPStore", "relay + master", "torch ÷ ours")
	for _, f := range strings.Split(*sizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return fmt.Errorf("-n: %q", f)
		}
		var theirs, ours []time.Duration
		for i := range *runs {
			port, err := freePort()
			if err != nil {
				return err
			}
			endpoints := slices.Repeat([]string{fmt.Sprintf("127.0.0.1:%d", port)}, n)
			d, err := rendezvous(endpoints, true, fmt.Sprintf("torch-%d-%d", n, i))
			if err != nil {
				return fmt.Errorf("torch's store, %d agents: %w", n, err)
			}
			theirs = append(theirs, d)
			var closers []func()
			endpoints = endpoints[:0]
			for range n {
				a, closeRelay, err := relay()
				if err != nil {
					return err
				}
				endpoints, closers = append(endpoints, a), append(closers, closeRelay)
			}
			d, err = rendezvous(endpoints, false, fmt.Sprintf("relay-%d-%d", n, i))
			for _, c := range closers {
				c()
			}
			if err != nil {
				return fmt.Errorf("relay, %d agents: %w", n, err)
			}
			ours = append(ours, d)
		}
		t, o := median(theirs), median(ours)
		fmt.Printf("%-8d %18s %18s %13.2fx\n", n, t.Round(time.Millisecond), o.Round(time.Millisecond), float64(t)/float64(o))
	}

	a, closeRelay, err := relay()
	if err != nil {
		return err
	}
	defer closeRelay()
	port, err := freePort()
	if err != nil {
		return err
	}
	theirs, err := latency(fmt.Sprintf("127.0.0.1:%d", port), true)
	if err != nil {
		return fmt.Errorf("torch's store: %w", err)
	}
	ours, err := latency(a, false)
	if err != nil {
		return fmt.Errorf("relay: %w", err)
	}
	fmt.Printf("\none torch client, %d operations per kind, mean (p99) in µs; a set has no reply (the client's write),\n"+
		"a get is WAIT + GET (two round trips), an add is answered once durable in the master's state:\n", *ops)
	fmt.Printf("%-6s %20s %20s %14s\n", "op", "torch's TCPStore", "relay + master", "torch ÷ ours")
	for _, op := range []string{"set", "get", "add"} {
		t, o := theirs[op], ours[op]
		fmt.Printf("%-6s %20s %20s %13.2fx\n", op, t.String(), o.String(), t.mean/o.mean)
	}
	return nil
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// startMaster runs `kfelastic master` on loopback with a file:// state.
func startMaster(dir string) (addr string, stop func(), err error) {
	port, err := freePort()
	if err != nil {
		return "", nil, err
	}
	addr = fmt.Sprintf("127.0.0.1:%d", port)
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte(token), 0o600); err != nil {
		return "", nil, err
	}
	logf, err := os.Create(filepath.Join(dir, "master.log"))
	if err != nil {
		return "", nil, err
	}
	cmd := exec.Command(*kfelastic, "master", "--listen", addr, "--nnodes", "1:1", "--rdzv-id", "bench-store",
		"--token-file", tokenFile, "--state", "file://"+filepath.Join(dir, "state"))
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return "", nil, err
	}
	stop = func() { cmd.Process.Kill(); cmd.Wait(); logf.Close() }
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond); err == nil {
			c.Close()
			return addr, stop, nil
		}
		if time.Now().After(deadline) {
			stop()
			return "", nil, fmt.Errorf("the master did not listen on %s (its log: %s)", addr, logf.Name())
		}
	}
}

// rdzvScript is one torch agent's rendezvous: it builds its handler (the
// store connection), says "ready", on a line on stdin runs the round, and
// stays until stdin ends (a hosting agent's store must outlive the round).
const rdzvScript = `
import sys, time
from torch.distributed.elastic.rendezvous import RendezvousParameters
from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler
endpoint, n, run_id, is_host = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4] == "1"
params = RendezvousParameters(backend="c10d", endpoint=endpoint, run_id=run_id, min_nodes=n, max_nodes=n,
                              is_host=is_host, join_timeout=600)
handler = get_rendezvous_handler(params)
print("ready", flush=True)
sys.stdin.readline()
r = handler.next_rendezvous()
rank = r[1] if isinstance(r, tuple) else r.rank
print("done %d %.6f" % (rank, time.time()), flush=True)
sys.stdin.readline()  # the host's store serves until every agent is done
`

// rendezvous runs one agent per endpoint; with torchHost the first hosts
// torch's store there and starts before the others. Python's start and
// torch's import are not timed: the clock starts once every agent is ready.
func rendezvous(endpoints []string, torchHost bool, runID string) (time.Duration, error) {
	type proc struct {
		cmd    *exec.Cmd
		in     io.WriteCloser
		out    *bufio.Reader
		stderr *strings.Builder
	}
	procs := make([]proc, 0, len(endpoints))
	defer func() {
		for _, p := range procs {
			p.cmd.Process.Kill()
			p.cmd.Wait()
		}
	}()
	for i, ep := range endpoints {
		host := "0"
		if torchHost && i == 0 {
			host = "1"
		}
		cmd := pythonCmd("-c", rdzvScript, ep, strconv.Itoa(len(endpoints)), runID, host)
		cmd.Env = append(cmd.Environ(), "OMP_NUM_THREADS=1")
		stderr := &strings.Builder{}
		cmd.Stderr = stderr
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		in, _ := cmd.StdinPipe()
		out, _ := cmd.StdoutPipe()
		if err := cmd.Start(); err != nil {
			return 0, err
		}
		procs = append(procs, proc{cmd, in, bufio.NewReader(out), stderr})
		if torchHost && i == 0 {
			if err := expect(procs[0].out, "ready"); err != nil { // its store is up
				return 0, fmt.Errorf("the host agent: %w\n%s", err, procs[0].stderr)
			}
		}
	}
	for i, p := range procs {
		if torchHost && i == 0 {
			continue
		}
		if err := expect(p.out, "ready"); err != nil {
			return 0, fmt.Errorf("agent %d: %w\n%s", i, err, p.stderr)
		}
	}
	t0 := time.Now()
	for _, p := range procs {
		io.WriteString(p.in, "go\n")
	}
	var last float64
	for i, p := range procs {
		l, err := p.out.ReadString('\n')
		f := strings.Fields(l)
		if err != nil || len(f) != 3 || f[0] != "done" {
			return 0, fmt.Errorf("agent %d: %q %v\n%s", i, l, err, p.stderr)
		}
		at, _ := strconv.ParseFloat(f[2], 64)
		last = max(last, at)
	}
	return time.Unix(0, int64(last*1e9)).Sub(t0), nil
}

func expect(r *bufio.Reader, want string) error {
	l, err := r.ReadString('\n')
	if err != nil || strings.TrimSpace(l) != want {
		return fmt.Errorf("said %q, not %q (%v)", l, want, err)
	}
	return nil
}

// latencyScript times set, get and add from one client; with host it also
// hosts torch's store (the master TCPStore's own client connection).
const latencyScript = `
import sys, time
from datetime import timedelta
import torch.distributed as dist
host, port, is_host, n = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1", int(sys.argv[4])
s = dist.TCPStore(host, port, None, is_host, timedelta(seconds=60), wait_for_workers=False)
v = b"x" * 64
s.set("k", v)
ops = {"set": lambda i: s.set("k", v), "get": lambda i: s.get("k"), "add": lambda i: s.add("n", 1)}
for name, op in ops.items():
    ts = []
    for i in range(n):
        t = time.perf_counter()
        op(i)
        ts.append(time.perf_counter() - t)
    ts.sort()
    print(name, sum(ts) / n * 1e6, ts[int(n * 0.99)] * 1e6, flush=True)
`

type opTime struct{ mean, p99 float64 }

func (t opTime) String() string { return fmt.Sprintf("%.0f (%.0f)", t.mean, t.p99) }

func latency(endpoint string, torchHost bool) (map[string]opTime, error) {
	host, port, _ := net.SplitHostPort(endpoint)
	h := "0"
	if torchHost {
		h = "1"
	}
	out, err := pythonCmd("-c", latencyScript, host, port, h, strconv.Itoa(*ops)).Output()
	if err != nil {
		return nil, fmt.Errorf("%w: %s", err, out)
	}
	res := map[string]opTime{}
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(l)
		if len(f) != 3 {
			return nil, fmt.Errorf("latency: %q", l)
		}
		mean, _ := strconv.ParseFloat(f[1], 64)
		p99, _ := strconv.ParseFloat(f[2], 64)
		res[f[0]] = opTime{mean, p99}
	}
	return res, nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

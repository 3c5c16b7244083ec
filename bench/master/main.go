// Command master-bench measures the kfelastic master beside torch's own
// elastic rendezvous and store, in one run on this machine:
//
//   - rendezvous: time from "every agent starts joining" to "every agent
//     has its round", and the master's peak RSS (VmHWM), for -n simulated
//     agents (goroutines, one gRPC connection each) against a real
//     `kfelastic master` process with a file:// state; beside it, at the
//     -torch-n sizes this machine can hold, the same count of real torch
//     elastic agents (python3 processes, each a DynamicRendezvousHandler on
//     the c10d backend, the store hosted by a separate TCPStore process)
//     and ours at that same count;
//   - store: p50/p99 latency and throughput of set/get/add/compare_set from
//     1 and 16 concurrent clients (-clients), against the master (durable:
//     file:// state; and mem://) and against torch's TCPStore server
//     (python3 TCPStore(is_master=True)), both driven by Go clients (ours
//     the agent's own gRPC client, as its store relay uses it; torch's in
//     its 1.13 wire protocol), so that the client language is the same on
//     both sides; with each side's CPU time per operation and, for the
//     master, the operations per state write (group commit). One client is
//     what a single torch worker waits for; 16 share this machine's cores
//     with the server, so their latency includes waiting for a core.
//
// With -v, the rendezvous rows also say where the master's memory goes:
// its heap and stacks when every agent is connected and idle, and the
// peaks sampled through the run.
//
// Run it with `make bench-master` (needs bin/kfelastic and /usr/bin/python3
// with torch: scripts/deps.sh apt).
package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kfelastic/kfelastic/agent"
	"github.com/kfelastic/kfelastic/agent/tcpstore"
	"github.com/kfelastic/kfelastic/api/masterpb"
)

var (
	binary_  = flag.String("kfelastic", "bin/kfelastic", "the kfelastic binary")
	python   = flag.String("python", "/usr/bin/python3", "the Python whose torch is the anchor (Debian's 1.13; any torch 1.13 or 2.x)")
	sizes    = flag.String("n", "100,1000,10000", "simulated agent counts")
	torchN   = flag.String("torch-n", "4,8,16", "agent counts for torch's c10d rendezvous (real python3 agents) and ours beside it")
	clients  = flag.String("clients", "1,16", "concurrent store client counts: one table each")
	ops      = flag.Int("ops", 2000, "store operations per client and kind")
	kinds    = flag.String("kinds", "set,get,add,compare_set", "store operations to measure, in order")
	verbose  = flag.Bool("v", false, "also print the master's memory breakdown")
	mflags   = flag.String("master-flags", "", "more flags for every `kfelastic master` it starts, space-separated (e.g. \"--transport http2\")")
	attacks_ = flag.Bool("attacks", false, "run only the attack table (both transports): the master's RSS under each attack beside idle, honest clients served throughout")
)

const token = "bench-token"

func main() {
	flag.Parse()
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "bench-master:", err)
		os.Exit(1)
	}
}

func run() error {
	if *attacks_ {
		return runAttacks()
	}
	for _, p := range []string{*binary_, *python} {
		if _, err := os.Stat(p); err != nil {
			return fmt.Errorf("%v (make build; scripts/deps.sh apt)", err)
		}
	}
	if err := detectTorch(); err != nil {
		return err
	}
	dir, tokenFile, cleanup, err := workDir()
	if err != nil {
		return err
	}
	defer cleanup()
	fmt.Printf("bench-master: %d CPUs; kfelastic master with file:// state on local disk", numCPU())
	if *mflags != "" {
		fmt.Printf("; master flags %q", *mflags)
	}
	fmt.Print("\n\n")

	fmt.Println("Rendezvous: all agents start joining → all have their round")
	fmt.Printf("%-28s %8s %14s %14s\n", "", "agents", "completion", "master RSS")
	for _, n := range ints(*sizes) {
		d, rss, err := oursRendezvous(dir, tokenFile, n, 1)
		if err != nil {
			return fmt.Errorf("ours at %d: %w", n, err)
		}
		fmt.Printf("%-28s %8d %14s %11.1f MiB\n", "kfelastic master (gRPC)", n, d.Round(time.Microsecond), float64(rss)/(1<<20))
	}
	fmt.Println()
	fmt.Println("At equal N, beside torch's c10d rendezvous (real torch elastic agents, one python3 process each):")
	fmt.Printf("%-8s %16s %16s %10s\n", "agents", "torch c10d", "kfelastic", "ratio")
	for _, n := range ints(*torchN) {
		td, err := torchRendezvous(dir, n)
		if err != nil {
			return fmt.Errorf("torch at %d: %w", n, err)
		}
		od, _, err := oursRendezvous(dir, tokenFile, n, 1)
		if err != nil {
			return fmt.Errorf("ours at %d: %w", n, err)
		}
		fmt.Printf("%-8d %16s %16s %9.1fx\n", n, td.Round(time.Millisecond), od.Round(time.Microsecond), td.Seconds()/od.Seconds())
	}
	fmt.Println()
	return storeBench(dir, tokenFile)
}

// runAttacks is the attack table alone: no torch needed.
func runAttacks() error {
	if _, err := os.Stat(*binary_); err != nil {
		return fmt.Errorf("%v (make build)", err)
	}
	dir, tokenFile, cleanup, err := workDir()
	if err != nil {
		return err
	}
	defer cleanup()
	fmt.Printf("bench-master -attacks: %d CPUs\n\n", numCPU())
	return attackTable(dir, tokenFile)
}

// workDir raises the file limit and makes the run's folder with the job's
// token file in it; cleanup removes it.
func workDir() (dir, tokenFile string, cleanup func(), err error) {
	raiseFDLimit()
	if dir, err = os.MkdirTemp("", "bench-master-"); err != nil {
		return "", "", nil, err
	}
	tokenFile = filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte(token), 0o600); err != nil {
		os.RemoveAll(dir)
		return "", "", nil, err
	}
	return dir, tokenFile, func() { os.RemoveAll(dir) }, nil
}

// ---- the master process ----

type masterProc struct {
	cmd     *exec.Cmd
	addr    string
	metrics string
}

func startMaster(dir, tokenFile, state string, n int) (*masterProc, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	mport, err := freePort()
	if err != nil {
		return nil, err
	}
	metrics := fmt.Sprintf("127.0.0.1:%d", mport)
	cmd := exec.Command(*binary_, "master", "--listen", addr, "--metrics-listen", metrics, "--nnodes", fmt.Sprintf("%d:%d", n, n), "--rdzv-id", "bench",
		"--token-file", tokenFile, "--state", state, "--heartbeat-interval", "60s", "--heartbeat-timeout", "600s",
		"--waiting-timeout", "600s")
	cmd.Args = append(cmd.Args, strings.Fields(*mflags)...)
	logf, err := os.Create(filepath.Join(dir, "master.log"))
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond)
		if err == nil {
			c.Close()
			return &masterProc{cmd: cmd, addr: addr, metrics: metrics}, nil
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			cmd.Wait()
			return nil, fmt.Errorf("master did not listen on %s (see %s)", addr, logf.Name())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// scrape reads the master's metrics (name → value, unlabelled ones).
func (m *masterProc) scrape() map[string]float64 {
	out := map[string]float64{}
	res, err := http.Get("http://" + m.metrics + "/metrics")
	if err != nil {
		return out
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	for _, l := range strings.Split(string(body), "\n") {
		if f := strings.Fields(l); len(f) == 2 && !strings.HasPrefix(f[0], "#") {
			v, _ := strconv.ParseFloat(f[1], 64)
			out[f[0]] = v
		}
	}
	return out
}

// memory is the master's own account of its memory (Go runtime metrics):
// heap in use, goroutine stacks, goroutines.
func (m *masterProc) memory() string {
	v := m.scrape()
	return fmt.Sprintf("heap %.0f MiB, stacks %.0f MiB, %0.f goroutines", v["go_memstats_heap_inuse_bytes"]/(1<<20),
		v["go_memstats_stack_inuse_bytes"]/(1<<20), v["go_goroutines"])
}

// memoryPeaks samples the master's RSS and runtime metrics until ctx ends,
// and returns the peak of each: where the peak RSS comes from.
func (m *masterProc) memoryPeaks(ctx context.Context) <-chan string {
	out := make(chan string, 1)
	go func() {
		var rss, heap, stacks, goroutines float64
		for {
			v := m.scrape()
			rss = max(rss, float64(vmRSS(m.cmd.Process.Pid)))
			heap = max(heap, v["go_memstats_heap_inuse_bytes"])
			stacks = max(stacks, v["go_memstats_stack_inuse_bytes"])
			goroutines = max(goroutines, v["go_goroutines"])
			select {
			case <-ctx.Done():
				out <- fmt.Sprintf("peaks sampled: RSS %.0f MiB, heap in use %.0f MiB, stacks %.0f MiB, %.0f goroutines",
					rss/(1<<20), heap/(1<<20), stacks/(1<<20), goroutines)
				return
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()
	return out
}

func (m *masterProc) stop() int64 {
	rss := vmHWM(m.cmd.Process.Pid)
	m.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { m.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		m.cmd.Process.Kill()
		<-done
	}
	return rss
}

type bearer string

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}
func (bearer) RequireTransportSecurity() bool { return false }

func dial(addr string) (*grpc.ClientConn, error) {
	return grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithPerRPCCredentials(bearer(token)),
		grpc.WithReadBufferSize(4<<10), grpc.WithWriteBufferSize(4<<10))
}

// oursRendezvous runs n simulated agents (perConn per connection) through
// one round against a fresh master process.
func oursRendezvous(dir, tokenFile string, n, perConn int) (time.Duration, int64, error) {
	state := "file://" + filepath.Join(dir, fmt.Sprintf("state-%d-%d", n, time.Now().UnixNano()))
	m, err := startMaster(dir, tokenFile, state, n)
	if err != nil {
		return 0, 0, err
	}
	var peaks <-chan string
	sampling, stopSampling := context.WithCancel(context.Background())
	defer stopSampling()
	if *verbose {
		peaks = m.memoryPeaks(sampling)
	}
	var conns []*grpc.ClientConn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	clients := make([]masterpb.MasterClient, (n+perConn-1)/perConn)
	for i := range clients {
		c, err := dial(m.addr)
		if err != nil {
			m.stop()
			return 0, 0, err
		}
		c.Connect()
		conns = append(conns, c)
		clients[i] = masterpb.NewMasterClient(c)
	}
	// Every connection is up before the clock starts.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	for _, c := range clients {
		if _, err := c.Status(ctx, &masterpb.StatusRequest{}); err != nil {
			m.stop()
			return 0, 0, err
		}
	}
	if *verbose {
		fmt.Printf("    (master at %d agents, connected and idle: %s)\n", n, m.memory())
	}
	var wg sync.WaitGroup
	start := make(chan struct{})
	done := make([]time.Time, n)
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			node := &masterpb.Node{Pod: fmt.Sprintf("bench-worker-%d", i), Incarnation: "1", Rank: int32(i), LocalWorldSize: 8,
				Addr: "10.0.0.1", Port: 29500}
			c := clients[i/perConn]
			<-start
			for {
				res, err := c.Join(ctx, &masterpb.JoinRequest{Node: node, WaitMs: 60000})
				if err != nil {
					errs <- err
					return
				}
				if res.GetRound() != nil {
					done[i] = time.Now()
					return
				}
			}
		}()
	}
	t0 := time.Now()
	close(start)
	wg.Wait()
	if *verbose {
		fmt.Printf("    (master at %d agents, all answered: %s)\n", n, m.memory())
		if p := os.Getenv("KFELASTIC_PPROF_OUT"); p != "" {
			if res, err := http.Get("http://" + m.metrics + "/debug/pprof/heap?gc=1"); err == nil {
				f, _ := os.Create(p)
				io.Copy(f, res.Body)
				f.Close()
				res.Body.Close()
			}
		}
	}
	if peaks != nil {
		stopSampling()
		fmt.Printf("    (%s)\n", <-peaks)
	}
	rss := m.stop()
	select {
	case err := <-errs:
		return 0, 0, err
	default:
	}
	last := slices.MaxFunc(done, func(a, b time.Time) int { return a.Compare(b) })
	return last.Sub(t0), rss, nil
}

// ---- torch's c10d rendezvous ----

const torchStoreScript = `
import sys, time
from datetime import timedelta
from torch.distributed import TCPStore
s = TCPStore("127.0.0.1", int(sys.argv[1]), None, True, timedelta(seconds=300), wait_for_workers=False)
print("store ready", flush=True)
time.sleep(3600)
`

const torchAgentScript = `
import os, sys, time
from torch.distributed.elastic.rendezvous import RendezvousParameters
from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler
endpoint, n, go, run_id = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
params = RendezvousParameters(backend="c10d", endpoint=endpoint, run_id=run_id, min_nodes=n, max_nodes=n,
                              is_host=False, join_timeout=600)
handler = get_rendezvous_handler(params)
print("ready", flush=True)
while not os.path.exists(go):
    time.sleep(0.001)
info = handler.next_rendezvous()
rank, world = (info[1], info[2]) if isinstance(info, tuple) else (info.rank, info.world_size)
print("done %d %d %.6f" % (rank, world, time.time()), flush=True)
`

func torchRendezvous(dir string, n int) (time.Duration, error) {
	port, err := freePort()
	if err != nil {
		return 0, err
	}
	storeCmd := exec.Command(*python, "-c", torchStoreScript, strconv.Itoa(port))
	storeOut, _ := storeCmd.StdoutPipe()
	storeCmd.Stderr = os.Stderr
	storeCmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := storeCmd.Start(); err != nil {
		return 0, err
	}
	defer func() { storeCmd.Process.Kill(); storeCmd.Wait() }()
	if _, err := bufio.NewReader(storeOut).ReadString('\n'); err != nil {
		return 0, fmt.Errorf("torch store: %w", err)
	}
	goFile := filepath.Join(dir, fmt.Sprintf("go-%d-%d", n, time.Now().UnixNano()))
	runID := fmt.Sprintf("bench%d", time.Now().UnixNano())
	type agent struct {
		cmd *exec.Cmd
		out *bufio.Reader
	}
	agents := make([]agent, n)
	defer func() {
		for _, a := range agents {
			if a.cmd != nil && a.cmd.Process != nil {
				a.cmd.Process.Kill()
				a.cmd.Wait()
			}
		}
	}()
	for i := range agents {
		cmd := exec.Command(*python, "-c", torchAgentScript, fmt.Sprintf("127.0.0.1:%d", port), strconv.Itoa(n), goFile, runID)
		out, _ := cmd.StdoutPipe()
		cmd.Stderr = io.Discard
		cmd.Env = append(os.Environ(), "OMP_NUM_THREADS=1")
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			return 0, err
		}
		agents[i] = agent{cmd, bufio.NewReader(out)}
	}
	// Python and torch's imports are not the rendezvous: wait for every
	// agent to be ready (its store connection made) before the clock.
	for i, a := range agents {
		if l, err := a.out.ReadString('\n'); err != nil || !strings.HasPrefix(l, "ready") {
			return 0, fmt.Errorf("torch agent %d did not get ready: %q %v", i, l, err)
		}
	}
	t0 := time.Now()
	if err := os.WriteFile(goFile, nil, 0o644); err != nil {
		return 0, err
	}
	var last float64
	for i, a := range agents {
		l, err := a.out.ReadString('\n')
		f := strings.Fields(l)
		if err != nil || len(f) != 4 || f[0] != "done" {
			return 0, fmt.Errorf("torch agent %d: %q %v", i, l, err)
		}
		at, _ := strconv.ParseFloat(f[3], 64)
		last = max(last, at)
	}
	end := time.Unix(0, int64(last*1e9))
	return end.Sub(t0), nil
}

// ---- store ----

type storeClient interface {
	set(key string, v []byte) error
	get(key string) ([]byte, error)
	add(key string, d int64) (int64, error)
	compareSet(key string, expected, desired []byte) ([]byte, error)
	close()
}

type grpcStore struct {
	m      *agent.Master
	c      masterpb.MasterClient
	client string
	seq    uint64
}

func (g *grpcStore) do(req *masterpb.StoreRequest) (*masterpb.StoreResponse, error) {
	req.Client = g.client
	g.seq++
	req.Seq = g.seq
	return g.c.Store(context.Background(), req)
}

func (g *grpcStore) set(key string, v []byte) error {
	_, err := g.do(&masterpb.StoreRequest{Op: &masterpb.StoreRequest_Set{Set: &masterpb.StoreSet{Key: key, Value: v}}})
	return err
}
func (g *grpcStore) get(key string) ([]byte, error) {
	r, err := g.c.Store(context.Background(), &masterpb.StoreRequest{Op: &masterpb.StoreRequest_Get{Get: &masterpb.StoreGet{Key: key}}})
	return r.GetValue(), err
}
func (g *grpcStore) add(key string, d int64) (int64, error) {
	r, err := g.do(&masterpb.StoreRequest{Op: &masterpb.StoreRequest_Add{Add: &masterpb.StoreAdd{Key: key, Delta: d}}})
	return r.GetNumber(), err
}
func (g *grpcStore) compareSet(key string, e, d []byte) ([]byte, error) {
	r, err := g.do(&masterpb.StoreRequest{Op: &masterpb.StoreRequest_CompareSet{CompareSet: &masterpb.StoreCompareSet{Key: key, Expected: e, Desired: d}}})
	return r.GetValue(), err
}
func (g *grpcStore) close() { g.m.Close() }

// torchVersion is the anchor's torch ("1.13.0", "2.11.0+cu130") and
// storeNumbering the TCPStore commands its server speaks (TORCH-STORE.md).
var (
	torchVersion   string
	storeNumbering tcpstore.Numbering
)

func detectTorch() error {
	out, err := exec.Command(*python, "-c", "import torch; print(torch.__version__)").Output()
	if err != nil {
		return fmt.Errorf("%s cannot import torch: %v (scripts/deps.sh apt)", *python, err)
	}
	torchVersion = strings.TrimSpace(string(out))
	var major, minor int
	if _, err := fmt.Sscanf(torchVersion, "%d.%d", &major, &minor); err != nil {
		return fmt.Errorf("torch version %q: %v", torchVersion, err)
	}
	switch {
	case major < 2 || minor == 0 && major == 2:
		storeNumbering = tcpstore.Torch113
	case major == 2 && minor == 1:
		storeNumbering = tcpstore.Torch21
	default:
		storeNumbering = tcpstore.Torch22
	}
	return nil
}

// tcpStore is a client of torch's TCPStore server in the anchor's
// numbering (tcpstore.AppendRequest): u64-length-prefixed strings,
// little-endian integers, a VALIDATE handshake from 2.2.
type tcpStore struct {
	conn net.Conn
	r    *bufio.Reader
	buf  []byte
}

func dialTCPStore(addr string) (*tcpStore, error) {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	c.(*net.TCPConn).SetNoDelay(true)
	t := &tcpStore{conn: c, r: bufio.NewReader(c)}
	if storeNumbering == tcpstore.Torch22 {
		if err := t.send(tcpstore.Request{Cmd: tcpstore.Validate, Number: 0x3C85F7CE}); err != nil {
			c.Close()
			return nil, err
		}
	}
	return t, nil
}

func (t *tcpStore) send(req tcpstore.Request) error {
	var err error
	if t.buf, err = tcpstore.AppendRequest(t.buf[:0], storeNumbering, req); err != nil {
		return err
	}
	_, err = t.conn.Write(t.buf)
	return err
}

func (t *tcpStore) readBytes() ([]byte, error) {
	var n [8]byte
	if _, err := io.ReadFull(t.r, n[:]); err != nil {
		return nil, err
	}
	l := binary.LittleEndian.Uint64(n[:])
	if l > 1<<30 {
		return nil, errors.New("oversized reply")
	}
	b := make([]byte, l)
	_, err := io.ReadFull(t.r, b)
	return b, err
}

func (t *tcpStore) set(key string, v []byte) error {
	return t.send(tcpstore.Request{Cmd: tcpstore.Set, Key: key, Value: v}) // no reply in the protocol
}
func (t *tcpStore) get(key string) ([]byte, error) {
	if err := t.send(tcpstore.Request{Cmd: tcpstore.Get, Key: key}); err != nil {
		return nil, err
	}
	return t.readBytes()
}
func (t *tcpStore) add(key string, d int64) (int64, error) {
	if err := t.send(tcpstore.Request{Cmd: tcpstore.Add, Key: key, Delta: d}); err != nil {
		return 0, err
	}
	var n [8]byte
	if _, err := io.ReadFull(t.r, n[:]); err != nil {
		return 0, err
	}
	return int64(binary.LittleEndian.Uint64(n[:])), nil
}
func (t *tcpStore) compareSet(key string, e, d []byte) ([]byte, error) {
	if err := t.send(tcpstore.Request{Cmd: tcpstore.CompareSet, Key: key, Expected: e, Value: d}); err != nil {
		return nil, err
	}
	return t.readBytes()
}
func (t *tcpStore) close() { t.conn.Close() }

type storeResult struct {
	p50, p99 map[string]time.Duration
	opsPerS  map[string]float64
	// cpuPerOp is the server process's CPU time (user and system) per
	// operation, clientCPUPerOp this process's (the clients'); opsPerWrite
	// the operations per state write (group commit).
	cpuPerOp, clientCPUPerOp map[string]time.Duration
	opsPerWrite              map[string]float64
}

// serverCounters reads what drive reports per kind: the server's CPU
// seconds and, for the master, its state writes.
type serverCounters func() (cpu, writes float64)

// drive runs -ops of each kind from every client at once, kind by kind.
func drive(n int, newClient func(i int) (storeClient, error), counters serverCounters) (storeResult, error) {
	res := storeResult{p50: map[string]time.Duration{}, p99: map[string]time.Duration{}, opsPerS: map[string]float64{},
		cpuPerOp: map[string]time.Duration{}, clientCPUPerOp: map[string]time.Duration{}, opsPerWrite: map[string]float64{}}
	cs := make([]storeClient, n)
	for i := range cs {
		c, err := newClient(i)
		if err != nil {
			return res, err
		}
		cs[i] = c
		defer c.close()
	}
	value := []byte(strings.Repeat("v", 64))
	// Each client's key exists before any kind runs, so that -kinds may
	// start with get or compare_set.
	for i, c := range cs {
		if err := c.set(fmt.Sprintf("/bench/%d", i), value); err != nil {
			return res, fmt.Errorf("set: %w", err)
		}
	}
	for _, kind := range strings.Split(*kinds, ",") {
		lat := make([][]time.Duration, len(cs))
		errs := make(chan error, len(cs))
		var wg sync.WaitGroup
		cpu0, writes0 := counters()
		self0 := procCPU(os.Getpid())
		t0 := time.Now()
		for i, c := range cs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				l := make([]time.Duration, 0, *ops)
				key := fmt.Sprintf("/bench/%d", i)
				prev := value
				for k := range *ops {
					s := time.Now()
					var err error
					switch kind {
					case "set":
						err = c.set(key, value)
					case "get":
						_, err = c.get(key)
					case "add":
						_, err = c.add("/bench/counter", 1)
					case "compare_set":
						next := []byte(fmt.Sprintf("%064d", k))
						_, err = c.compareSet(key, prev, next)
						prev = next
					}
					if err != nil {
						errs <- fmt.Errorf("%s: %w", kind, err)
						return
					}
					l = append(l, time.Since(s))
				}
				lat[i] = l
			}()
		}
		wg.Wait()
		wall := time.Since(t0)
		cpu1, writes1 := counters()
		self1 := procCPU(os.Getpid())
		select {
		case err := <-errs:
			return res, err
		default:
		}
		all := slices.Concat(lat...)
		slices.Sort(all)
		res.p50[kind] = all[len(all)/2]
		res.p99[kind] = all[len(all)*99/100]
		res.opsPerS[kind] = float64(len(all)) / wall.Seconds()
		res.cpuPerOp[kind] = time.Duration((cpu1 - cpu0) / float64(len(all)) * 1e9)
		res.clientCPUPerOp[kind] = time.Duration((self1 - self0) / float64(len(all)) * 1e9)
		if writes1 > writes0 {
			res.opsPerWrite[kind] = float64(len(all)) / (writes1 - writes0)
		}
	}
	return res, nil
}

func storeBench(dir, tokenFile string) error {
	for _, n := range ints(*clients) {
		if err := storeBenchAt(dir, tokenFile, n); err != nil {
			return err
		}
	}
	return nil
}

// storeBenchAt runs the store kinds from n concurrent clients against each
// server and prints one table.
func storeBenchAt(dir, tokenFile string, n int) error {
	fmt.Printf("Store: %d concurrent clients, %d operations of each kind per client, 64-byte values\n", n, *ops)
	results := map[string]storeResult{}
	for _, state := range []string{"file", "mem"} {
		url := "file://" + filepath.Join(dir, fmt.Sprintf("store-%d", time.Now().UnixNano()))
		if state == "mem" {
			url = "mem://"
		}
		m, err := startMaster(dir, tokenFile, url, 1)
		if err != nil {
			return err
		}
		var profiled chan struct{}
		if p := os.Getenv("KFELASTIC_CPUPROFILE_OUT"); p != "" {
			// The master's CPU profile of the drive (its first seconds), to
			// see where a store operation's time goes.
			profiled = make(chan struct{})
			go func() {
				defer close(profiled)
				res, err := http.Get(fmt.Sprintf("http://%s/debug/pprof/profile?seconds=5", m.metrics))
				if err != nil {
					return
				}
				defer res.Body.Close()
				if f, err := os.Create(fmt.Sprintf("%s.%s.%d", p, state, n)); err == nil {
					io.Copy(f, res.Body)
					f.Close()
				}
			}()
		}
		r, err := drive(n, func(i int) (storeClient, error) {
			// The agent's own client, as its store relay uses it: what a
			// torch worker's operation goes through after the relay.
			am, err := agent.DialMaster(agent.MasterConfig{Endpoint: m.addr, Token: token})
			if err != nil {
				return nil, err
			}
			return &grpcStore{m: am, c: am.Client(), client: fmt.Sprintf("bench-%d", i)}, nil
		}, func() (float64, float64) {
			return procCPU(m.cmd.Process.Pid), m.scrape()["kfelastic_master_state_writes_total"]
		})
		if profiled != nil {
			<-profiled
		}
		m.stop()
		if err != nil {
			return fmt.Errorf("kfelastic store (%s): %w", state, err)
		}
		results[state] = r
	}
	port, err := freePort()
	if err != nil {
		return err
	}
	storeCmd := exec.Command(*python, "-c", torchStoreScript, strconv.Itoa(port))
	out, _ := storeCmd.StdoutPipe()
	storeCmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := storeCmd.Start(); err != nil {
		return err
	}
	bufio.NewReader(out).ReadString('\n')
	r, err := drive(n, func(int) (storeClient, error) { return dialTCPStore(fmt.Sprintf("127.0.0.1:%d", port)) },
		func() (float64, float64) { return procCPU(storeCmd.Process.Pid), 0 })
	storeCmd.Process.Kill()
	storeCmd.Wait()
	if err != nil {
		return fmt.Errorf("torch TCPStore: %w", err)
	}
	results["torch"] = r
	fmt.Printf("%-12s %-34s %10s %10s %10s %12s %12s %10s\n", "op", "server", "p50", "p99", "ops/s", "server CPU", "client CPU", "ops/write")
	for _, kind := range strings.Split(*kinds, ",") {
		for _, s := range []struct{ key, name string }{{"file", "kfelastic master (durable, file://)"}, {"mem", "kfelastic master (mem://)"}, {"torch", "torch TCPStore (" + torchVersion + ", in memory)"}} {
			r := results[s.key]
			perWrite := "-"
			if w := r.opsPerWrite[kind]; w > 0 {
				perWrite = fmt.Sprintf("%.1f", w)
			}
			fmt.Printf("%-12s %-34s %10s %10s %10.0f %9.0fµs/op %9.0fµs/op %10s\n", kind, s.name, r.p50[kind].Round(time.Microsecond),
				r.p99[kind].Round(time.Microsecond), r.opsPerS[kind], float64(r.cpuPerOp[kind].Nanoseconds())/1e3,
				float64(r.clientCPUPerOp[kind].Nanoseconds())/1e3, perWrite)
		}
	}
	fmt.Println("(torch's SET has no reply: its latency is the time to send; ours is the durable acknowledgement)")
	fmt.Println("(server CPU, client CPU: user and system time per operation of the server process and of the clients (this process); ops/write: operations per state write, the group commit)")
	fmt.Println()
	return nil
}

// ---- helpers ----

func ints(s string) []int {
	var out []int
	for _, f := range strings.Split(s, ",") {
		if n, err := strconv.Atoi(strings.TrimSpace(f)); err == nil && n > 0 {
			out = append(out, n)
		}
	}
	return out
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// procCPU is a process's CPU time so far (user and system), in seconds.
func procCPU(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The fields after the command's closing parenthesis; utime and stime
	// are the 14th and 15th of the whole line, in clock ticks (100 Hz).
	_, rest, _ := strings.Cut(string(b), ") ")
	f := strings.Fields(rest)
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	return (u + st) / 100
}

func vmHWM(pid int) int64 { return procStatus(pid, "VmHWM:") }

func vmRSS(pid int) int64 { return procStatus(pid, "VmRSS:") }

// procStatus is one kB figure of /proc/<pid>/status, in bytes.
func procStatus(pid int, field string) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == field {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	return 0
}

func raiseFDLimit() {
	var l syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l) == nil && l.Cur < l.Max {
		l.Cur = l.Max
		syscall.Setrlimit(syscall.RLIMIT_NOFILE, &l)
	}
}

func numCPU() int {
	b, _ := os.ReadFile("/proc/cpuinfo")
	return strings.Count(string(b), "processor\t:")
}

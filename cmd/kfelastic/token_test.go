package main

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/flyteorg/flyte/flyteidl/gen/pb-go/flyteidl/core"
	"google.golang.org/protobuf/proto"

	kferrors "github.com/kfelastic/kfelastic/errors"
	"github.com/kfelastic/kfelastic/internal/test/mastertest"
	"github.com/kfelastic/kfelastic/master"
)

// shortBinary skips the test with -short and returns the built binary.
func shortBinary(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin, err := buildBinary()
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

// The master and the agent refuse, at start and within seconds, a token
// file that is not a regular file (a FIFO blocked both in open() forever,
// past SIGTERM; /dev/zero was read until the runtime died), one larger
// than a token, and a token gRPC cannot carry in a header (the master
// accepted one with non-ASCII bytes; the agent's client then refused to
// send it and retried for 10 minutes). The real binary, as a process.
func TestTokenFilesRefusedAtStart(t *testing.T) {
	bin := shortBinary(t)
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	file := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	cases := map[string]struct{ path, want string }{
		"FIFO":      {fifo, "not a regular file (a FIFO)"},
		"/dev/zero": {"/dev/zero", "not a regular file (a character device)"},
		"large":     {file("large", strings.Repeat("t", 5000)), "more than a token"},
		"non-ASCII": {file("utf8", "jöb-token\n"), "not printable ASCII"},
	}
	for name, c := range cases {
		for _, args := range [][]string{
			{"master", "--nnodes", "1:2", "--state", "file://" + filepath.Join(dir, "state"), "--listen", "127.0.0.1:0",
				"--token-file", c.path},
			{"agent", "--nnodes", "1:2", "--rdzv-endpoint", "127.0.0.1:1", "--token-file", c.path, "--", "true"},
		} {
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			start := time.Now()
			out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
			took := time.Since(start)
			cancel()
			var ee *exec.ExitError
			switch {
			case errors.Is(ctx.Err(), context.DeadlineExceeded):
				t.Errorf("%s: kfelastic %s still ran after 30 s", name, args[0])
			case !errors.As(err, &ee) || ee.ExitCode() == 0:
				t.Errorf("%s: kfelastic %s: %v, want a failure\n%s", name, args[0], err, out)
			case !strings.Contains(string(out), c.want):
				t.Errorf("%s: kfelastic %s says %q, want %q", name, args[0], out, c.want)
			default:
				t.Logf("%s: kfelastic %s exit %d in %v: %s", name, args[0], ee.ExitCode(), took.Round(time.Millisecond),
					strings.TrimSpace(string(out)))
			}
		}
	}
}

// An agent whose token the master refuses fails for good, at once, and says
// so: an AuthenticationFailed document (NON_RECOVERABLE) and exit 1, which
// the training operator's ExitCode policy does not restart. It used to exit
// 202 (RendezvousTimeout, retryable) in 0.07 s, to be restarted pointlessly.
func TestAgentWithWrongTokenFailsForGood(t *testing.T) {
	bin := shortBinary(t)
	m := mastertest.Start(t, master.Config{JobID: "auth", MinNodes: 1, MaxNodes: 2}, "")
	dir := t.TempDir()
	tok := filepath.Join(dir, "token")
	if err := os.WriteFile(tok, []byte("another-jobs-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	errs := filepath.Join(dir, "errors")
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "agent", "--nnodes", "1:2", "--rdzv-endpoint", m.Addr, "--token-file", tok,
		"--error-prefix", "file://"+errs, "--", "true")
	cmd.Env = append(os.Environ(), "_F_WN=auth-worker-0")
	start := time.Now()
	out, err := cmd.CombinedOutput()
	took := time.Since(start)
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("agent: %v after %v, want exit 1\n%s", err, took, out)
	}
	docs, _ := filepath.Glob(filepath.Join(errs, "error-*.pb"))
	if len(docs) != 1 {
		t.Fatalf("documents %q, want 1\n%s", docs, out)
	}
	b, err := os.ReadFile(docs[0])
	if err != nil {
		t.Fatal(err)
	}
	var doc core.ErrorDocument
	if err := proto.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	ce := doc.GetError()
	if ce.GetCode() != kferrors.CodeAuthenticationFailed || ce.GetKind() != core.ContainerError_NON_RECOVERABLE ||
		ce.GetOrigin() != core.ExecutionError_SYSTEM || !strings.Contains(ce.GetMessage(), "refused this pod's job token") ||
		strings.Contains(ce.GetMessage(), "another-jobs-token") {
		t.Errorf("document %v", ce)
	}
	t.Logf("agent exit 1 in %v: %s: %s", took.Round(time.Millisecond), ce.GetCode(), ce.GetMessage())
}

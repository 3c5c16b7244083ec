package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/kfelastic/kfelastic/internal/test/testenv"
)

// The machine: /tmp on one file system, the outputs on another.
// `kfelastic agent` whose worker fails writes its document and events to a
// file:// prefix on the other file system, and exits at once (it waited
// out the whole storage timeout, with nothing written); `kfelastic master`
// serves with its --state there. Ambiguous file URLs are refused at start,
// naming the flag.
func TestBinaryOnAnotherFileSystem(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin, err := buildBinary()
	if err != nil {
		t.Fatal(err)
	}
	other := testenv.OtherFileSystem(t, 16<<20)
	tmp := t.TempDir()
	env := []string{"TMPDIR=" + tmp, "POD_NAME=job-worker-0"}
	prefix := filepath.Join(other, "run", "attempt-0")

	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "agent", "--nnodes", "1", "--nproc-per-node", "1", "--max-restarts", "0",
		"--storage-timeout", "20s", "--error-prefix", "file://"+prefix, "--log-dir", filepath.Join(tmp, "logs"),
		"--", "sh", "-c", "exit 3")
	cmd.Env = append(os.Environ(), env...)
	start := time.Now()
	out, err := cmd.CombinedOutput()
	took := time.Since(start)
	if err == nil {
		t.Fatalf("the agent of a failing worker exited 0:\n%s", out)
	}
	if took > 10*time.Second {
		t.Errorf("the agent took %v (the storage timeout is 20 s):\n%s", took, out)
	}
	docs, _ := filepath.Glob(filepath.Join(prefix, "error-*.pb"))
	evs, _ := filepath.Glob(filepath.Join(prefix, "events", "*.json"))
	if len(docs) != 1 || len(evs) == 0 {
		t.Errorf("under the prefix: documents %v, events %v; agent output:\n%s", docs, evs, out)
	}

	tokenFile := filepath.Join(tmp, "token")
	if err := os.WriteFile(tokenFile, []byte("tok\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	m := startProc(t, env, bin, "master", "--listen", addr, "--nnodes", "1:2", "--token-file", tokenFile,
		"--state", "file://"+filepath.Join(other, "state"), "--error-prefix", "file://"+prefix)
	m.waitFor(t, regexp.MustCompile(`serving|listening`), 30*time.Second)

	for _, tc := range []struct{ flag, url string }{{"--state", "file://stateA"}, {"--state", "file:stateA"}, {"--error-prefix", "file://errs"}} {
		args := []string{"master", "--listen", "127.0.0.1:0", "--nnodes", "1:2", "--token-file", tokenFile, "--state", "file://" + filepath.Join(tmp, "s")}
		if tc.flag == "--state" {
			args[len(args)-1] = tc.url
		} else {
			args = append(args, tc.flag, tc.url)
		}
		cmd := exec.CommandContext(ctx, bin, args...)
		cmd.Dir = tmp
		out, err := cmd.CombinedOutput()
		if err == nil || !strings.Contains(string(out), tc.flag+":") || !strings.Contains(string(out), "file:///") || strings.Contains(string(out), "error prefix") {
			t.Errorf("master %s %s: %v\n%s", tc.flag, tc.url, err, out)
		}
	}
	if _, err := os.Stat("/log"); err == nil {
		t.Error("/log exists: a state was written at the root")
	}
}

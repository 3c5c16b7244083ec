package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/html"

	"github.com/kfelastic/kfelastic/agent"
	kferrors "github.com/kfelastic/kfelastic/errors"
	"github.com/kfelastic/kfelastic/internal/test/testenv"
	"github.com/kfelastic/kfelastic/outputreader"
)

// worker is a shell training worker: in the first group rank 1 is
// kill -9'ed; in the second rank 0 raises a ValueError (torch's error file,
// with markup in its message) and rank 1 is stopped by the agent.
const worker = `
if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ]; then
  if [ "$LOCAL_RANK" = 1 ]; then kill -9 $$; fi
  exec sleep 30
fi
if [ "$LOCAL_RANK" = 0 ]; then
  printf '%s' '{"message":{"message":"ValueError: batch 17 has NaN labels <b id=x>","extraInfo":{"py_callstack":"","timestamp":"0"}}}' > "$TORCHELASTIC_ERROR_FILE"
  exit 1
fi
exec sleep 30`

// The report of a real agent run: its events (two groups, a restart, the
// pod's failure), the document it wrote, a peer's document, and an earlier
// document it superseded when its first group started.
func TestReportOfAnAgentRun(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir := filepath.Join(t.TempDir(), "attempt-0")
	url := "file://" + dir
	b, err := kferrors.OpenPrefix(ctx, url, true)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	w := kferrors.NewWriter(b, nil)
	if _, err := w.Write(ctx, kferrors.SystemFailure(kferrors.CodePreempted, "an earlier incarnation", "job-worker-1", time.Now().Add(-time.Minute))); err != nil {
		t.Fatal(err)
	}

	// The agent writes its output from a goroutine (nonblocking.Output) and its
	// log from the loop: one buffer, locked.
	var log lockedBuffer
	err = agent.Run(ctx, agent.Config{Command: []string{"/bin/sh", "-c", worker}, NProcPerNode: 2, MinNodes: 1, MaxNodes: 1,
		MaxRestarts: 1, NodeRank: -1, RdzvID: "job", LogDir: t.TempDir(), Pod: "job-worker-1", ErrorPrefix: url,
		StopGrace: time.Second, MasterAddr: "127.0.0.1", Stdout: &log, Stderr: &log, Logger: slog.New(slog.NewTextHandler(&log, nil))})
	var ee *agent.ExitError
	if !errors.As(err, &ee) || ee.Failure.Code != "ValueError" {
		t.Fatalf("agent: %v\n%s", err, log.String())
	}
	if _, err := w.Write(ctx, kferrors.UserError("DistNetworkError", "Connection closed by peer", "job-worker-0/0", time.Now())); err != nil {
		t.Fatal(err)
	}

	out := filepath.Join(t.TempDir(), "report.html")
	var said bytes.Buffer
	if err := runReport(ctx, reportConfig{URL: url, Output: out, Concurrency: 4}, &said); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(said.String(), out+": [job-worker-1/0, ") || !strings.Contains(said.String(), "ValueError: batch 17 has NaN labels <b id=x>\n") {
		t.Fatalf("said %q", said.String())
	}
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	// Kept for people to look at, beside the browser test's screenshots.
	if art, err := filepath.Abs("../../out/report"); err == nil && os.MkdirAll(art, 0o755) == nil {
		_ = os.WriteFile(filepath.Join(art, "agent-run.html"), data, 0o644)
	}
	page := string(data)
	doc, err := html.Parse(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	sum, err := outputreader.Summarize(ctx, outputreader.NewBucketSource(b), nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := nodeText(findID(doc, "ui-message")); got != sum.Message() {
		t.Fatalf("summary\n%s\nwant the plugin's UI message\n%s", got, sum.Message())
	}
	var errs bytes.Buffer
	if err := runErrors(ctx, errorsConfig{URL: url, Concurrency: 4}, &errs); err != nil || !strings.Contains(errs.String(), indent(sum.Message(), "  ")) {
		t.Fatalf("kfelastic errors says another message (%v):\n%s", err, errs.String())
	}
	root := findID(doc, "root-lane")
	if root == nil || attr(root, "data-pod") != "job-worker-1" {
		t.Fatalf("root lane %v", root)
	}
	if findID(doc, "x") != nil {
		t.Fatal("the message's markup became an element")
	}
	for _, want := range []string{`class="mark m-root"`, `class="mark m-fail"`, `class="mark m-recovered"`, `class="mark m-restart"`,
		`class="mark m-start"`, `class="mark m-exit"`, `class="mark m-podfail"`, "recovered failure (superseded): Preempted: an earlier incarnation",
		"restart attempt=2 restart_count=1 reason=failure", "2 failure documents · 1 recovered (superseded) · 0 unreadable"} {
		if !strings.Contains(page, want) {
			t.Errorf("the report lacks %s", want)
		}
	}

	var stdout bytes.Buffer
	if err := runReport(ctx, reportConfig{URL: url, Output: "-"}, &stdout); err != nil || !strings.HasPrefix(stdout.String(), "<!DOCTYPE html>") {
		t.Fatalf("-o -: %v %.80q", err, stdout.String())
	}
	empty := t.TempDir()
	if err := runReport(ctx, reportConfig{URL: "file://" + empty, Output: filepath.Join(empty, "r.html")}, io.Discard); err != nil {
		t.Fatalf("a prefix without documents is a report too: %v", err)
	}
	for _, bad := range []string{"not a url", "file://" + filepath.Join(empty, "missing")} {
		if err := runReport(ctx, reportConfig{URL: bad, Output: filepath.Join(empty, "bad.html")}, io.Discard); err == nil || !strings.Contains(err.Error(), bad) {
			t.Errorf("%q: want an error naming it, got %v", bad, err)
		}
	}
	if _, err := os.Stat(filepath.Join(empty, "bad.html")); err == nil {
		t.Error("a failed report left a file")
	}
}

func findID(n *html.Node, id string) *html.Node {
	if attr(n, "id") == id {
		return n
	}
	for c := n.FirstChild; c != nil; c = c.NextSibling {
		if f := findID(c, id); f != nil {
			return f
		}
	}
	return nil
}

func attr(n *html.Node, key string) string {
	for _, a := range n.Attr {
		if a.Key == key {
			return a.Val
		}
	}
	return ""
}

func nodeText(n *html.Node) string {
	if n == nil {
		return ""
	}
	if n.Type == html.TextNode {
		return n.Data
	}
	var b strings.Builder
	for c := n.FirstChild; c != nil; c = c.NextSibling {
		b.WriteString(nodeText(c))
	}
	return b.String()
}

// runReportCmd runs a fresh `kfelastic report` with args, bounded by limit.
func runReportCmd(t *testing.T, limit time.Duration, args ...string) (string, error) {
	t.Helper()
	return runFreshCmd(t, newReportCmd(), limit, args...)
}

// As `kfelastic errors`: a store that never answers fails the report within
// --timeout, numeric flags are refused outside their range, and the line
// said on the terminal escapes what storage wrote.
func TestReportTimeoutRangesAndEscaping(t *testing.T) {
	silent := testenv.Silent(t)
	t.Setenv("AWS_ACCESS_KEY_ID", testenv.MinIOAccessKey)
	t.Setenv("AWS_SECRET_ACCESS_KEY", testenv.MinIOSecretKey)
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	page := filepath.Join(t.TempDir(), "report.html")
	start := time.Now()
	out, err := runReportCmd(t, 20*time.Second, "--timeout", "300ms", "-o", page, silent.URL("flyte", "metadata/attempt-0"))
	if err == nil || !strings.Contains(err.Error(), "no answer") || time.Since(start) > 5*time.Second {
		t.Errorf("silent store: %v after %v, want a timeout error within about 300ms\n%s", err, time.Since(start), out)
	}
	if _, err := os.Stat(page); err == nil {
		t.Error("a page was written for a store that did not answer")
	}

	dir := t.TempDir()
	for _, args := range [][]string{
		{"--concurrency", "0"}, {"--concurrency", "5000"}, {"--lanes", "0"}, {"--lanes", "2001"},
		{"--timeout", "0s"}, {"--timeout", "-5s"},
	} {
		out, err := runReportCmd(t, 10*time.Second, append(args, "-o", page, "file://"+dir)...)
		if err == nil || !strings.Contains(err.Error(), args[0]) {
			t.Errorf("%q: %v, want a refusal naming the flag\n%s", args, err, out)
		}
	}
	help, _ := runReportCmd(t, 10*time.Second, "--help")
	for _, want := range []string{"(1 to 1024)", "(1 to 2000)", "(1ms to 1h0m0s)"} {
		if !strings.Contains(help, want) {
			t.Errorf("--help does not state %q:\n%s", want, help)
		}
	}

	b, err := kferrors.OpenPrefix(t.Context(), "file://"+dir, true)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if _, err := kferrors.NewWriter(b, nil).Write(t.Context(), kferrors.UserError("E\x1b]0;pwned\x07", "boom\x1b[2J", "job-worker-0/0", time.Now())); err != nil {
		t.Fatal(err)
	}
	out, err = runReportCmd(t, 20*time.Second, "-o", page, "file://"+dir)
	if err != nil || strings.ContainsAny(out, "\x1b\x07") || !strings.Contains(out, `E\x1b]0;pwned\x07`) {
		t.Errorf("said %q, %v; want the headline escaped", out, err)
	}
}

// -o writes only over a regular file or a new one: a device, a FIFO, a
// folder and an empty name are refused with what is wrong, before
// storage is read, and left as they were; a new page takes the umask, a
// replaced one keeps its mode, and a link's file is replaced, the link
// kept.
func TestReportOutputPath(t *testing.T) {
	dir := t.TempDir()
	prefix := "file://" + t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	// A device node of our own, a copy of /dev/null's (1, 3): the test must
	// not put the real one at risk. Creating one needs root.
	device := filepath.Join(dir, "null")
	if err := syscall.Mknod(device, syscall.S_IFCHR|0o666, 1<<8|3); err != nil {
		t.Logf("no device node (%v): that case is left out", err)
		device = ""
	}
	for _, c := range []struct{ path, want string }{
		{"", "empty"},
		{dir, "a folder"},
		{dir + "/", "a folder"},
		{fifo, "a FIFO"},
		{device, "a device"},
		{filepath.Join(dir, "missing", "r.html"), "does not exist"},
	} {
		if c.want == "a device" && c.path == "" {
			continue
		}
		out, err := runReportCmd(t, 10*time.Second, "-o", c.path, prefix)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("-o %q: %v, want an error saying %q\n%s", c.path, err, c.want, out)
		}
	}
	if st, err := os.Lstat(fifo); err != nil || st.Mode()&fs.ModeNamedPipe == 0 {
		t.Errorf("the FIFO was replaced: %v %v", st.Mode(), err)
	}
	if st, err := os.Lstat(device); device != "" && (err != nil || st.Mode()&fs.ModeDevice == 0) {
		t.Errorf("the device node was replaced: %v %v", st.Mode(), err)
	}

	old := syscall.Umask(0o077)
	page := filepath.Join(dir, "new.html")
	_, err := runReportCmd(t, 10*time.Second, "-o", page, prefix)
	syscall.Umask(old)
	if st, serr := os.Stat(page); err != nil || serr != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("new page under umask 077: %v, %v; want it written 0600", err, serr)
	}

	kept := filepath.Join(dir, "kept.html")
	if err := os.WriteFile(kept, []byte("old"), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(kept, 0o640); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link.html")
	if err := os.Symlink(kept, link); err != nil {
		t.Fatal(err)
	}
	if out, err := runReportCmd(t, 10*time.Second, "-o", link, prefix); err != nil {
		t.Fatalf("-o through a link: %v\n%s", err, out)
	}
	if st, err := os.Lstat(link); err != nil || st.Mode()&fs.ModeSymlink == 0 {
		t.Errorf("the link was replaced: %v", err)
	}
	data, _ := os.ReadFile(kept)
	if st, err := os.Stat(kept); err != nil || st.Mode().Perm() != 0o640 || !strings.Contains(string(data), "<html") {
		t.Errorf("replaced page: %v %v %q…; want the page, still 0640", st.Mode(), err, data[:min(len(data), 20)])
	}
}

package main

import (
	"bytes"
	"context"
	"encoding/json"
	goerrors "errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"gocloud.dev/blob"
	"golang.org/x/sys/unix"

	kferrors "github.com/kfelastic/kfelastic/errors"
	"github.com/kfelastic/kfelastic/internal/test/testenv"
)

func TestErrorsCommand(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "attempt-0")
	url := "file://" + dir
	_, w := prefixWriter(t, url)
	at := time.Date(2026, 11, 21, 10, 0, 1, 0, time.UTC)
	w.Write(ctx, kferrors.UserError("DistNetworkError", "Connection closed by peer", "job-worker-0", at.Add(time.Second)))
	rootKey, _ := w.Write(ctx, kferrors.UserError("ValueError", "bad shape", "job-worker-1", at))
	os.WriteFile(filepath.Join(dir, "error-0badc0de.pb"), []byte("junk"), 0o644)

	var out bytes.Buffer
	if err := runErrors(ctx, errorsConfig{URL: url, Concurrency: 4}, &out); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(out.String(), "\n")
	if !strings.HasPrefix(lines[0], "   TIME") || !strings.HasPrefix(lines[1], "*  2026-11-21T10:00:01.000000000Z") || !strings.HasSuffix(lines[1], rootKey) {
		t.Fatalf("table:\n%s", out.String())
	}
	for _, want := range []string{"error-0badc0de.pb: corrupt error document", "[job-worker-1, 2026-11-21T10:00:01.000000000Z] ValueError: bad shape", "Also failed: 2 other workers (1× DistNetworkError, 1× UnreadableErrorDocument)."} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("missing %q in\n%s", want, out.String())
		}
	}

	out.Reset()
	if err := runErrors(ctx, errorsConfig{URL: url, JSON: true}, &out); err != nil {
		t.Fatal(err)
	}
	var j errorsJSON
	if err := json.Unmarshal(out.Bytes(), &j); err != nil || j.Outcome != "root-cause" || len(j.Documents) != 3 || !j.Documents[0].RootCause || j.Documents[0].Code != "ValueError" || len(j.Skipped) != 1 {
		t.Fatalf("json %v: %s", err, out.String())
	}

	empty := t.TempDir()
	out.Reset()
	if err := runErrors(ctx, errorsConfig{URL: "file://" + empty}, &out); err != nil || out.String() != "no error documents under file://"+empty+"\n" {
		t.Fatalf("empty prefix: %v %q", err, out.String())
	}
	out.Reset()
	if err := runErrors(ctx, errorsConfig{URL: "file://" + empty, JSON: true}, &out); err != nil || !strings.Contains(out.String(), `"outcome": "no-documents"`) {
		t.Fatalf("empty prefix json: %v %q", err, out.String())
	}

	os.WriteFile(filepath.Join(empty, "error.pb"), nil, 0o644)
	out.Reset()
	err := runErrors(ctx, errorsConfig{URL: "file://" + empty}, &out)
	var ee *exitError
	if !goerrors.As(err, &ee) || ee.ExitCode() != exitNoUsableDocuments || !strings.Contains(out.String(), "error.pb: empty error document") {
		t.Fatalf("only unreadable documents: %v\n%s", err, out.String())
	}

	for _, bad := range []string{"not a url", "file://" + filepath.Join(empty, "missing"), "nosuch://x"} {
		if err := runErrors(ctx, errorsConfig{URL: bad}, &out); err == nil || !strings.Contains(err.Error(), bad) {
			t.Errorf("%q: want an error naming it, got %v", bad, err)
		}
	}
}

// prefixWriter opens url, creating it, for the test, and a writer into it.
func prefixWriter(t *testing.T, url string) (*blob.Bucket, *kferrors.Writer) {
	t.Helper()
	b, err := kferrors.OpenPrefix(context.Background(), url, true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b, kferrors.NewWriter(b, nil)
}

// runErrorsCmd runs `kfelastic errors ARGS…` as the binary would, flags
// parsed, on a fresh command; it fails the test if the command runs longer
// than limit (a hang must not stall the suite).
func runErrorsCmd(t *testing.T, limit time.Duration, args ...string) (string, error) {
	t.Helper()
	return runFreshCmd(t, newErrorsCmd(), limit, args...)
}

// runFreshCmd runs cmd (fresh: cobra keeps the context of a first run) with
// args, its output and errors in one string; it fails the test if the
// command runs longer than limit.
func runFreshCmd(t *testing.T, cmd *cobra.Command, limit time.Duration, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	cmd.SetArgs(args)
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	done := make(chan error, 1)
	go func() { done <- cmd.ExecuteContext(context.Background()) }()
	select {
	case err := <-done:
		return out.String(), err
	case <-time.After(limit):
		t.Fatalf("kfelastic %s %q still running after %v", cmd.Name(), args, limit)
		return "", nil
	}
}

// Pod names, codes, keys and messages are whoever's wrote them: escape
// sequences and newlines are printed escaped, so they can neither clear the
// screen nor fake a row or a line. --json keeps them, JSON-escaped. On a
// file prefix and on MinIO.
func TestErrorsEscapesControlCharacters(t *testing.T) {
	ctx := context.Background()
	prefixes := map[string]string{"file": "file://" + filepath.Join(t.TempDir(), "attempt-0")}
	if !testing.Short() {
		s := testenv.MinIO(t)
		prefixes["minio"] = s.MinIOProcess.URL(s.Bucket, "metadata/attempt-0")
	}
	for name, url := range prefixes {
		t.Run(name, func(t *testing.T) {
			b, w := prefixWriter(t, url)
			at := time.Date(2026, 11, 21, 10, 0, 1, 0, time.UTC)
			w.Write(ctx, kferrors.UserError("E\x1b]0;pwned\x07", "boom\r\x1b[1A*  2026-01-01 fake root\n\x1b[2J", "job\x1b[2J\n*\tworker\u202e", at))
			w.Write(ctx, kferrors.UserError("DistNetworkError", "peer gone", "job-worker-0", at.Add(time.Second)))
			b.WriteAll(ctx, "error-\n*  fake\x1b[31m.pb", []byte("junk"), nil)

			out, err := runErrorsCmd(t, 20*time.Second, url)
			if err != nil {
				t.Fatalf("errors: %v\n%s", err, out)
			}
			for _, bad := range []string{"\x1b", "\r", "\x07", "\u202e"} {
				if strings.Contains(out, bad) {
					t.Errorf("output has %q raw:\n%s", bad, out)
				}
			}
			lines := strings.Split(out, "\n")
			// Header, two rows, blank, "skipped", one skipped, blank, title,
			// the message (two lines: the root cause's and the tally).
			// (The corrupt document is a row too, its time the upload time:
			// the columns widen.)
			if len(lines) < 3 || !strings.HasPrefix(lines[1], "*  2026-11-21T10:00:01.000000000Z ") ||
				!strings.HasPrefix(strings.TrimLeft(strings.TrimPrefix(lines[1], "*  2026-11-21T10:00:01.000000000Z"), " "), "job\\x1b[2J\\x0a*\\x09worker\\u202e") ||
				!strings.Contains(lines[2], "job-worker-0") || strings.Count(out, "\n*") != 1 {
				t.Errorf("table rows broken:\n%s", out)
			}
			for _, want := range []string{`E\x1b]0;pwned\x07`, `error-\x0a*  fake\x1b[31m.pb: corrupt error document`, `boom\x0d\x1b[1A*  2026-01-01 fake root`, "\n  \\x1b[2J"} {
				if !strings.Contains(out, want) {
					t.Errorf("missing %q in\n%s", want, out)
				}
			}
			out, err = runErrorsCmd(t, 20*time.Second, "--json", url)
			var j errorsJSON
			if err != nil || json.Unmarshal([]byte(out), &j) != nil || j.Documents[0].Worker != "job\x1b[2J\n*\tworker\u202e" {
				t.Errorf("json: %v\n%s", err, out)
			}
		})
	}
}

// A store that accepts and never answers fails the command within
// --timeout (default 30s), with an error that says so; the table command
// and --wait-workers alike.
func TestErrorsTimeoutOnSilentStore(t *testing.T) {
	silent := testenv.Silent(t)
	t.Setenv("AWS_ACCESS_KEY_ID", testenv.MinIOAccessKey)
	t.Setenv("AWS_SECRET_ACCESS_KEY", testenv.MinIOSecretKey)
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	url := silent.URL("flyte", "metadata/attempt-0")
	for _, args := range [][]string{{"--timeout", "300ms", url}, {"--timeout", "300ms", "--wait-workers", "3", url}} {
		start := time.Now()
		out, err := runErrorsCmd(t, 20*time.Second, args...)
		if err == nil || !strings.Contains(err.Error(), "no answer") || time.Since(start) > 5*time.Second {
			t.Errorf("%q: %v after %v, want a timeout error within about 300ms\n%s", args, err, time.Since(start), out)
		}
	}
	if d := newErrorsCmd().Flags().Lookup("timeout").DefValue; d != "30s" {
		t.Errorf("--timeout default %s", d)
	}
}

// Numeric flags say their range in --help and refuse values outside it.
func TestErrorsFlagRanges(t *testing.T) {
	dir := "file://" + t.TempDir()
	for _, args := range [][]string{
		{"--concurrency", "0"}, {"--concurrency", "-3"}, {"--concurrency", "5000"},
		{"--grace", "-1s"}, {"--grace", "25h"}, {"--timeout", "0s"}, {"--timeout", "-5s"},
		{"--wait-workers", "-1"},
	} {
		out, err := runErrorsCmd(t, 10*time.Second, append(args, dir)...)
		if err == nil || !strings.Contains(err.Error(), args[0]) {
			t.Errorf("%q: %v, want a refusal naming the flag\n%s", args, err, out)
		}
	}
	help, _ := runErrorsCmd(t, 10*time.Second, "--help")
	for _, want := range []string{"(1 to 1024)", "(0s to 24h0m0s)", "(1ms to 1h0m0s)", "(0 to 100000; 0: do not wait)"} {
		if !strings.Contains(help, want) {
			t.Errorf("--help does not state %q:\n%s", want, help)
		}
	}
}

// A symbolic-link loop (and a link out of the prefix) does not fail the
// command: the valid documents are shown, the links listed as skipped.
func TestErrorsSymlinkLoop(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	_, w := prefixWriter(t, "file://"+dir)
	key, _ := w.Write(ctx, kferrors.UserError("ValueError", "bad shape", "job-worker-1", time.Now()))
	os.Symlink("error-loop.pb", filepath.Join(dir, "error-loop.pb"))
	os.Symlink("/etc/passwd", filepath.Join(dir, "error-passwd.pb"))
	// Written after the document, as their times say: an unreadable
	// document ranks by its modification time, which the file system
	// keeps on a coarse clock, behind the document's own by a few ms.
	later := time.Now().Add(2 * time.Second)
	for _, l := range []string{"error-loop.pb", "error-passwd.pb"} {
		if err := unix.Lutimes(filepath.Join(dir, l), []unix.Timeval{unix.NsecToTimeval(later.UnixNano()), unix.NsecToTimeval(later.UnixNano())}); err != nil {
			t.Fatal(err)
		}
	}
	out, err := runErrorsCmd(t, 20*time.Second, "file://"+dir)
	if err != nil || !strings.Contains(out, key) || !strings.Contains(out, "error-loop.pb: unreadable error document: a symbolic link, not followed") ||
		!strings.Contains(out, "error-passwd.pb: unreadable") || strings.Contains(out, "root:") {
		t.Fatalf("errors: %v\n%s", err, out)
	}
}

// `errors put` documents a worker whose error file cannot be used (not
// JSON, too large): the failure is written with the reason, not lost.
func TestErrorsPutUnusableTorchFile(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "error.json")
	os.WriteFile(bad, []byte("Traceback (most recent call last): not JSON"), 0o644)
	put := newErrorsPutCmd()
	var out bytes.Buffer
	put.SetOut(&out)
	put.SetArgs([]string{"--worker", "job-worker-2", "--from-torch-error", bad, "--exit-code", "3", "file://" + dir + "/out"})
	if err := put.ExecuteContext(context.Background()); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(dir, "out", strings.TrimSpace(out.String())))
	if err != nil {
		t.Fatal(err)
	}
	f, err := kferrors.DecodeFailure(data, 0)
	if err != nil || f.Code != kferrors.CodeNonZeroExit || !strings.Contains(f.Message, "exited with code 3 (its error file was not usable: torch error file") {
		t.Fatalf("document %+v, %v", f, err)
	}
}

// --wait-workers that gives up after --grace says so, with how many
// workers it saw, and still shows what there is; one that sees them all
// says nothing more.
func TestErrorsWaitWorkersSaysItGaveUp(t *testing.T) {
	dir := t.TempDir()
	url := "file://" + dir
	b, w := prefixWriter(t, url)
	defer b.Close()
	for _, worker := range []string{"job-worker-0/0", "job-worker-1/0"} {
		if _, err := w.Write(t.Context(), kferrors.UserError("ValueError", "boom", worker, time.Now())); err != nil {
			t.Fatal(err)
		}
	}
	out, err := runErrorsCmd(t, 20*time.Second, "--wait-workers", "3", "--grace", "300ms", url)
	if err != nil || !strings.Contains(out, "gave up waiting after --grace 300ms: documents from 2 of the 3 workers") || !strings.Contains(out, "job-worker-1/0") {
		t.Errorf("gave up: %v\n%s", err, out)
	}
	out, err = runErrorsCmd(t, 20*time.Second, "--wait-workers", "2", "--grace", "10s", url)
	if err != nil || strings.Contains(out, "gave up") {
		t.Errorf("all there: %v\n%s", err, out)
	}
}

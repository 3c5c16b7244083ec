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

	kferrors "github.com/kfelastic/kfelastic/errors"
)

func TestErrorsCommand(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "attempt-0")
	url := "file://" + dir
	b, err := kferrors.OpenPrefix(ctx, url, true)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	at := time.Date(2026, 11, 21, 10, 0, 1, 0, time.UTC)
	w := kferrors.NewWriter(b, nil)
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
	for _, want := range []string{"error-0badc0de.pb: corrupt error document", "[job-worker-1, 2026-11-21T10:00:01.000000000Z] ValueError: bad shape", "Also failed: 1 other worker (1× DistNetworkError)."} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("missing %q in\n%s", want, out.String())
		}
	}

	out.Reset()
	if err := runErrors(ctx, errorsConfig{URL: url, JSON: true}, &out); err != nil {
		t.Fatal(err)
	}
	var j errorsJSON
	if err := json.Unmarshal(out.Bytes(), &j); err != nil || j.Outcome != "root-cause" || len(j.Documents) != 2 || !j.Documents[0].RootCause || j.Documents[0].Code != "ValueError" || len(j.Skipped) != 1 {
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
	err = runErrors(ctx, errorsConfig{URL: "file://" + empty}, &out)
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

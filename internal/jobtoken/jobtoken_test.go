package jobtoken_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kfelastic/kfelastic/internal/jobtoken"
)

func write(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// readSoon is Read that fails the test instead of blocking (a FIFO without
// a writer blocked open() forever).
func readSoon(t *testing.T, path string) (string, error) {
	t.Helper()
	type result struct {
		tok string
		err error
	}
	done := make(chan result, 1)
	go func() {
		tok, err := jobtoken.Read(path)
		done <- result{tok, err}
	}()
	select {
	case r := <-done:
		return r.tok, r.err
	case <-time.After(5 * time.Second):
		t.Fatalf("Read(%s) still blocked after 5 s", path)
		return "", nil
	}
}

func TestReadAccepts(t *testing.T) {
	p := write(t, "token", "  s3cr3t-Token_1 \n")
	// A Secret volume's file is a link into ..data/: followed.
	link := filepath.Join(t.TempDir(), "token")
	if err := os.Symlink(p, link); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{p, link} {
		if tok, err := readSoon(t, path); err != nil || tok != "s3cr3t-Token_1" {
			t.Errorf("Read(%s) = %q, %v", path, tok, err)
		}
	}
}

func TestReadRefuses(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	fifoLink := filepath.Join(dir, "fifo-link")
	if err := os.Symlink(fifo, fifoLink); err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]struct{ path, want string }{
		"FIFO":            {fifo, "not a regular file (a FIFO)"},
		"link to a FIFO":  {fifoLink, "not a regular file (a FIFO)"},
		"/dev/zero":       {"/dev/zero", "not a regular file (a character device)"},
		"directory":       {dir, "not a regular file (a directory)"},
		"missing":         {filepath.Join(dir, "none"), "no such file"},
		"empty":           {write(t, "empty", " \n"), "is empty"},
		"too large":       {write(t, "large", strings.Repeat("a", jobtoken.MaxBytes+1)), "more than a token"},
		"not ASCII":       {write(t, "utf8", "tökén-secret\n"), "byte 2 of 14 is not printable ASCII"},
		"control char":    {write(t, "ctl", "tok\x00en"), "byte 4 of 6 is not printable ASCII"},
		"line inside":     {write(t, "lines", "tok\nen\n"), "byte 4 of 6 is not printable ASCII"},
		"invalid UTF-8":   {write(t, "bin", "\xff\xfe"), "byte 1 of 2"},
		"no path (empty)": {"", "no token file"},
	} {
		tok, err := readSoon(t, c.path)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: Read = %q, %v; want an error saying %q", name, tok, err, c.want)
			continue
		}
		if strings.Contains(err.Error(), "secret") {
			t.Errorf("%s: the error quotes the token: %v", name, err)
		}
	}
}

func TestCheck(t *testing.T) {
	for _, ok := range []string{"a", "0123abcdef-token", "with space", strings.Repeat("~", jobtoken.MaxBytes)} {
		if err := jobtoken.Check(ok); err != nil {
			t.Errorf("Check(%q): %v", ok, err)
		}
	}
	for _, bad := range []string{"", "é", "tab\there", "\x7f", strings.Repeat("a", jobtoken.MaxBytes+1)} {
		if err := jobtoken.Check(bad); !errors.Is(err, jobtoken.ErrInvalid) {
			t.Errorf("Check(%q) = %v, want ErrInvalid", bad, err)
		}
	}
}

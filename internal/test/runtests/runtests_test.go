package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// A module of its own with a passing package, a failing one, one without
// tests and two whose binaries share a name: the results read as go
// test's, the failing one's output is shown, the leg runs with its
// setting and skips what it is told to, and a second run links nothing.
func TestRunAllLinksOnceAndReports(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a module: skipped with -short")
	}
	mod := t.TempDir()
	write := func(name, content string) {
		t.Helper()
		p := filepath.Join(mod, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		// go trusts no up-to-date check on a file written in the last
		// seconds, and would link again for that alone.
		old := time.Now().Add(-time.Hour)
		if err := os.Chtimes(p, old, old); err != nil {
			t.Fatal(err)
		}
	}
	write("go.mod", "module example.com/m\n\ngo 1.26\n")
	write("pass/pass_test.go", `package pass
import ("os"; "testing")
func TestLeg(t *testing.T) {
	t.Log("leg=" + os.Getenv("LEG"))
	if os.Getenv("LEG") != "" { os.WriteFile("leg-ran-" + os.Getenv("LEG") + os.Getenv("OTHER"), nil, 0o644) }
}
func TestSkipped(t *testing.T) { if os.Getenv("LEG") != "" { t.Fatal("the leg skips this") } }
func TestDir(t *testing.T) {
	if _, err := os.Stat("pass_test.go"); err != nil { t.Fatal("not run in its folder") }
	wd, _ := os.Getwd()
	if os.Getenv("PWD") != wd { t.Fatalf("PWD %q in %q", os.Getenv("PWD"), wd) }
}
`)
	write("fail/fail_test.go", "package fail\nimport \"testing\"\nfunc TestFails(t *testing.T) { t.Fatal(\"the reason\") }\n")
	write("none/none.go", "package none\n")
	write("other/pass/pass_test.go", "package pass\nimport \"testing\"\nfunc TestOther(t *testing.T) {}\n")
	t.Chdir(mod)
	out := filepath.Join(t.TempDir(), "bin")
	o := options{out: out, lanes: 2, bigLanes: 1, big: "./fail", timeout: time.Minute,
		legEnv: listFlag{"LEG=grpc", "OTHER=1"}, legSkip: "TestSkipped", legPkgs: "./pass", patterns: []string{"./..."},
		testFlags: listFlag{"-test.v=true"}}
	var w bytes.Buffer
	if code := runAll(context.Background(), o, &w); code != 1 {
		t.Fatalf("exit %d, want 1\n%s", code, w.String())
	}
	got := w.String()
	for _, want := range []string{
		`(?m)^\?   \texample.com/m/none\t\[no test files\]$`,
		`(?m)^ok  \texample.com/m/pass\t[0-9.]+s$`,
		`(?m)^ok  \texample.com/m/other/pass\t[0-9.]+s$`,
		`(?m)^ok  \texample.com/m/pass \[LEG=grpc OTHER=1\]\t[0-9.]+s$`,
		`the reason`,
		`(?m)^FAIL\texample.com/m/fail\t[0-9.]+s$`,
		`(?m)^runtests: 4 runs, 1 failed`,
	} {
		if !regexp.MustCompile(want).MatchString(got) {
			t.Errorf("output lacks %s:\n%s", want, got)
		}
	}
	if _, err := os.Stat(filepath.Join(mod, "pass", "leg-ran-grpc1")); err != nil {
		t.Errorf("the leg did not run with both its settings: %v", err)
	}
	if strings.Contains(got, "leg=grpc") {
		t.Errorf("a passing run's output was printed:\n%s", got)
	}
	// other/pass sorts first among the two pass packages.
	for _, b := range []string{"0/pass.test", "1/pass.test"} {
		if _, err := os.Stat(filepath.Join(out, b)); err != nil {
			t.Fatal(err)
		}
	}
	// Again, with go's commands printed (-x): no link this time.
	w.Reset()
	o.patterns, o.legPkgs, o.buildFlags = []string{"./pass"}, "", listFlag{"-x"}
	if code := runAll(context.Background(), o, &w); code != 0 {
		t.Fatalf("second run: exit %d\n%s", code, w.String())
	}
	if regexp.MustCompile(`(?m)/link .*pass\.test`).MatchString(w.String()) {
		t.Errorf("an unchanged binary was linked again:\n%s", w.String())
	}
	if !strings.Contains(w.String(), "ok  \texample.com/m/pass") {
		t.Errorf("second run:\n%s", w.String())
	}
}

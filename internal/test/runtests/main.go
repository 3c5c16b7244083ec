// Command runtests is make test's go test: it links every package's test
// binary into a cache folder, where an unchanged one is not linked again,
// and runs them in lanes of its own.
//
// go test links each test binary every run (≈170 CPU-s of a warm make
// test on 2 cores, 2026-12-07, for 28 binaries that had not changed) and
// runs -p packages at a time, whatever they are: the short packages at
// the end left the CPUs a third idle. Here the binaries are linked by
// `go test -c -o DIR/`, which leaves an up-to-date one alone (1.2 s for
// all of them), and run -p at a time, at most -big-lanes of the packages
// named by -big among them, in the order given; once every -big package
// has ended, -tail-p at a time. A leg runs some of them again with other
// settings from the same binaries (the master's suite on grpc-go).
// Results print as go test prints them, as each package ends; the exit
// status is 1 when any failed.
//
//	go run ./internal/test/runtests -o DIR [-p 2] [-tail-p 3] [-big-lanes 2] [-big PKGS]
//	    [-timeout 45m] [-buildflag F]... [-testflag F]... [-v] [-link-only]
//	    [-leg-env K=V -leg-skip RE -leg-pkgs PKGS] PACKAGES...
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"
)

type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, " ") }
func (l *listFlag) Set(s string) error { *l = append(*l, s); return nil }

type options struct {
	out        string
	lanes      int
	tailLanes  int
	bigLanes   int
	big        string
	timeout    time.Duration
	buildFlags listFlag
	testFlags  listFlag
	verbose    bool
	linkOnly   bool
	legEnv     listFlag
	legSkip    string
	legPkgs    string
	patterns   []string
}

func main() {
	var o options
	flag.StringVar(&o.out, "o", "", "the folder the test binaries are linked into and kept in (required)")
	flag.IntVar(&o.lanes, "p", 2, "test binaries run at once")
	flag.IntVar(&o.tailLanes, "tail-p", 0, "test binaries run at once after every -big package has ended (0: -p)")
	flag.IntVar(&o.bigLanes, "big-lanes", 2, "of them, at most this many of the -big packages")
	flag.StringVar(&o.big, "big", "", "comma-separated package patterns that each keep a core busy for minutes")
	flag.DurationVar(&o.timeout, "timeout", 45*time.Minute, "each binary's -test.timeout")
	flag.Var(&o.buildFlags, "buildflag", "a go test -c flag (repeat it for more)")
	flag.Var(&o.testFlags, "testflag", "a flag for every test binary, such as -test.run=X (repeat it for more)")
	flag.BoolVar(&o.verbose, "v", false, "print every binary's output and when each starts")
	flag.BoolVar(&o.linkOnly, "link-only", false, "link the binaries and run nothing (make test-prepare)")
	flag.Var(&o.legEnv, "leg-env", "a leg's added environment, NAME=VALUE (repeat it for more)")
	flag.StringVar(&o.legSkip, "leg-skip", "", "the tests a leg skips (-test.skip)")
	flag.StringVar(&o.legPkgs, "leg-pkgs", "", "comma-separated package patterns the leg runs again")
	flag.Parse()
	o.patterns = flag.Args()
	if o.out == "" || len(o.patterns) == 0 || o.lanes < 1 || o.bigLanes < 1 {
		fmt.Fprintln(os.Stderr, "usage: runtests -o DIR [flags] PACKAGES...")
		flag.PrintDefaults()
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	code := runAll(ctx, o, os.Stdout)
	stop()
	os.Exit(code)
}

// pkgInfo is what go list says of a package.
type pkgInfo struct {
	importPath, dir string
	hasTests        bool
}

func runAll(ctx context.Context, o options, w io.Writer) int {
	start := time.Now()
	pkgs, err := list(ctx, o.patterns)
	if err != nil {
		fmt.Fprintln(w, err)
		return 1
	}
	big, err := importPaths(ctx, o.big)
	if err != nil {
		fmt.Fprintln(w, err)
		return 1
	}
	leg, err := importPaths(ctx, o.legPkgs)
	if err != nil {
		fmt.Fprintln(w, err)
		return 1
	}
	binaries, err := link(ctx, o, pkgs, w)
	if err != nil {
		fmt.Fprintln(w, err)
		return 1
	}
	if o.linkOnly {
		return 0
	}
	var runs []run
	for _, p := range pkgs {
		if !p.hasTests {
			fmt.Fprintf(w, "?   \t%s\t[no test files]\n", p.importPath)
			continue
		}
		runs = append(runs, run{Label: p.importPath, Dir: p.dir, Binary: binaries[p.importPath], Big: big[p.importPath]})
	}
	for _, p := range pkgs {
		if !leg[p.importPath] || !p.hasTests {
			continue
		}
		r := run{Label: p.importPath + " [" + o.legEnv.String() + "]", Dir: p.dir, Binary: binaries[p.importPath], Big: big[p.importPath], Env: o.legEnv}
		if o.legSkip != "" {
			r.Args = []string{"-test.skip=" + o.legSkip}
		}
		runs = append(runs, r)
	}
	failed := schedule(ctx, o, runs, w)
	if ctx.Err() != nil {
		fmt.Fprintf(w, "runtests: interrupted after %s\n", time.Since(start).Round(time.Second))
		return 1
	}
	fmt.Fprintf(w, "runtests: %d runs, %d failed, %s\n", len(runs), failed, time.Since(start).Round(time.Second))
	if failed > 0 {
		return 1
	}
	return 0
}

// list is the packages patterns name, in the patterns' order (go list
// keeps it, and names each package once).
func list(ctx context.Context, patterns []string) ([]pkgInfo, error) {
	args := append([]string{"list", "-f", "{{.ImportPath}}\t{{.Dir}}\t{{if or .TestGoFiles .XTestGoFiles}}tests{{end}}"}, patterns...)
	out, err := exec.CommandContext(ctx, "go", args...).Output()
	if err != nil {
		return nil, fmt.Errorf("go list %s: %w%s", strings.Join(patterns, " "), err, stderrOf(err))
	}
	var pkgs []pkgInfo
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Split(line, "\t")
		if len(f) != 3 {
			return nil, fmt.Errorf("go list printed %q", line)
		}
		pkgs = append(pkgs, pkgInfo{importPath: f[0], dir: f[1], hasTests: f[2] == "tests"})
	}
	return pkgs, nil
}

// importPaths is the set of packages the comma-separated patterns name.
func importPaths(ctx context.Context, patterns string) (map[string]bool, error) {
	set := map[string]bool{}
	if patterns == "" {
		return set, nil
	}
	pkgs, err := list(ctx, strings.Split(patterns, ","))
	if err != nil {
		return nil, err
	}
	for _, p := range pkgs {
		set[p.importPath] = true
	}
	return set, nil
}

// link builds the test binaries of the packages that have tests into
// o.out. go test -c -o DIR/ names a binary ELEMENT.test, so packages whose
// last elements clash (bench/agent beside agent) go in folders of their
// own, numbered by their order among the module's packages of that name:
// a package's binary is always the same file, whichever packages a run
// names. It returns each package's binary.
func link(ctx context.Context, o options, pkgs []pkgInfo, w io.Writer) (map[string]string, error) {
	all, err := list(ctx, []string{"./..."})
	if err != nil {
		return nil, err
	}
	slot := map[string]int{}
	named := map[string]int{}
	for _, p := range append(all, pkgs...) {
		if _, ok := slot[p.importPath]; ok || !p.hasTests {
			continue
		}
		name := path.Base(p.importPath)
		slot[p.importPath] = named[name]
		named[name]++
	}
	var rounds [][]string
	binaries := map[string]string{}
	for _, p := range pkgs {
		if !p.hasTests {
			continue
		}
		k := slot[p.importPath]
		for len(rounds) <= k {
			rounds = append(rounds, nil)
		}
		rounds[k] = append(rounds[k], p.importPath)
		binaries[p.importPath] = filepath.Join(o.out, fmt.Sprint(k), path.Base(p.importPath)+".test")
	}
	for k, round := range rounds {
		if len(round) == 0 {
			continue
		}
		dir := filepath.Join(o.out, fmt.Sprint(k))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, err
		}
		args := append([]string{"test", "-c", "-o", dir + "/"}, o.buildFlags...)
		cmd := exec.CommandContext(ctx, "go", append(args, round...)...)
		cmd.Stdout, cmd.Stderr = w, w
		if err := cmd.Run(); err != nil {
			// A package that did not build may have left an older binary
			// behind: nothing runs.
			return nil, fmt.Errorf("go test -c: %w", err)
		}
	}
	return binaries, nil
}

// schedule runs runs, as many at a time as lanesNow says and at most
// o.bigLanes big ones (next), printing each result as it comes, and returns how many failed.
// Once ctx is done nothing new starts, and what runs is stopped.
func schedule(ctx context.Context, o options, runs []run, w io.Writer) int {
	started := make([]bool, len(runs))
	type result struct {
		i   int
		out []byte
		err error
		d   time.Duration
	}
	done := make(chan result)
	running, runningBig, failed, left := 0, 0, 0, len(runs)
	for left > 0 {
		for ctx.Err() == nil {
			i := next(runs, started, running, runningBig, lanesNow(runs, started, runningBig, o.lanes, o.tailLanes), o.bigLanes)
			if i < 0 {
				break
			}
			started[i] = true
			running++
			if runs[i].Big {
				runningBig++
			}
			if o.verbose {
				fmt.Fprintf(w, "=== start %s\n", runs[i].Label)
			}
			go func(i int) {
				t := time.Now()
				out, err := execute(ctx, o, runs[i])
				done <- result{i, out, err, time.Since(t)}
			}(i)
		}
		if running == 0 {
			// Interrupted before these started.
			break
		}
		r := <-done
		running--
		left--
		if runs[r.i].Big {
			runningBig--
		}
		if r.err != nil || o.verbose {
			w.Write(r.out)
		}
		if r.err != nil {
			failed++
			fmt.Fprintf(w, "FAIL\t%s\t%.3fs\n", runs[r.i].Label, r.d.Seconds())
		} else {
			fmt.Fprintf(w, "ok  \t%s\t%.3fs\n", runs[r.i].Label, r.d.Seconds())
		}
	}
	return failed
}

// execute runs one test binary in its package's folder, as go test does,
// and returns its output. The binary gets SIGKILL if this process dies
// (its own children have the same from testenv), so that a killed make
// test leaves no test running; a binary still running a minute after its
// own -test.timeout gets SIGQUIT (a goroutine dump), then SIGKILL.
func execute(ctx context.Context, o options, r run) ([]byte, error) {
	// Pdeathsig is the thread's, not the process's: the thread that
	// starts the child stays locked to this goroutine, and so alive,
	// until the child is gone.
	runtime.LockOSThread()
	ctx, cancel := context.WithTimeout(ctx, o.timeout+time.Minute)
	defer cancel()
	args := append([]string{"-test.paniconexit0", "-test.timeout=" + o.timeout.String(), "-test.count=1"}, o.testFlags...)
	if o.verbose {
		args = append(args, "-test.v=true")
	}
	cmd := exec.CommandContext(ctx, r.Binary, append(args, r.Args...)...)
	cmd.Dir = r.Dir
	// Environ sets $PWD to Dir, as go test does: processes that compare
	// $PWD with their folder (Python's os.getcwd does not, torchrun's
	// workers inherit it) see the package's folder.
	cmd.Env = append(cmd.Environ(), r.Env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return cmd.Process.Signal(syscall.SIGQUIT)
		}
		// Interrupted: the binary stops as under go test (its
		// TestMain's deferred cleanups do not run; the next start
		// removes what it left, testenv).
		return cmd.Process.Signal(syscall.SIGTERM)
	}
	cmd.WaitDelay = 30 * time.Second
	err := cmd.Run()
	return out.Bytes(), err
}

func stderrOf(err error) string {
	var ee *exec.ExitError
	if errors.As(err, &ee) && len(ee.Stderr) > 0 {
		return "\n" + string(ee.Stderr)
	}
	return ""
}

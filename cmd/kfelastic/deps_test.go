package main

import (
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// The kfelastic binary runs in every training pod, so its memory is paid per
// pod (the agent's target: < 30 MiB RSS). Package init of flytestdlib's
// storage stack (stow, Azure, GCS) and of Kubernetes clients costs ≈50 MiB
// before main runs; those belong to the plugin (outputreader/flyteio,
// plugin/), never to this binary.
func TestBinaryLinksNoPluginStack(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, pkg := range strings.Fields(string(out)) {
		for _, banned := range []string{
			"github.com/flyteorg/flyte/flytestdlib/storage",
			"github.com/flyteorg/flyte/flyteplugins",
			"github.com/Azure/",
			"cloud.google.com/go/storage",
			"k8s.io/client-go",
			"sigs.k8s.io/controller-runtime",
			"github.com/kubeflow/training-operator",
			"github.com/kfelastic/kfelastic/outputreader/flyteio",
			"github.com/kfelastic/kfelastic/plugin",
		} {
			if strings.HasPrefix(pkg, banned) {
				t.Errorf("kfelastic links %s (via %s…): keep it out of the pod binary", pkg, banned)
			}
		}
	}
}

// docs/DESIGN.md §1.2's floor table is the code's: every package of the
// module (but tests' helpers, benchmarks and tools) is on exactly one
// floor, one above the highest floor it imports (0 for none of ours), and
// the binaries on top. The table was partly wrong for months.
func TestDesignFloors(t *testing.T) {
	design, err := os.ReadFile("../../docs/DESIGN.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, _ := strings.Cut(string(design), "### 1.2 Floors")
	section, _, _ = strings.Cut(section, "### 1.3")
	const top = 1 << 10
	floors := map[string]int{}
	row := regexp.MustCompile("(?m)^\\| (top|\\d+) \\| (.*) \\|$")
	for _, m := range row.FindAllStringSubmatch(section, -1) {
		floor := top
		if m[1] != "top" {
			floor, _ = strconv.Atoi(m[1])
		}
		for _, name := range regexp.MustCompile("`([^`]+)`").FindAllStringSubmatch(m[2], -1) {
			if _, dup := floors[name[1]]; dup {
				t.Errorf("%s is on two floors", name[1])
			}
			floors[name[1]] = floor
		}
	}
	out, err := exec.Command("go", "list", "-f", "{{.ImportPath}} {{join .Imports \" \"}}", "../../...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	const module = "github.com/kfelastic/kfelastic/"
	imports := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		pkg := strings.TrimPrefix(f[0], module)
		if strings.HasPrefix(pkg, "bench/") || strings.HasPrefix(pkg, "internal/test/") || pkg == "e2e" || pkg == "internal/ociimage/mkimage" {
			continue
		}
		imports[pkg] = nil
		for _, imp := range f[1:] {
			if dep, ours := strings.CutPrefix(imp, module); ours {
				imports[pkg] = append(imports[pkg], dep)
			}
		}
	}
	for pkg, deps := range imports {
		floor, ok := floors[pkg]
		if !ok {
			t.Errorf("%s is on no floor of docs/DESIGN.md §1.2", pkg)
			continue
		}
		want := 0
		for _, dep := range deps {
			want = max(want, floors[dep]+1)
		}
		if strings.HasPrefix(pkg, "cmd/") {
			want = top
		}
		if floor != want {
			t.Errorf("%s is on floor %d in docs/DESIGN.md §1.2; its imports (%s) put it on %d", pkg, floor, strings.Join(deps, ", "), want)
		}
	}
	for pkg := range floors {
		if _, ok := imports[pkg]; !ok {
			t.Errorf("docs/DESIGN.md §1.2 names %s, which is not a package", pkg)
		}
	}
}

// Issue 30: Python's bytecode caches are the machine's, not the
// repository's (.gitignore has __pycache__/): none may be tracked, or a
// checkout carries one Python's stale compiled files into the worker
// image and every other Python rewrites them.
func TestNoBytecodeTracked(t *testing.T) {
	out, err := exec.Command("git", "ls-files", "--", ":(top,glob)**/*.py[co]", ":(top,glob)**/__pycache__/**").Output()
	if err != nil {
		t.Skipf("not a git checkout: %v", err)
	}
	if files := strings.Fields(string(out)); len(files) > 0 {
		t.Errorf("bytecode tracked (git rm --cached them): %v", files)
	}
}

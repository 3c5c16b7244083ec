package testenv

import (
	"context"
	"os"
	"os/exec"
)

// StaticBuild is the go build of the project's package pkg into out that
// the tests use for every binary they start in a pod or hand to a
// launcher: static (CGO_ENABLED=0) and -trimpath, as the release image's
// (internal/ociimage.GoBuildFlags). One set of build flags for all of them
// means the packages are compiled once on a cold machine, not once per
// flavour (the cmd tests' cgo build, the local tests' static one and the
// image's -trimpath one were three compiles of the same dependencies), and
// make test compiles them in advance, beside scripts/deps.sh (the
// Makefile's test-prepare).
func StaticBuild(ctx context.Context, out, pkg string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-o", out, pkg)
	cmd.Dir = ProjectRoot()
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	return cmd
}

// RaceBuildFlags are make test's build flags for its test binaries
// (the Makefile's RUNTESTS): -race, which needs cgo, and no symbol table.
var RaceBuildFlags = []string{"-race", "-ldflags=-s -w"}

// RaceBuild is the go build of pkg into out with the test binaries' flags
// (RaceBuildFlags), for a program that only ever runs on the test machine:
// flytepropeller with the plugin. Its ≈1,750 packages are then the ones
// make test's go vet compiled for the tests, and a cold machine compiles
// them once instead of twice (≈530 CPU-s on 2 cores, issue 26); it runs
// under the race detector, a few CPU-s more per run.
func RaceBuild(ctx context.Context, out, pkg string) *exec.Cmd {
	args := append([]string{"build"}, RaceBuildFlags...)
	cmd := exec.CommandContext(ctx, "go", append(args, "-o", out, pkg)...)
	cmd.Dir = ProjectRoot()
	cmd.Env = append(os.Environ(), "CGO_ENABLED=1")
	return cmd
}

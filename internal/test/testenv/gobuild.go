package testenv

import (
	"context"
	"os"
	"os/exec"
)

// StaticBuild is the go build of the project's package pkg into out that
// the tests use for every binary they start: static (CGO_ENABLED=0) and
// -trimpath, as the release image's (internal/ociimage.GoBuildFlags). One
// set of build flags for all of them means the packages are compiled
// once on a cold machine, not once per flavour (the cmd tests' cgo build,
// the local tests' static one and the image's -trimpath one were three
// compiles of the same dependencies), and make test compiles them in
// advance, beside scripts/deps.sh (the Makefile's test-prepare).
func StaticBuild(ctx context.Context, out, pkg string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-o", out, pkg)
	cmd.Dir = ProjectRoot()
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	return cmd
}

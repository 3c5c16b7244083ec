// Package ociimage builds kfelastic's image without a container daemon, as
// an OCI image layout: FROM scratch, one layer holding the static binary at
// /kfelastic (mode 0755, root), entrypoint ["/kfelastic"] — the image the
// repository's Dockerfile builds with a daemon. The plugin's init container
// runs `/kfelastic install DIR` from it and its master replica
// `/kfelastic master`, so nothing else belongs in the image.
//
// `make image` is
//
//	bin, _ := ociimage.BuildBinary(ctx, ociimage.BuildOptions{Version: v, Out: "out/image-build/kfelastic"})
//	img, _ := ociimage.Image(bin, ociimage.ImageOptions{Version: v})
//	_ = ociimage.WriteLayout("out/image", img, version.Tag(v))
//
// (internal/ociimage/mkimage). The layout can be pushed with any OCI tool,
// e.g. `skopeo copy oci:out/image docker://ghcr.io/kfelastic/kfelastic:TAG`.
package ociimage

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/kfelastic/kfelastic/internal/version"
)

// BinaryPath is where the image holds the binary, and its entrypoint
// (kfoperator.AgentBinaryInImage).
const BinaryPath = "/kfelastic"

// Source is the repository the image's labels name.
const Source = "https://github.com/kfelastic/kfelastic"

// GoBuildFlags are the `go build` flags of the image's binary, with
// CGO_ENABLED=0 and GOOS=linux in the environment: static (FROM scratch has
// no libc), no local paths, no symbol tables (the binary is copied into
// every training pod), the version stamped. The Dockerfile uses the same.
func GoBuildFlags(v string) []string {
	return []string{"-trimpath", "-ldflags", "-s -w -X " + version.LinkerFlag + "=" + v}
}

// BuildOptions say what BuildBinary builds.
type BuildOptions struct {
	// Version is stamped into the binary (version.LinkerFlag).
	Version string
	// Arch is the GOARCH; runtime.GOARCH when empty.
	Arch string
	// Out is the binary's path.
	Out string
	// ModuleDir is the module's root, where `go build ./cmd/kfelastic`
	// runs; the current folder when empty.
	ModuleDir string
}

// BuildBinary builds the static kfelastic binary for the image and returns
// its path.
func BuildBinary(ctx context.Context, o BuildOptions) (string, error) {
	if o.Out == "" {
		return "", errors.New("ociimage: BuildOptions.Out is empty")
	}
	arch := o.Arch
	if arch == "" {
		arch = runtime.GOARCH
	}
	args := append(append([]string{"build"}, GoBuildFlags(o.Version)...), "-o", o.Out, "./cmd/kfelastic")
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = o.ModuleDir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+arch)
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("ociimage: go %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return o.Out, nil
}

// ImageOptions describe the image around the binary.
type ImageOptions struct {
	// Version goes into the labels (org.opencontainers.image.version).
	Version string
	// Arch is the binary's GOARCH; runtime.GOARCH when empty.
	Arch string
	// Created is the image's and the file's time; the Unix epoch when zero,
	// so that the same binary gives the same image digest.
	Created time.Time
}

// Image is the FROM scratch image of the binary at binPath, with OCI media
// types.
func Image(binPath string, o ImageOptions) (v1.Image, error) {
	bin, err := os.ReadFile(binPath)
	if err != nil {
		return nil, fmt.Errorf("ociimage: %w", err)
	}
	created := o.Created
	if created.IsZero() {
		created = time.Unix(0, 0)
	}
	created = created.UTC()
	arch := o.Arch
	if arch == "" {
		arch = runtime.GOARCH
	}
	var tarball_ bytes.Buffer
	tw := tar.NewWriter(&tarball_)
	if err := tw.WriteHeader(&tar.Header{
		Typeflag: tar.TypeReg, Name: strings.TrimPrefix(BinaryPath, "/"), Mode: 0o755, Size: int64(len(bin)),
		ModTime: created, Format: tar.FormatPAX,
	}); err != nil {
		return nil, err
	}
	if _, err := tw.Write(bin); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	layerBytes := tarball_.Bytes()
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerBytes)), nil
	}, tarball.WithMediaType(types.OCILayer), tarball.WithCompressedCaching)
	if err != nil {
		return nil, fmt.Errorf("ociimage: layer: %w", err)
	}
	img := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", arch
	cf.Config.Entrypoint = []string{BinaryPath}
	cf.Config.Labels = map[string]string{
		"org.opencontainers.image.title":   "kfelastic",
		"org.opencontainers.image.source":  Source,
		"org.opencontainers.image.version": o.Version,
	}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return nil, err
	}
	img, err = mutate.Append(img, mutate.Addendum{Layer: layer, History: v1.History{
		Created: v1.Time{Time: created}, CreatedBy: "COPY kfelastic " + BinaryPath, Comment: "ociimage",
	}})
	if err != nil {
		return nil, err
	}
	return mutate.CreatedAt(img, v1.Time{Time: created})
}

// RefNameAnnotation names an image in a layout's index.json (the tag that
// `skopeo copy oci:DIR:TAG` selects).
const RefNameAnnotation = "org.opencontainers.image.ref.name"

// WriteLayout writes img as the only image of an OCI image layout at dir,
// named tag. The layout is written beside dir and renamed into place, so
// dir is either the old layout or the new one; an existing dir that is not
// an OCI layout is refused rather than replaced.
func WriteLayout(dir string, img v1.Image, tag string) error {
	if _, err := os.Stat(dir); err == nil {
		if _, err := os.Stat(filepath.Join(dir, "oci-layout")); err != nil {
			return fmt.Errorf("ociimage: %s exists and is not an OCI image layout; not replacing it", dir)
		}
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(filepath.Dir(dir), "."+filepath.Base(dir)+"-*")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	p, err := layout.Write(tmp, empty.Index)
	if err != nil {
		return fmt.Errorf("ociimage: %w", err)
	}
	if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{RefNameAnnotation: tag})); err != nil {
		return fmt.Errorf("ociimage: write %s: %w", dir, err)
	}
	// MkdirTemp made it 0700.
	if err := os.Chmod(tmp, 0o755); err != nil {
		return err
	}
	old := tmp + ".old"
	if err := os.Rename(dir, old); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if err := os.Rename(tmp, dir); err != nil {
		return err
	}
	return os.RemoveAll(old)
}

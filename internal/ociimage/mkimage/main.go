// Command mkimage is `make image`: it builds the static kfelastic binary and
// writes the FROM scratch image around it as an OCI image layout, without a
// container daemon (package ociimage).
//
//	go run ./internal/ociimage/mkimage -version v0.3.0 -out out/image
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"

	"github.com/kfelastic/kfelastic/internal/ociimage"
	"github.com/kfelastic/kfelastic/internal/version"
)

func main() {
	v := flag.String("version", "", "version stamped into the binary; the image's tag is derived from it (required)")
	out := flag.String("out", "out/image", "folder of the OCI image layout")
	arch := flag.String("arch", runtime.GOARCH, "GOARCH of the binary and the image")
	flag.Parse()
	if err := run(*v, *out, *arch); err != nil {
		fmt.Fprintln(os.Stderr, "mkimage:", err)
		os.Exit(1)
	}
}

func run(v, out, arch string) error {
	if v == "" {
		return fmt.Errorf("-version is required (make image passes git describe)")
	}
	bin, err := ociimage.BuildBinary(context.Background(), ociimage.BuildOptions{
		Version: v, Arch: arch, Out: filepath.Join(filepath.Dir(out), filepath.Base(out)+"-build", "kfelastic"),
	})
	if err != nil {
		return err
	}
	img, err := ociimage.Image(bin, ociimage.ImageOptions{Version: v, Arch: arch})
	if err != nil {
		return err
	}
	tag := version.Tag(v)
	if err := ociimage.WriteLayout(out, img, tag); err != nil {
		return err
	}
	digest, err := img.Digest()
	if err != nil {
		return err
	}
	fmt.Printf("%s: %s:%s (%s) %s\n", out, version.ImageRepository, tag, arch, digest)
	return nil
}

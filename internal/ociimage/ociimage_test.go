package ociimage

import (
	"archive/tar"
	"bytes"
	"context"
	"debug/elf"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/validate"

	"github.com/kfelastic/kfelastic/internal/version"
)

// TestImageRunsFromItsLayout builds the image as `make image` does, reads
// the OCI layout back with go-containerregistry, checks it is what the
// Dockerfile builds (FROM scratch: one layer, /kfelastic alone, 0755,
// static, entrypoint /kfelastic), and runs the binary taken out of the
// layer: `kfelastic version` says the image's version and `kfelastic install`
// copies it as the plugin's init container does.
func TestImageRunsFromItsLayout(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("runs the linux binary it builds")
	}
	if testing.Short() {
		// Seconds with a warm build cache; a cold one compiles the whole
		// binary (minutes here).
		t.Skip("builds the binary (run without -short)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	const v = "v0.0.0-test+dirty"
	tmp := t.TempDir()
	start := time.Now()
	bin, err := BuildBinary(ctx, BuildOptions{Version: v, Out: filepath.Join(tmp, "build", "kfelastic"), ModuleDir: moduleRoot(t)})
	if err != nil {
		t.Fatal(err)
	}
	built := time.Since(start)
	img, err := Image(bin, ImageOptions{Version: v})
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(tmp, "image")
	if err := WriteLayout(dir, img, version.Tag(v)); err != nil {
		t.Fatal(err)
	}
	// Writing again replaces the layout (make image twice).
	if err := WriteLayout(dir, img, version.Tag(v)); err != nil {
		t.Fatalf("second write: %v", err)
	}
	t.Logf("binary built in %v, layout written in %v", built.Round(time.Millisecond), (time.Since(start) - built).Round(time.Millisecond))

	// Read back.
	p, err := layout.FromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	idx, err := p.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(im.Manifests) != 1 || im.Manifests[0].Annotations[RefNameAnnotation] != "v0.0.0-test-dirty" {
		t.Fatalf("index %+v, want one image named v0.0.0-test-dirty", im.Manifests)
	}
	back, err := idx.Image(im.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	// Digests, sizes and diff IDs all agree.
	if err := validate.Image(back); err != nil {
		t.Fatalf("the layout's image does not validate: %v", err)
	}
	mt, _ := back.MediaType()
	cf, err := back.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if mt != "application/vnd.oci.image.manifest.v1+json" || cf.OS != "linux" || cf.Architecture != runtime.GOARCH ||
		!slices.Equal(cf.Config.Entrypoint, []string{"/kfelastic"}) || len(cf.Config.Cmd) != 0 ||
		cf.Config.Labels["org.opencontainers.image.version"] != v {
		t.Errorf("manifest %s, config %s/%s entrypoint %q cmd %q labels %v", mt, cf.OS, cf.Architecture, cf.Config.Entrypoint, cf.Config.Cmd, cf.Config.Labels)
	}
	layers, err := back.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("%d layers (%v), want 1 on scratch", len(layers), err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	hdr, err := tr.Next()
	if err != nil {
		t.Fatal(err)
	}
	if hdr.Name != "kfelastic" || hdr.Typeflag != tar.TypeReg || hdr.Mode != 0o755 || hdr.Uid != 0 || hdr.Gid != 0 {
		t.Errorf("layer entry %q type %c mode %o uid %d gid %d, want the file kfelastic 0755 root", hdr.Name, hdr.Typeflag, hdr.Mode, hdr.Uid, hdr.Gid)
	}
	extracted := filepath.Join(tmp, "from-layer", "kfelastic")
	if err := os.MkdirAll(filepath.Dir(extracted), 0o755); err != nil {
		t.Fatal(err)
	}
	data, err := io.ReadAll(tr)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(extracted, data, os.FileMode(hdr.Mode)); err != nil {
		t.Fatal(err)
	}
	if _, err := tr.Next(); err != io.EOF {
		t.Errorf("the layer holds more than /kfelastic: %v", err)
	}
	checkStatic(t, extracted)

	// Run it as the pods do.
	out, err := exec.CommandContext(ctx, extracted, "version").CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "kfelastic "+v {
		t.Errorf("kfelastic version: %q, %v", out, err)
	}
	shared := filepath.Join(tmp, "kfelastic-bin")
	if err := os.Mkdir(shared, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.CommandContext(ctx, extracted, "install", shared).CombinedOutput(); err != nil {
		t.Fatalf("kfelastic install: %v\n%s", err, out)
	}
	installed, err := os.ReadFile(filepath.Join(shared, "kfelastic"))
	if err != nil || !bytes.Equal(installed, data) {
		t.Fatalf("installed copy differs from the layer's binary (%d bytes, %v)", len(installed), err)
	}
	if out, err := exec.CommandContext(ctx, filepath.Join(shared, "kfelastic"), "version").CombinedOutput(); err != nil || !strings.Contains(string(out), v) {
		t.Errorf("installed kfelastic version: %q, %v", out, err)
	}
}

// The same binary gives the same image: the digest does not depend on when
// it was built. The second build is a second later on the clock of a
// testing/synctest bubble, which is the clock any time.Now in Image reads.
func TestImageIsReproducible(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		bin := filepath.Join(t.TempDir(), "kfelastic")
		if err := os.WriteFile(bin, bytes.Repeat([]byte("\x7fELF"), 1000), 0o755); err != nil {
			t.Fatal(err)
		}
		var digests []string
		for i := range 2 {
			if i > 0 {
				time.Sleep(1100 * time.Millisecond) // the bubble's clock: at once
			}
			img, err := Image(bin, ImageOptions{Version: "v1", Arch: "amd64"})
			if err != nil {
				t.Fatal(err)
			}
			d, err := img.Digest()
			if err != nil {
				t.Fatal(err)
			}
			digests = append(digests, d.String())
		}
		if digests[0] != digests[1] {
			t.Errorf("digests %v differ", digests)
		}
	})
}

// WriteLayout never replaces a folder that is not a layout.
func TestWriteLayoutRefusesOtherFolders(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "precious"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "kfelastic")
	if err := os.WriteFile(bin, []byte("x"), 0o755); err != nil {
		t.Fatal(err)
	}
	img, err := Image(bin, ImageOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := WriteLayout(dir, img, "t"); err == nil || !strings.Contains(err.Error(), "not an OCI image layout") {
		t.Errorf("WriteLayout over a plain folder: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "precious")); err != nil {
		t.Errorf("the folder was touched: %v", err)
	}
}

// The Dockerfile builds the same image for people with a daemon: the same
// go build flags (static, stamped version), FROM scratch, the binary at
// /kfelastic, the same entrypoint.
func TestDockerfileBuildsTheSameImage(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(moduleRoot(t), "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	df := string(raw)
	stages := regexp.MustCompile(`(?m)^FROM\s+(\S+)`).FindAllStringSubmatch(df, -1)
	if len(stages) == 0 || stages[len(stages)-1][1] != "scratch" {
		t.Errorf("the final stage is %v, want FROM scratch", stages)
	}
	final := df[strings.LastIndex(df, "FROM scratch"):]
	for _, want := range []string{
		"CGO_ENABLED=0",
		"-trimpath",
		`-ldflags "-s -w -X ` + version.LinkerFlag + `=${VERSION}"`,
		"./cmd/kfelastic",
	} {
		if !strings.Contains(df, want) {
			t.Errorf("Dockerfile lacks %q", want)
		}
	}
	for _, want := range []string{" /kfelastic\n", `ENTRYPOINT ["/kfelastic"]`} {
		if !strings.Contains(final, want) {
			t.Errorf("the scratch stage lacks %q:\n%s", want, final)
		}
	}
	if got := GoBuildFlags("V"); !slices.Equal(got, []string{"-trimpath", "-ldflags", "-s -w -X " + version.LinkerFlag + "=V"}) {
		t.Errorf("GoBuildFlags = %q: keep the Dockerfile in step", got)
	}
}

// checkStatic: FROM scratch has no dynamic loader and no libc.
func checkStatic(t *testing.T, path string) {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Errorf("%s is dynamically linked (has an interpreter): FROM scratch cannot run it", path)
		}
	}
	if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
		t.Errorf("%s needs %v", path, libs)
	}
}

func moduleRoot(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Dir(strings.TrimSpace(string(out)))
}

package kubeenv

import (
	"archive/tar"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// The one-node cluster pulls nothing: each image is written as an OCI image
// archive (an image layout in a tar stream) and imported into containerd
// with `ctr images import`. Layers stay uncompressed, so a 1.3 GB root file
// system is read once to be digested and once to be imported, never gzipped.

// ociBlob is one content-addressed blob of an archive.
type ociBlob struct {
	mediaType string
	digest    string // sha256:<hex>
	size      int64
	open      func() (io.ReadCloser, error)
}

func bytesBlob(mediaType string, b []byte) ociBlob {
	sum := sha256.Sum256(b)
	return ociBlob{mediaType: mediaType, digest: "sha256:" + hex.EncodeToString(sum[:]), size: int64(len(b)),
		open: func() (io.ReadCloser, error) { return io.NopCloser(strings.NewReader(string(b))), nil }}
}

// layerFile is an uncompressed layer tar on disk, with its digest (which is
// also its diff ID).
func layerFile(path string) (ociBlob, error) {
	f, err := os.Open(path)
	if err != nil {
		return ociBlob{}, err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return ociBlob{}, err
	}
	return ociBlob{mediaType: "application/vnd.oci.image.layer.v1.tar", digest: "sha256:" + hex.EncodeToString(h.Sum(nil)), size: n,
		open: func() (io.ReadCloser, error) { return os.Open(path) }}, nil
}

// imageSpec is what an image built here runs.
type imageSpec struct {
	entrypoint []string
	env        []string
	workdir    string
}

// ociImage is an image's manifest and blobs, ready to archive.
type ociImage struct {
	manifest ociBlob
	blobs    []ociBlob // config and layers
}

// newImage assembles an amd64 Linux image from uncompressed layers.
func newImage(layers []ociBlob, spec imageSpec) (ociImage, error) {
	diffIDs := make([]string, len(layers))
	descs := make([]map[string]any, len(layers))
	for i, l := range layers {
		diffIDs[i] = l.digest
		descs[i] = map[string]any{"mediaType": l.mediaType, "digest": l.digest, "size": l.size}
	}
	env := spec.env
	if len(env) == 0 {
		env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	}
	cfg, err := json.Marshal(map[string]any{
		"architecture": "amd64", "os": "linux", "created": time.Unix(0, 0).UTC(),
		"config": map[string]any{"Entrypoint": spec.entrypoint, "Env": env, "WorkingDir": spec.workdir},
		"rootfs": map[string]any{"type": "layers", "diff_ids": diffIDs},
	})
	if err != nil {
		return ociImage{}, err
	}
	config := bytesBlob("application/vnd.oci.image.config.v1+json", cfg)
	man, err := json.Marshal(map[string]any{
		"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
		"config": map[string]any{"mediaType": config.mediaType, "digest": config.digest, "size": config.size},
		"layers": descs,
	})
	if err != nil {
		return ociImage{}, err
	}
	return ociImage{manifest: bytesBlob("application/vnd.oci.image.manifest.v1+json", man), blobs: append([]ociBlob{config}, layers...)}, nil
}

// imageOf is a go-containerregistry image (the agent image, as `make
// image` builds it) as blobs, its layers as they are (gzip).
func imageOf(img v1.Image) (ociImage, error) {
	man, err := img.RawManifest()
	if err != nil {
		return ociImage{}, err
	}
	mt, err := img.MediaType()
	if err != nil {
		return ociImage{}, err
	}
	cfgName, err := img.ConfigName()
	if err != nil {
		return ociImage{}, err
	}
	cfg, err := img.RawConfigFile()
	if err != nil {
		return ociImage{}, err
	}
	out := ociImage{manifest: bytesBlob(string(mt), man), blobs: []ociBlob{{digest: cfgName.String(), size: int64(len(cfg)),
		open: func() (io.ReadCloser, error) { return io.NopCloser(strings.NewReader(string(cfg))), nil }}}}
	layers, err := img.Layers()
	if err != nil {
		return ociImage{}, err
	}
	for _, l := range layers {
		d, err := l.Digest()
		if err != nil {
			return ociImage{}, err
		}
		size, err := l.Size()
		if err != nil {
			return ociImage{}, err
		}
		out.blobs = append(out.blobs, ociBlob{digest: d.String(), size: size, open: l.Compressed})
	}
	return out, nil
}

// writeArchive writes img as an OCI image layout tar named name (a full
// reference, the name containerd and the kubelet will know it by).
func writeArchive(w io.Writer, name string, img ociImage) error {
	tag := name[strings.LastIndex(name, ":")+1:]
	index, err := json.Marshal(map[string]any{
		"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
		"manifests": []map[string]any{{
			"mediaType": img.manifest.mediaType, "digest": img.manifest.digest, "size": img.manifest.size,
			"platform":    map[string]string{"architecture": "amd64", "os": "linux"},
			"annotations": map[string]string{"io.containerd.image.name": name, "org.opencontainers.image.ref.name": tag},
		}},
	})
	if err != nil {
		return err
	}
	tw := tar.NewWriter(w)
	put := func(name string, size int64, r io.Reader) error {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: size, Typeflag: tar.TypeReg, ModTime: time.Unix(0, 0)}); err != nil {
			return err
		}
		n, err := io.Copy(tw, r)
		if err == nil && n != size {
			err = fmt.Errorf("%s: %d bytes, want %d", name, n, size)
		}
		return err
	}
	layout := `{"imageLayoutVersion":"1.0.0"}`
	if err := put("oci-layout", int64(len(layout)), strings.NewReader(layout)); err != nil {
		return err
	}
	if err := put("index.json", int64(len(index)), strings.NewReader(string(index))); err != nil {
		return err
	}
	seen := map[string]bool{}
	for _, b := range append([]ociBlob{img.manifest}, img.blobs...) {
		if seen[b.digest] {
			continue
		}
		seen[b.digest] = true
		r, err := b.open()
		if err != nil {
			return err
		}
		err = put("blobs/sha256/"+strings.TrimPrefix(b.digest, "sha256:"), b.size, r)
		r.Close()
		if err != nil {
			return err
		}
	}
	return tw.Close()
}

// writeTree writes the files under root into tw as a layer, under prefix
// ("" for a root file system). skip names folders (relative to root) whose
// contents are left out: a container gets its own /proc, /sys and /dev.
// Hard links are written as copies; sockets and devices are left out.
//
// Python's bytecode (__pycache__) goes in only with bytecode: without it
// every Python in a pod compiles each module it imports, torch's ≈1,100
// among them (≈1 CPU-s more per process; a replacement pod's import of
// torch took 3.8–4.5 s, 2.2–2.5 s with its bytecode). A tree whose bytecode is
// made at install (Debian's py3compile, scripts/deps.sh's compileall of
// flytekit) keeps it; a checkout's (examples/, testdata/) does not, as it
// varies with the machine that ran the scripts. Times are whole seconds,
// truncated: Python checks a .pyc against its source's int(st_mtime), and
// tar's default rounds to the nearest second instead.
func writeTree(tw *tar.Writer, root, prefix string, skip map[string]bool, bytecode bool) error {
	return filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		if rel == "." {
			return nil
		}
		if !bytecode && d.IsDir() && d.Name() == "__pycache__" {
			return fs.SkipDir
		}
		name := filepath.ToSlash(filepath.Join(prefix, rel))
		info, err := d.Info()
		if err != nil {
			return err
		}
		var link string
		switch mode := info.Mode(); {
		case mode&fs.ModeSymlink != 0:
			if link, err = os.Readlink(path); err != nil {
				return err
			}
		case mode.IsDir(), mode.IsRegular():
		default:
			return nil
		}
		h, err := tar.FileInfoHeader(info, link)
		if err != nil {
			return err
		}
		h.Name = name
		h.ModTime = h.ModTime.Truncate(time.Second)
		if info.IsDir() {
			h.Name += "/"
		}
		h.Uname, h.Gname = "", ""
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if info.IsDir() {
			if skip[rel] {
				return fs.SkipDir
			}
			return nil
		}
		if !info.Mode().IsRegular() {
			return nil
		}
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = io.CopyN(tw, f, h.Size)
		return err
	})
}

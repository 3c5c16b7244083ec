// Package version is kfelastic's version and the image published for it.
// The plugin defaults its agent image to the image of its own version, so
// that an elastic task works with the default configuration and the agent
// in the pods always matches the plugin that built them.
package version

import (
	"runtime/debug"
	"strings"
)

// Module is kfelastic's module path.
const Module = "github.com/kfelastic/kfelastic"

// ImageRepository is where releases publish the image that holds the
// static binary at /kfelastic (the Dockerfile and `make image` build it).
const ImageRepository = "ghcr.io/kfelastic/kfelastic"

// LinkerFlag is the -X flag that stamps a version into a build:
// -ldflags "-X github.com/kfelastic/kfelastic/internal/version.version=v0.3.0".
// `make build`, `make image` and the Dockerfile set it from git.
const LinkerFlag = Module + "/internal/version.version"

// version is set at link time (LinkerFlag); empty otherwise.
var version = ""

// Get is the version stamped at link time or, without one, the module's
// version as Go recorded it: the main module's (`go install
// github.com/kfelastic/kfelastic/cmd/kfelastic@v0.3.0`) or, where kfelastic
// is a dependency (the plugin linked into flytepropeller), the dependency's.
// "" when neither is known, as in tests and `go run` of a checkout.
func Get() string {
	if version != "" {
		return version
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return ""
	}
	return fromBuildInfo(bi)
}

func fromBuildInfo(bi *debug.BuildInfo) string {
	known := func(v string) bool { return v != "" && v != "(devel)" }
	if bi.Main.Path == Module && known(bi.Main.Version) {
		return bi.Main.Version
	}
	for _, d := range bi.Deps {
		if d.Path != Module {
			continue
		}
		if d.Replace != nil {
			// A replacement by a local folder has no version: unknown.
			if known(d.Replace.Version) {
				return d.Replace.Version
			}
			return ""
		}
		if known(d.Version) {
			return d.Version
		}
	}
	return ""
}

// Tag is the image tag of version v: v itself with the characters an OCI
// tag cannot hold ("+" of "+dirty" or "+incompatible") turned into "-",
// and "latest" when the version is unknown (a development build: set
// agentImage to the image you built).
func Tag(v string) string {
	if v == "" {
		return "latest"
	}
	// [A-Za-z0-9_][A-Za-z0-9._-]{0,127}
	b := []byte(v)
	for i, c := range b {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || (i > 0 && (c == '.' || c == '-'))
		if !ok {
			b[i] = '-'
			if i == 0 {
				b[i] = '_'
			}
		}
	}
	if len(b) > 128 {
		b = b[:128]
	}
	return string(b)
}

// Image is the published image of this build's version,
// ImageRepository:Tag(Get()).
func Image() string { return ImageOf(Get()) }

// ImageOf is the published image of version v.
func ImageOf(v string) string { return ImageRepository + ":" + Tag(strings.TrimSpace(v)) }

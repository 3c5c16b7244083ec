package version

import (
	"runtime/debug"
	"strings"
	"testing"
)

func TestFromBuildInfo(t *testing.T) {
	for name, c := range map[string]struct {
		bi   debug.BuildInfo
		want string
	}{
		"installed at a release": {debug.BuildInfo{Main: debug.Module{Path: Module, Version: "v0.3.0"}}, "v0.3.0"},
		"a checkout, go run":     {debug.BuildInfo{Main: debug.Module{Path: Module, Version: "(devel)"}}, ""},
		"linked into propeller": {debug.BuildInfo{Main: debug.Module{Path: "github.com/flyteorg/flyte/flytepropeller", Version: "v1.16.8"},
			Deps: []*debug.Module{{Path: "k8s.io/api", Version: "v0.34.1"}, {Path: Module, Version: "v0.3.1"}}}, "v0.3.1"},
		"replaced by a fork": {debug.BuildInfo{Main: debug.Module{Path: "propeller"},
			Deps: []*debug.Module{{Path: Module, Version: "v0.3.1", Replace: &debug.Module{Path: "example.com/fork", Version: "v0.3.2"}}}}, "v0.3.2"},
		"replaced by a folder": {debug.BuildInfo{Main: debug.Module{Path: "propeller"},
			Deps: []*debug.Module{{Path: Module, Version: "v0.3.1", Replace: &debug.Module{Path: "../kfelastic"}}}}, ""},
		"not there": {debug.BuildInfo{Main: debug.Module{Path: "other", Version: "v1.0.0"}}, ""},
	} {
		if got := fromBuildInfo(&c.bi); got != c.want {
			t.Errorf("%s: %q, want %q", name, got, c.want)
		}
	}
}

func TestTag(t *testing.T) {
	for v, want := range map[string]string{
		"":       "latest",
		"v0.3.0": "v0.3.0",
		"v0.0.0-20260622184139-3bc0884abcde+dirty": "v0.0.0-20260622184139-3bc0884abcde-dirty",
		"3bc0884-dirty": "3bc0884-dirty",
		".hidden":       "_hidden",
		"a/b:c":         "a-b-c",
	} {
		if got := Tag(v); got != want {
			t.Errorf("Tag(%q) = %q, want %q", v, got, want)
		}
	}
	if got := Tag(strings.Repeat("x", 200)); len(got) != 128 {
		t.Errorf("a 200-character version gives a %d-character tag", len(got))
	}
	if got := ImageOf("v0.3.0"); got != "ghcr.io/kfelastic/kfelastic:v0.3.0" {
		t.Errorf("ImageOf = %q", got)
	}
}

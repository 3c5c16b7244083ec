package testenv

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// flytepropeller shares make test's compiled packages only while its build
// flags are the test binaries': the Makefile's RUNTESTS -buildflag list.
func TestRaceBuildFlagsAreMakeTests(t *testing.T) {
	makefile, err := os.ReadFile(filepath.Join(ProjectRoot(), "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, m := range regexp.MustCompile(`-buildflag=((?:\\ |\S)+)`).FindAllStringSubmatch(string(makefile), -1) {
		if f := strings.ReplaceAll(m[1], `\ `, " "); f != "-vet=off" {
			got = append(got, f)
		}
	}
	if !slices.Equal(got, RaceBuildFlags) {
		t.Errorf("the Makefile's -buildflag list (less -vet=off) is %q, testenv.RaceBuildFlags %q", got, RaceBuildFlags)
	}
}

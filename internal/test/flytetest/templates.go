package flytetest

import (
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/flyteorg/flyte/flyteidl/gen/pb-go/flyteidl/core"
	"google.golang.org/protobuf/encoding/protojson"
)

// TemplatesDir is testdata/tasks at the module's root: the Flyte task
// templates (protojson) the kfoperator and plugin tests share.
func TemplatesDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "..", "testdata", "tasks")
}

// TemplateNames lists the templates whose file names start with prefix
// ("" for all), without the .json suffix.
func TemplateNames(t testing.TB, prefix string) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(TemplatesDir(), prefix+"*.json"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no task templates %s*.json under %s: %v", prefix, TemplatesDir(), err)
	}
	names := make([]string, len(files))
	for i, f := range files {
		names[i] = strings.TrimSuffix(filepath.Base(f), ".json")
	}
	return names
}

// LoadTemplate reads testdata/tasks/<name>.json.
func LoadTemplate(t testing.TB, name string) *core.TaskTemplate {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(TemplatesDir(), name+".json"))
	if err != nil {
		t.Fatal(err)
	}
	var tmpl core.TaskTemplate
	if err := protojson.Unmarshal(data, &tmpl); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return &tmpl
}

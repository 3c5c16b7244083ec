package agent

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A worker's TORCHELASTIC_ERROR_FILE that is a symbolic link is not
// followed (a link to /etc/shadow was read), and a file that is not JSON is
// not quoted: the pod's document says what was wrong with the file and
// nothing of what it held. Real workers (sh), a real document.
func TestErrorFileNeitherFollowedNorQuoted(t *testing.T) {
	secret := filepath.Join(t.TempDir(), "shadow")
	if err := os.WriteFile(secret, []byte(`root:$6$s3cr3t:19000::::::`+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]struct{ script, want string }{
		"link":     {`ln -s "$SECRET" "$TORCHELASTIC_ERROR_FILE"; exit 1`, "a symbolic link, not followed"},
		"not JSON": {`cat "$SECRET" > "$TORCHELASTIC_ERROR_FILE"; exit 1`, "not JSON (syntax error at byte 1)"},
	} {
		cfg, out := helperConfig(t, 1, "ok")
		cfg.Command = []string{"sh", "-c", c.script}
		cfg.Env = append(cfg.Env, "SECRET="+secret)
		dir := t.TempDir()
		cfg.ErrorPrefix = "file://" + dir
		ee, _ := runAgent(t, t.Context(), cfg)
		if ee == nil || ee.Code != 1 {
			t.Fatalf("%s: want exit 1, got %v\n%s", name, ee, out)
		}
		got := readDocument(t, dir, ee.Document)
		if !strings.Contains(got.Message, c.want) || strings.Contains(got.Message, "root") ||
			strings.Contains(got.Message, "'r'") || strings.Contains(got.Message, "s3cr3t") {
			t.Errorf("%s: document message %q, want it to say %q and nothing of the file", name, got.Message, c.want)
		}
	}
}

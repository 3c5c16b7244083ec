package agent

import (
	"path/filepath"
	"strings"
	"testing"
)

// Validation has no side effects: a configuration that meets the others
// through the master validates without reading its token or dialling the
// master; the rendezvous is made after it (Run), and an unreadable token is
// reported then.
func TestValidateDialsNothing(t *testing.T) {
	cfg := Config{Command: []string{"true"}, NProcPerNode: 1, MinNodes: 1, MaxNodes: 2, NodeRank: -1,
		RdzvEndpoint: "127.0.0.1:1", TokenFile: filepath.Join(t.TempDir(), "missing")}
	if err := cfg.validate(); err != nil {
		t.Fatalf("validate: %v", err)
	}
	if cfg.Rendezvous != nil {
		t.Errorf("validate chose a rendezvous: %T", cfg.Rendezvous)
	}
	if _, _, err := cfg.rendezvous(); err == nil || !strings.Contains(err.Error(), "--token-file") {
		t.Errorf("rendezvous with an unreadable token: %v", err)
	}
}

package agent

import (
	"net"
	"regexp"
	"strings"
	"testing"
)

// masterPortLine is a helper worker's MASTER_PORT, by local rank.
var masterPortLine = regexp.MustCompile(`\[default(\d)\]:master_port (\d+)`)

// Under the agent, workers that reach the store before rank 0 has bound its
// port are accepted and answered (they connect once, as torch does before
// its 1 s retry); rank 0 alone gets a private MASTER_PORT; the proxy is gone
// with the group. Without the proxy the same workers are refused.
func TestStoreProxyUnderAgent(t *testing.T) {
	cfg, out := helperConfig(t, 3, "store:300ms")
	if ee, _ := runAgent(t, t.Context(), cfg); ee != nil {
		t.Fatalf("with the proxy: %v\n%s", ee, out)
	}
	s := out.String()
	if strings.Count(s, "store answered") != 2 {
		t.Errorf("want ranks 1 and 2 answered:\n%s", s)
	}
	m := regexp.MustCompile(`master_port=(\d+)`).FindStringSubmatch(s)
	if m == nil {
		t.Fatalf("no rendezvous block:\n%s", s)
	}
	ports := map[string]string{}
	for _, pm := range masterPortLine.FindAllStringSubmatch(s, -1) {
		ports[pm[1]] = pm[2]
	}
	if ports["1"] != m[1] || ports["2"] != m[1] || ports["0"] == "" || ports["0"] == m[1] {
		t.Errorf("MASTER_PORT by local rank %v, round's %s: want rank 0's private, the others the round's", ports, m[1])
	}
	if ln, err := net.Listen("tcp", ":"+m[1]); err != nil {
		t.Errorf("round's port %s still taken after Run: %v", m[1], err)
	} else {
		ln.Close()
	}

	// Rank 0's store comes up 2 s late here (not 300 ms): the other ranks
	// must reach it before it is up even on a loaded machine, where a
	// cold make test started them more than 300 ms after rank 0.
	cfg, out = helperConfig(t, 3, "store:2s")
	cfg.NoStoreProxy = true
	ee, _ := runAgent(t, t.Context(), cfg)
	if ee == nil || !strings.Contains(out.String(), "store refused") {
		t.Errorf("without the proxy: want a refused worker and a failed pod, got %v\n%s", ee, out)
	}
}

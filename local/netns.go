package local

import (
	"crypto/rand"
	"fmt"
	"os"
	"os/exec"
	"strings"
)

// network puts each pod in a network namespace of its own, on a bridge with
// the master, so that cut-network can take one pod's link down for real:
// the pod's sockets then time out as on a broken node, while the others
// and the master carry on. It needs root and iproute2; without them pods
// share this machine's loopback and cut-network freezes the pod instead.
type network struct {
	bridge string
	subnet string // "10.213.X": the bridge is .1, pod index i is .(i+2)
	pods   []int  // indexes of the pods given a namespace
}

// newNetwork makes the job's bridge; nil and why not when it cannot.
func newNetwork(mark string) (*network, string) {
	if os.Geteuid() != 0 {
		return nil, "not root"
	}
	for _, tool := range []string{"ip", "nsenter"} {
		if _, err := exec.LookPath(tool); err != nil {
			return nil, tool + " is missing"
		}
	}
	b := make([]byte, 1)
	_, _ = rand.Read(b)
	n := &network{bridge: "kfl" + mark[:8], subnet: fmt.Sprintf("10.213.%d", b[0])}
	if err := ip("link", "add", n.bridge, "type", "bridge"); err != nil {
		return nil, err.Error()
	}
	if err := ip("addr", "add", n.subnet+".1/24", "dev", n.bridge); err != nil {
		n.close()
		return nil, err.Error()
	}
	if err := ip("link", "set", n.bridge, "up"); err != nil {
		n.close()
		return nil, err.Error()
	}
	return n, ""
}

func ip(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// gateway is the master's address on the bridge.
func (n *network) gateway() string { return n.subnet + ".1" }

// pod makes pod index i's namespace, with eth0 on the bridge, and returns
// the command prefix that runs a process in it and the pod's address.
func (n *network) pod(i int) (prefix []string, addr string, err error) {
	if i > 250 {
		return nil, "", fmt.Errorf("pod index %d: at most 251 pods with a network namespace each", i)
	}
	ns := n.namespace(i)
	addr = fmt.Sprintf("%s.%d", n.subnet, i+2)
	host := n.hostLink(i)
	steps := [][]string{
		{"netns", "add", ns},
		{"link", "add", host, "type", "veth", "peer", "name", "eth0", "netns", ns},
		{"link", "set", host, "master", n.bridge, "up"},
		{"-n", ns, "addr", "add", addr + "/24", "dev", "eth0"},
		{"-n", ns, "link", "set", "eth0", "up"},
		{"-n", ns, "link", "set", "lo", "up"},
	}
	n.pods = append(n.pods, i)
	for _, s := range steps {
		if err := ip(s...); err != nil {
			return nil, "", err
		}
	}
	return []string{"nsenter", "--net=/run/netns/" + ns, "--"}, addr, nil
}

func (n *network) namespace(i int) string { return fmt.Sprintf("%s-%d", n.bridge, i) }

func (n *network) hostLink(i int) string { return fmt.Sprintf("%sh%d", n.bridge, i) }

// cut takes pod index i's link down: nothing gets in or out any more.
func (n *network) cut(i int) error { return ip("link", "set", n.hostLink(i), "down") }

// close removes the namespaces (their links go with them) and the bridge.
func (n *network) close() {
	for _, i := range n.pods {
		// The pair goes with its host end at once; a namespace lingers
		// while the kernel still holds sockets of it.
		_ = ip("link", "del", n.hostLink(i))
		_ = ip("netns", "del", n.namespace(i))
	}
	_ = ip("link", "del", n.bridge)
}

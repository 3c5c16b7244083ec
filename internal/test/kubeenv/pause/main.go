// Command pause is the one-node test cluster's pod sandbox image
// (internal/test/kubeenv/cluster.go): it holds the pod's namespaces, reaps
// orphans as PID 1 and exits on SIGTERM or SIGINT, as Kubernetes' own pause
// does. The cluster builds it statically and imports it, since nothing is
// pulled from a registry.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sig := make(chan os.Signal, 4)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for s := range sig {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}

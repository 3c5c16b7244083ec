package main

import (
	"log/slog"

	"github.com/kfelastic/kfelastic/master/kube"
	"github.com/kfelastic/kfelastic/master/relaunch"
)

// kubeOwner is the master's pod owner on Kubernetes (master/kube) with the
// in-cluster credentials of the account the plugin made for it; nodeEvents
// is kube.Config.NodeEventNamespace.
func kubeOwner(namespace, job string, oom relaunch.OOM, taint bool, nodeEvents string, log *slog.Logger) (*kube.MasterOwner, error) {
	cfg, err := kube.InCluster(namespace, job)
	if err != nil {
		return nil, err
	}
	cfg.OOM, cfg.Logger, cfg.TaintNodes, cfg.NodeEventNamespace = oom, log, taint, nodeEvents
	o, err := kube.New(cfg)
	if err != nil {
		return nil, err
	}
	return kube.NewMasterOwner(o, log), nil
}

package main

import (
	"strings"
	"testing"
	"time"
)

// --tf-ps and --tf-workers make a TF PS job of their replicas, without
// --nnodes; a job without a ps, and chaos on a replica it lacks, are refused.
func TestLocalTFFlags(t *testing.T) {
	flags := func(ps, workers int, chaos ...string) *localFlags {
		return &localFlags{tfPS: ps, tfWorkers: workers, chaos: chaos, nproc: "1", launcher: "agent", memory: "0", job: "j",
			maxRelaunches: 3, heartbeatInterval: time.Second, heartbeatTimeout: 8 * time.Second, waiting: 2 * time.Second,
			checkTimeout: time.Minute, grace: 5 * time.Second}
	}
	o, err := flags(2, 1, "delete-pod:3@step=5").options([]string{"python3", "x.py"})
	if err != nil {
		t.Fatal(err)
	}
	if o.TF == nil || o.TF.PS != 2 || o.TF.Workers != 1 || o.MinNodes != 4 || o.MaxNodes != 4 {
		t.Errorf("options %+v, TF %+v: want 2 ps, 1 worker, 4 replicas", o, o.TF)
	}
	if _, err := flags(0, 2).options([]string{"x"}); err == nil || !strings.Contains(err.Error(), "--tf-ps 0") {
		t.Errorf("a TF job without a ps: %v", err)
	}
	if _, err := flags(1, 0, "delete-pod:2").options([]string{"x"}); err == nil {
		t.Errorf("chaos on rank 2 of a 2-replica TF job accepted")
	}
}

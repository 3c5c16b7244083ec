// Package kfoperator turns Flyte task templates of type "pytorch" and
// "tensorflow" into Kubeflow training-operator v1 objects, and a job's
// status plus its pods' statuses into a Flyte phase. It is pure: no
// clients, no clock; the time is passed in.
//
// The usage loop of a plugin is:
//
//	job, err := kfoperator.BuildPyTorchJob(tmpl, podTemplater, opts)   // BuildResource
//	…the plugin manager creates job…
//	j, _ := kfoperator.JobOf(obj)                                      // GetTaskPhase
//	if _, terminal := j.Terminal(); terminal {
//		report, _ := outputreader.Summarize(ctx, src, readOpts)        // memory flat in the documents
//		info, err := kfoperator.Phase(j, pods, report, now, cfg, taskInfo)
//	}
//
// Pod templates come from a PodTemplater so that this package does not need a
// TaskExecutionContext; the plugin renders them with flytek8s exactly as
// upstream flyteplugins does.
//
// Elastic jobs (a PyTorch task with an ElasticConfig) get the kfelastic
// agent: an init container copies the static binary from Options.AgentImage
// (/kfelastic in that image) into an emptyDir mounted at AgentBinDir in the
// primary container, whose command becomes
//
//	/kfelastic-bin/kfelastic agent --error-prefix URL --nnodes MIN:MAX … -- ORIGINAL COMMAND ARGS…
//
// and a Master replica runs `kfelastic master` from the agent image, with a
// per-job token (Secret), a service account and a Role that lets it patch
// this job's replica templates and delete its pods (MasterObjects).
package kfoperator

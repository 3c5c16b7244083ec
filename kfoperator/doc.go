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
// agent: an init container runs `/kfelastic install /kfelastic-bin` in
// Options.AgentImage (default: DefaultAgentImage, the image published for
// this build's version), the static binary copying itself into an emptyDir
// mounted at AgentBinDir in the primary container — the image needs nothing
// else, FROM scratch. The primary container's command becomes
//
//	/kfelastic-bin/kfelastic agent --launcher L --error-prefix URL --nnodes MIN:MAX … -- ORIGINAL COMMAND ARGS…
//
// with L = command when the original runs pyflyte-execute or
// pyflyte-fast-execute (every flytekit Elastic task: torch's elastic_launch
// inside starts the workers, the agent runs the command once and relays
// torch's store to the master), else L = agent (the agent starts
// --nproc-per-node workers itself). See LauncherOf.
//
// A Master replica runs `kfelastic master` from the agent image, with a
// per-job token (Secret), a service account and a Role that lets it patch
// this job's replica templates and delete its pods (MasterObjects).
package kfoperator

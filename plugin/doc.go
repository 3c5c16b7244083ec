// Package plugin is kfelastic's flytepropeller plugin for the "pytorch" and
// "tensorflow" task types. Importing it registers both through
// pluginmachinery.PluginRegistry().RegisterK8sPlugin, with the IDs
// "kfelastic-pytorch" and "kfelastic-tensorflow"; propeller's configuration
// selects them for the task types (tasks.task-plugins.enabled-plugins and
// default-for-task-types). The plugins.kfelastic config section (Config)
// tunes them.
//
// Per round propeller calls:
//
//	BuildResource  → kfoperator.BuildPyTorchJob / BuildTFJob over flytek8s pod
//	                 templates; for elastic jobs also the master's Secret,
//	                 ServiceAccount, Role and RoleBinding
//	GetTaskPhase   → while running: the job's condition; once Succeeded or
//	                 Failed: list the job's pods, outputreader.Summarize the error
//	                 documents under the task's output prefix, and
//	                 kfoperator.Phase decides — wait for late documents,
//	                 synthesize missing ones, root cause → retryable or
//	                 permanent failure
//
// The clock is read once per GetTaskPhase call and passed down.
package plugin

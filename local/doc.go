// Package local runs a whole elastic job on one machine, as it would run on
// Kubernetes with the training operator (docs/DESIGN.md §6): the kfelastic
// master in-process, and one "pod" per node, a `kfelastic agent` process in
// its own process group (and cgroup, and network namespace when asked),
// named <job>-worker-<i>. It is `kfelastic local`'s engine and the harness
// of the end-to-end scenarios of docs/DESIGN.md §8.
//
// The pure parts are separate from the processes: ParseChaos reads
// --chaos ACTION:TARGET@WHEN; Job keeps the job's books, a state machine
// fed events with their time (pods started, steps printed, the master's
// rounds and decisions, pods ended) that answers with what to do; inside it
// Book keeps the pods and slots as the operator and the scheduler would
// (names, next index for a relaunch with the same rank, pending pods). The
// Engine is the shell around them and the master's PodOwner: it carries out
// the master's relaunch decisions (a preemption is relaunched without
// spending budget, an OOM kill with twice the memory, a faulty node
// elsewhere), hears its rounds (master.Options.OnRound), reports pods that
// died without their agent saying so, injects the faults, and reads the
// root cause from the pods' error documents at the end. A TF job's pods
// have their own owner instead of the master (tfjob.go).
//
//	chaos, err := local.ParseChaos("delete-pod:1@step=20")
//	if err != nil { … } // refused before anything starts
//	res, err := local.Run(ctx, local.Options{MinNodes: 2, MaxNodes: 3, NProcPerNode: 2,
//		Out: "out/job", Chaos: []local.Chaos{chaos}, Command: []string{"python3", "train.py"}})
//	fmt.Println(res.Succeeded, res.Message, res.Documents)
package local

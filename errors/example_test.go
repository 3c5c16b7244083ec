package errors_test

import (
	"fmt"
	"time"

	kferrors "github.com/kfelastic/kfelastic/errors"
)

// A pod whose agent exited 200 before it could upload its document: the
// exit-code contract reads it back as the agent's NodeCheckFailed, not as
// a signal, on the plugin's side and the master's alike.
func ExampleClassifyPod() {
	finished := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	f, ok := kferrors.ClassifyPod(kferrors.PodStatus{
		Name: "job-worker-1", Phase: "Failed", Primary: "pytorch",
		Containers: []kferrors.ContainerStatus{{Name: "pytorch",
			Terminated: &kferrors.Termination{ExitCode: kferrors.ExitNodeCheckFailed, Reason: "Error", FinishedAt: finished}}},
	}, finished.Add(time.Minute))
	fmt.Println(ok, f.Code, f.Recoverable, f.Origin, f.Time.Format(time.TimeOnly))
	fmt.Println(kferrors.ExitCode(f), kferrors.CodeOfExit(137), kferrors.CodeOfExit(255))
	// Output:
	// true NodeCheckFailed true SYSTEM 03:04:05
	// 200 SignalSIGKILL NonZeroExit
}

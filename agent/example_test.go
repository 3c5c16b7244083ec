package agent

import (
	"fmt"
	"syscall"
	"time"

	kferrors "github.com/kfelastic/kfelastic/errors"
)

// A worker is kill -9'ed; the policy stops the group, spends one restart and
// starts the next attempt.
func ExamplePolicy() {
	p := NewPolicy(PolicyConfig{Pod: "job-worker-0", LocalWorkers: 2, MaxRestarts: 3, StopGrace: 5 * time.Second})
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	show := func(as []Action) {
		for _, a := range as {
			if sg, ok := a.(StartGroup); ok {
				r := sg.Round
				fmt.Printf("%T {Attempt:%d RestartCount:%d Round:%d GroupRank:%d GroupWorldSize:%d WorldSize:%d}\n",
					sg, sg.Attempt, sg.RestartCount, r.Number, r.GroupRank, r.GroupWorldSize, r.WorldSize)
				continue
			}
			fmt.Printf("%T %+v\n", a, a)
		}
	}
	show(p.Start())
	show(p.Step(RoundReady{Round: Round{Number: 1, GroupWorldSize: 1, WorldSize: 2}}, now))
	show(p.Step(WorkerExited{Attempt: 1, LocalRank: 1, Exit: kferrors.WorkerExit{Worker: "job-worker-0/1", Signal: syscall.SIGKILL}}, now.Add(time.Second)))
	show(p.Step(WorkerExited{Attempt: 1, LocalRank: 0, Exit: kferrors.WorkerExit{Worker: "job-worker-0/0", Signal: syscall.SIGTERM}}, now.Add(2*time.Second)))
	fmt.Println("restart count:", p.RestartCount())
	// Output:
	// agent.JoinRound {Restart: RestartCount:0}
	// agent.StartGroup {Attempt:1 RestartCount:0 Round:1 GroupRank:0 GroupWorldSize:1 WorldSize:2}
	// agent.SignalGroup {Attempt:1 Signal:terminated}
	// agent.JoinRound {Restart:failure RestartCount:1}
	// restart count: 1
}

package local_test

import (
	"fmt"

	"github.com/kfelastic/kfelastic/local"
)

// A chaos spec is parsed before anything starts; a bad one is refused with
// the part that is wrong named.
func ExampleParseChaos() {
	c, err := local.ParseChaos("kill-worker:1/0@step=20")
	fmt.Println(c.Action, c.Node, c.Worker, c.Step, err)
	_, err = local.ParseChaos("delete-pod:1/0@step=20")
	fmt.Println(err)
	// Output:
	// kill-worker 1 0 20 <nil>
	// --chaos "delete-pod:1/0@step=20": target "1/0": delete-pod acts on a whole pod: give a node rank (1), not a worker
}

// A relaunched pod takes the next index and keeps its rank.
func ExampleBook() {
	b := local.NewBook("job", 3, 3, 0)
	b.Schedule()
	b.Exited("job-worker-1")
	p := b.Relaunch(1, 0)
	fmt.Println(p.Name, p.Rank, p.Replaces)
	// Output:
	// job-worker-3 1 job-worker-1
}

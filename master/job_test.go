package master

import (
	"testing"
	"time"

	kferrors "github.com/kfelastic/kfelastic/errors"
)

// The job has succeeded when every member of the latest round has, and not
// before: one node done, the other still training, is not success.
func TestJobSucceeded(t *testing.T) {
	now := time.Unix(1000, 0)
	j, err := NewJob(Config{JobID: "j", MinNodes: 2, MaxNodes: 2, NodeUnit: 1, WaitingTimeout: time.Second, HeartbeatTimeout: time.Minute, JoinTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	a, b := NodeInfo{Pod: "a", Incarnation: "1", Rank: 0, LocalWorldSize: 1, Addr: "a", Port: 1}, NodeInfo{Pod: "b", Incarnation: "1", Rank: 1, LocalWorldSize: 1, Addr: "b", Port: 1}
	for _, n := range []NodeInfo{a, b} {
		if _, err := j.Join(n, 0, now); err != nil {
			t.Fatal(err)
		}
	}
	j.Tick(now.Add(2 * time.Second))
	if j.Latest() == nil || j.Succeeded() {
		t.Fatalf("round %v, succeeded %v: want a round, not succeeded", j.Latest(), j.Succeeded())
	}
	if _, err := j.Leave(a, true, kferrors.Failure{}, now.Add(3*time.Second)); err != nil {
		t.Fatal(err)
	}
	if j.Succeeded() {
		t.Fatal("succeeded with node b still training")
	}
	if _, err := j.Leave(b, true, kferrors.Failure{}, now.Add(4*time.Second)); err != nil {
		t.Fatal(err)
	}
	if !j.Succeeded() {
		t.Fatal("both nodes succeeded, the job did not")
	}
}

package local

import (
	"strings"
	"testing"
	"time"
)

func TestParseChaos(t *testing.T) {
	for _, tc := range []struct {
		spec string
		want Chaos
	}{
		{"delete-pod:1@step=10", Chaos{Action: DeletePod, Node: 1, Worker: -1, Step: 10}},
		{"kill-worker:1/0@step=5", Chaos{Action: KillWorker, Node: 1, Worker: 0, Step: 5}},
		{"kill-worker:2/3@after=1m30s", Chaos{Action: KillWorker, Node: 2, Worker: 3, After: 90 * time.Second}},
		{"kill-worker:2", Chaos{Action: KillWorker, Node: 2, Worker: 0}},
		{"straggler:0", Chaos{Action: Straggler, Node: 0, Worker: -1}},
		{"break-check:2@after=0s", Chaos{Action: BreakCheck, Node: 2, Worker: -1}},
		{"cut-network:1@step=3", Chaos{Action: CutNetwork, Node: 1, Worker: -1, Step: 3}},
		{"oom:0@step=7", Chaos{Action: OOM, Node: 0, Worker: -1, Step: 7}},
		{"fail-pod:3@after=5s", Chaos{Action: FailPod, Node: 3, Worker: -1, After: 5 * time.Second}},
		{"add-slot@step=20", Chaos{Action: AddSlot, Node: -1, Worker: -1, Step: 20}},
		{"kill-master@after=2s", Chaos{Action: KillMaster, Node: -1, Worker: -1, After: 2 * time.Second}},
	} {
		got, err := ParseChaos(tc.spec)
		if err != nil || got != tc.want {
			t.Errorf("ParseChaos(%q) = %+v, %v; want %+v", tc.spec, got, err, tc.want)
		}
	}
}

// Every error quotes the spec and names what is wrong in it.
func TestParseChaosErrors(t *testing.T) {
	for _, tc := range []struct{ spec, want string }{
		{"", `unknown action ""`},
		{"explode:1", `unknown action "explode": want one of delete-pod`},
		{"delete-pod", "delete-pod needs a TARGET"},
		{"delete-pod:@step=3", "delete-pod needs a TARGET"},
		{"delete-pod:x@step=3", `target "x": node rank "x": want a whole number ≥ 0`},
		{"delete-pod:-1", `node rank "-1"`},
		{"delete-pod:1/0", "delete-pod acts on a whole pod: give a node rank (1), not a worker"},
		{"kill-worker:1/a", `target "1/a": local rank "a"`},
		{"add-slot:1@step=3", `add-slot acts on the job, not on a pod: drop ":1"`},
		{"kill-master:0", "kill-master acts on the job"},
		{"oom:1@step", `WHEN "step": want step=N or after=DURATION`},
		{"oom:1@step=0", `WHEN "step=0": step wants a whole number from 1`},
		{"oom:1@step=-4", "step wants a whole number"},
		{"oom:1@after=soon", `WHEN "after=soon": after wants a duration`},
		{"oom:1@after=-1s", "after wants a duration"},
		{"oom:1@at=3", `unknown "at": want step=N or after=DURATION`},
		{"delete-pod: 1", `node rank " 1"`},
	} {
		_, err := ParseChaos(tc.spec)
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), `"`+tc.spec+`"`) {
			t.Errorf("ParseChaos(%q) = %v; want an error quoting the spec and saying %q", tc.spec, err, tc.want)
		}
	}
}

func TestChaosCheck(t *testing.T) {
	c, _ := ParseChaos("delete-pod:3@step=1")
	if err := c.Check(3, 2); err == nil || !strings.Contains(err.Error(), "ranks 0 to 2") {
		t.Errorf("node 3 of 3: %v", err)
	}
	c, _ = ParseChaos("kill-worker:1/2")
	if err := c.Check(3, 2); err == nil || !strings.Contains(err.Error(), "local ranks 0 to 1") {
		t.Errorf("worker 2 of 2: %v", err)
	}
	if err := c.Check(3, 3); err != nil {
		t.Errorf("worker 2 of 3: %v", err)
	}
}

// Whatever the input, ParseChaos does not panic, and what it accepts it
// prints back in a form that parses to the same spec.
func FuzzParseChaos(f *testing.F) {
	for _, s := range []string{"delete-pod:1@step=10", "kill-worker:1/0@after=2s", "add-slot@step=3", "oom:0", "x:1/2@step=99999999999999999999"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, spec string) {
		c, err := ParseChaos(spec)
		if err != nil {
			if !strings.Contains(err.Error(), "--chaos") {
				t.Fatalf("error without the flag: %v", err)
			}
			return
		}
		back, err := ParseChaos(c.String())
		if err != nil || back != c {
			t.Fatalf("%q → %+v → %q → %+v, %v", spec, c, c.String(), back, err)
		}
		if c.Step < 0 || c.After < 0 || (c.Node < 0) != (actions[c.Action] == noTarget) {
			t.Fatalf("%q → %+v", spec, c)
		}
	})
}

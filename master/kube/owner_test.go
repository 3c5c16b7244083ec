package kube

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/kfelastic/kfelastic/master/relaunch"
)

func TestNewChecksConfig(t *testing.T) {
	for _, cfg := range []Config{
		{Namespace: "ns", Job: "j"},
		{Host: "https://h:6443", Job: "j"},
		{Host: "https://h:6443", Namespace: "ns"},
		{Host: "ftp://h", Namespace: "ns", Job: "j"},
		{Host: "https://h:6443", Namespace: "ns", Job: "j", CAData: []byte("not pem")},
	} {
		if _, err := New(cfg); err == nil {
			t.Errorf("%+v accepted", cfg)
		}
	}
	o, err := New(Config{Host: "https://h:6443", Namespace: "ns", Job: "j"})
	if err != nil {
		t.Fatal(err)
	}
	if o.cfg.ReplicaType != "Worker" || o.cfg.Container != "pytorch" || o.cfg.OOM != relaunch.DefaultOOM {
		t.Errorf("defaults %+v", o.cfg)
	}
	for name, want := range map[string]bool{"j-worker-0": true, "j-worker-12": true, "j-master-0": false, "j-worker-01": false, "x-j-worker-0": false, "j-worker-": false} {
		if got := o.names.MatchString(name); got != want {
			t.Errorf("%s: %v", name, got)
		}
	}
}

func TestInClusterNeedsAPod(t *testing.T) {
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	if _, err := InCluster("ns", "j"); err == nil {
		t.Error("InCluster outside a pod")
	}
}

// Carry refuses what it must not do before any call: a pod of another job
// or replica type, a kind it does not carry out, a relaunch it cannot tell
// from its replacement.
func TestCarryRefusesBadActions(t *testing.T) {
	o, err := New(Config{Host: "https://127.0.0.1:1", Namespace: "ns", Job: "j", Logger: slog.New(slog.NewTextHandler(os.Stderr, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, a := range []Action{
		{Kind: relaunch.MoreMemory, Pod: "j-master-0", Time: time.Now()},
		{Kind: relaunch.MoreMemory, Pod: "other-worker-0", Time: time.Now()},
		{Kind: relaunch.Kind(100), Pod: "j-worker-0", Time: time.Now()}, // the master's StopJob
		{Kind: relaunch.Relaunch, Pod: "j-worker-0"},
	} {
		if err := o.Carry(ctx, a); !errors.Is(err, ErrInvalidAction) || !Permanent(err) {
			t.Errorf("%+v: %v", a, err)
		}
	}
	if err := o.Carry(ctx, Action{Kind: relaunch.None, Pod: "anything"}); err != nil {
		t.Errorf("None: %v", err)
	}
	// An unreachable server is worth retrying.
	err = o.Carry(ctx, Action{Kind: relaunch.MoreMemory, Pod: "j-worker-0", Time: time.Now()})
	if err == nil || Permanent(err) {
		t.Errorf("unreachable server: %v", err)
	}
}

// Which pod of a name failed, when the action does not say by UID.
func TestFailedIncarnation(t *testing.T) {
	o, err := New(Config{Host: "https://h", Namespace: "ns", Job: "j"})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 1, 2, 3, 0, 0, 0, time.UTC)
	second := podJSON(t, `{"phase":"Running"}`, "")
	second.Metadata.UID, second.Metadata.CreationTimestamp = "second", t0.Add(10*time.Second)
	// "first" ended at t0+10s and the operator replaced it by "second".
	history := func(secondEnded time.Time) []incarnation {
		return []incarnation{
			{uid: "first", created: t0, ended: t0.Add(10 * time.Second), node: "node-a"},
			{uid: "second", created: t0.Add(10 * time.Second), ended: secondEnded, node: "node-b"},
		}
	}
	for _, tc := range []struct {
		name        string
		a           Action
		secondEnded time.Time
		current     *pod
		want        string
	}{
		{name: "by UID", a: Action{UID: "first", Time: t0.Add(time.Minute)}, current: second, want: "first"},
		{name: "an unknown UID", a: Action{UID: "gone-long-ago"}, want: "gone-long-ago"},
		// The watch reported "first", the operator replaced it before the
		// master decided: the decision is about "first".
		{name: "the one that just ended", a: Action{Time: t0.Add(11 * time.Second)}, current: second, want: "first"},
		// Decided a minute later (an agent's report from the live pod).
		{name: "the newest before the decision", a: Action{Time: t0.Add(time.Minute)}, current: second, want: "second"},
		// The agent reported, then its pod ended just after the decision.
		{name: "ended right after the decision", a: Action{Time: t0.Add(time.Minute)}, secondEnded: t0.Add(time.Minute + time.Second), want: "second"},
		{name: "nothing before the decision", a: Action{Time: t0.Add(-time.Minute)}, current: second, want: ""},
		{name: "no time: the current pod", a: Action{}, current: second, want: "second"},
	} {
		o.history["j-worker-1"] = history(tc.secondEnded)
		tc.a.Pod = "j-worker-1"
		got := o.failedIncarnation(tc.a, tc.current)
		if (got == nil) != (tc.want == "") || got != nil && got.uid != tc.want {
			t.Errorf("%s: %+v, want %q", tc.name, got, tc.want)
		}
	}
}

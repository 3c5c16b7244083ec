package kube

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	kubeflowv1 "github.com/kubeflow/training-operator/pkg/apis/kubeflow.org/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/kfelastic/kfelastic/api/masterpb"
	kferrors "github.com/kfelastic/kfelastic/errors"
	"github.com/kfelastic/kfelastic/internal/test/kubeenv"
	"github.com/kfelastic/kfelastic/internal/test/mastertest"
	"github.com/kfelastic/kfelastic/master"
)

// TestMasterOwnsItsDecisions runs a real master whose pod owner is this
// package (NewMasterOwner over an Owner with the master service account's
// token, WatchFor reporting dead pods), against the real kube-apiserver,
// the Kubeflow training operator and simulated nodes
// (kubeenv.StartSimNodes). Agents are plain gRPC clients
// named after the job's worker pods. The test only plays the kubelet and
// the agents: the master notices, decides, and carries out its decisions
// itself (docs/DESIGN.md §5.6).
func TestMasterOwnsItsDecisions(t *testing.T) {
	if testing.Short() {
		t.Skip("needs kube-apiserver, and the training operator (scripts/deps.sh k8s); skipped under -short")
	}
	cfg := kubeenv.Kube(t)
	kubeenv.StartOperator(t, cfg)
	kubeenv.StartSimNodes(t, cfg, nodes...)

	t.Run("OOMKilledWorkerIsRelaunchedWithMoreMemory", func(t *testing.T) {
		e := newJobEnv(t, cfg, "moom")
		m := e.startMaster(t, master.Config{JobID: "moom", MinNodes: 2, MaxNodes: 2})
		w0 := e.waitRunning(t, "worker-0", "")
		w1 := e.waitRunning(t, "worker-1", "")
		a0, a1 := m.agent(0, w0), m.agent(1, w1)
		startRound(t, e.ctx, 1, a0, a1)

		// The kubelet reports worker-1 OOM-killed; nobody tells the master.
		e.setStatus(t, "worker-1", exited(137, "OOMKilled"))
		d := m.waitDecision(t, e.ctx, "RELAUNCH_MORE_MEMORY for rank 1", func(d *masterpb.Decision) bool {
			return d.GetKind() == masterpb.Decision_RELAUNCH_MORE_MEMORY && d.GetRank() == 1
		})
		if d.GetReason() != kferrors.CodeOOMKilled || !d.GetCounted() || d.GetPod() != e.name("worker-1") {
			t.Errorf("decision %v, want OOMKilled, counted, for %s", d, e.name("worker-1"))
		}
		// The round lost a member: the survivor restarts into the next.
		hb, err := a0.c.Heartbeat(e.ctx, &masterpb.HeartbeatRequest{Node: a0.n, Round: 1, WaitMs: 5000})
		if err != nil || hb.GetAction() != masterpb.HeartbeatResponse_RESTART {
			t.Errorf("survivor's heartbeat: %v %v, want RESTART", hb, err)
		}
		// The master carries it out: the template gets twice the memory and
		// the operator's replacement has it.
		p := e.waitPod(t, "worker-1", "a Running replacement with a 2Gi limit", func(p *corev1.Pod) bool {
			l := limit(p)
			return p.UID != w1.UID && p.Status.Phase == corev1.PodRunning && l.Cmp(resource.MustParse("2Gi")) == 0
		})
		if l, _ := e.templateMemory(t); l != "2Gi" {
			t.Errorf("job template: limit %s, want 2Gi", l)
		}
		if now := e.pod(t, "worker-0"); now == nil || now.UID != w0.UID {
			t.Error("worker-0 was replaced; only worker-1 was OOM-killed")
		}
		// The replacement's agent and the survivor form round 2.
		startRound(t, e.ctx, 2, a0, m.agent(1, p))
		st := m.status(t, e.ctx)
		if n := len(st.GetDecisions()); n != 1 {
			t.Errorf("%d decisions, want 1: %v", n, st.GetDecisions())
		}
		if r := st.GetNodes()[1].GetRelaunches(); r != 1 {
			t.Errorf("rank 1 relaunched %d times, want 1 (counted)", r)
		}
	})

	t.Run("FaultyNodeIsReplacedOnAnotherHost", func(t *testing.T) {
		e := newJobEnv(t, cfg, "mfaulty")
		m := e.startMaster(t, master.Config{JobID: "mfaulty", MinNodes: 2, MaxNodes: 2, NetworkCheck: true})
		w0 := e.waitRunning(t, "worker-0", "")
		w1 := e.waitRunning(t, "worker-1", "")
		if w0.Spec.NodeName != nodes[0] || w1.Spec.NodeName != nodes[0] {
			t.Fatalf("pods on %s and %s, want both on %s", w0.Spec.NodeName, w1.Spec.NodeName, nodes[0])
		}
		a0, a1 := m.agent(0, w0), m.agent(1, w1)
		// Both rounds of the check: worker-1 fails by itself each time.
		for _, a := range []*simAgent{a0, a1} {
			a.joinOnce(t, e.ctx, 0)
		}
		for round := int32(1); round <= 2; round++ {
			for _, a := range []*simAgent{a0, a1} {
				task := a.next(t, e.ctx, 0).GetCheck()
				if task == nil || task.GetRound() != round {
					t.Fatalf("%s: check task %v, want round %d", a.n.GetPod(), task, round)
				}
				rep := &masterpb.ReportCheckRequest{Node: a.n, Check: task.GetCheck(), Round: task.GetRound(), Ok: true,
					ElapsedNs: int64(100 * time.Millisecond)}
				if a == a1 {
					rep.Ok, rep.SelfFailed, rep.ElapsedNs, rep.Message = false, true, 0, "all-reduce crashed"
				}
				if _, err := a.c.ReportCheck(e.ctx, rep); err != nil {
					t.Fatal(err)
				}
			}
		}
		ex := a1.next(t, e.ctx, 0).GetExcluded()
		if ex.GetCode() != kferrors.CodeNodeCheckFailed || !ex.GetRelaunch() {
			t.Fatalf("faulty node's join: excluded %v, want NodeCheckFailed with relaunch", ex)
		}
		d := m.waitDecision(t, e.ctx, "RELAUNCH_AVOID_HOST for rank 1", func(d *masterpb.Decision) bool {
			return d.GetKind() == masterpb.Decision_RELAUNCH_AVOID_HOST && d.GetRank() == 1
		})
		if d.GetHost() != nodes[0] || d.GetReason() != kferrors.CodeNodeCheckFailed {
			t.Errorf("decision %v, want host %s, reason NodeCheckFailed", d, nodes[0])
		}
		// The master carries it out: the template avoids the host, and the
		// replacement runs elsewhere with that affinity.
		p := e.waitRunning(t, "worker-1", w1.UID)
		if p.Spec.NodeName != nodes[1] || !avoids(p, nodes[0]) {
			t.Errorf("replacement on %s with affinity %+v", p.Spec.NodeName, p.Spec.Affinity)
		}
		aff := e.job(t).Spec.PyTorchReplicaSpecs[kubeflowv1.PyTorchJobReplicaTypeWorker].Template.Spec.Affinity
		if aff == nil || aff.NodeAffinity == nil || aff.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil {
			t.Fatalf("template affinity %+v", aff)
		}
		terms := aff.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
		if len(terms) != 1 || len(terms[0].MatchExpressions) != 1 || terms[0].MatchExpressions[0].Key != HostnameLabel ||
			terms[0].MatchExpressions[0].Operator != corev1.NodeSelectorOpNotIn ||
			strings.Join(terms[0].MatchExpressions[0].Values, ",") != nodes[0] {
			t.Errorf("template affinity %+v", terms)
		}
		if now := e.pod(t, "worker-0"); now == nil || now.UID != w0.UID {
			t.Error("worker-0 was replaced; only worker-1 failed the check")
		}
		// The replacement is checked with worker-0; both pass; round 1.
		b1 := m.agent(1, p)
		b1.joinOnce(t, e.ctx, 0)
		for round := int32(1); round <= 2; round++ {
			for _, a := range []*simAgent{a0, b1} {
				task := a.next(t, e.ctx, 0).GetCheck()
				if task == nil || task.GetRound() != round {
					t.Fatalf("%s: check task %v, want round %d", a.n.GetPod(), task, round)
				}
				if _, err := a.c.ReportCheck(e.ctx, &masterpb.ReportCheckRequest{Node: a.n, Check: task.GetCheck(),
					Round: task.GetRound(), Ok: true, ElapsedNs: int64(100 * time.Millisecond)}); err != nil {
					t.Fatal(err)
				}
			}
		}
		startRound(t, e.ctx, 1, a0, b1)
		if n := len(m.status(t, e.ctx).GetDecisions()); n != 1 {
			t.Errorf("%d decisions, want 1", n)
		}
	})
}

// e2eMaster is a master serving on loopback whose pod owner is the job
// env's Owner.
type e2eMaster struct {
	*mastertest.Master
	c masterpb.MasterClient
}

// startMaster serves a master for cfg with NewMasterOwner(e.owner) as its
// pod owner and WatchFor running, until the test ends.
func (e *jobEnv) startMaster(t *testing.T, cfg master.Config) *e2eMaster {
	t.Helper()
	if cfg.HeartbeatTimeout == 0 {
		cfg.HeartbeatTimeout = 2 * time.Minute // the simulated agents call only when the test says
	}
	mo := NewMasterOwner(e.owner, e.logger)
	m := mastertest.StartWith(t, master.Options{Job: cfg, Owner: mo})
	ctx, cancel := context.WithCancel(e.ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		mo.WatchFor(ctx, m.Server)
	}()
	t.Cleanup(func() { cancel(); <-done }) // before the master stops
	conn, err := grpc.NewClient(m.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithPerRPCCredentials(jobToken(mastertest.Token)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &e2eMaster{Master: m, c: masterpb.NewMasterClient(conn)}
}

type jobToken string

func (b jobToken) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{master.TokenHeader: "Bearer " + string(b)}, nil
}
func (jobToken) RequireTransportSecurity() bool { return false }

func (m *e2eMaster) status(t *testing.T, ctx context.Context) *masterpb.StatusResponse {
	t.Helper()
	st, err := m.c.Status(ctx, &masterpb.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// waitDecision polls the master's Status until a decision matches.
func (m *e2eMaster) waitDecision(t *testing.T, ctx context.Context, what string, ok func(*masterpb.Decision) bool) *masterpb.Decision {
	t.Helper()
	var last *masterpb.StatusResponse
	for {
		last = m.status(t, ctx)
		for _, d := range last.GetDecisions() {
			if ok(d) {
				return d
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("timed out waiting for decision %s; decisions %v", what, last.GetDecisions())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// simAgent is a worker pod's agent as the master sees it: its gRPC calls.
type simAgent struct {
	c masterpb.MasterClient
	n *masterpb.Node
}

// agent is rank's agent in pod p (its UID is the incarnation, its node the
// host).
func (m *e2eMaster) agent(rank int, p *corev1.Pod) *simAgent {
	return &simAgent{c: m.c, n: &masterpb.Node{Pod: p.Name, Incarnation: string(p.UID), Rank: int32(rank), LocalWorldSize: 1,
		Addr: fmt.Sprintf("10.0.0.%d", rank+1), Port: 29500, Host: p.Spec.NodeName}}
}

// joinOnce joins without waiting.
func (a *simAgent) joinOnce(t *testing.T, ctx context.Context, after int64) *masterpb.JoinResponse {
	t.Helper()
	res, err := a.c.Join(ctx, &masterpb.JoinRequest{Node: a.n, AfterRound: after})
	if err != nil {
		t.Fatalf("%s: join: %v", a.n.GetPod(), err)
	}
	return res
}

// next long-polls Join until the answer is not pending.
func (a *simAgent) next(t *testing.T, ctx context.Context, after int64) *masterpb.JoinResponse {
	t.Helper()
	for {
		res, err := a.c.Join(ctx, &masterpb.JoinRequest{Node: a.n, AfterRound: after, WaitMs: 2000})
		if err != nil {
			t.Fatalf("%s: join: %v", a.n.GetPod(), err)
		}
		if res.GetPending() == nil {
			return res
		}
	}
}

// startRound has the agents join for the round after number-1 (each one
// first without waiting, so that the round can form) and checks that they
// all get round number.
func startRound(t *testing.T, ctx context.Context, number int64, agents ...*simAgent) {
	t.Helper()
	for _, a := range agents {
		a.joinOnce(t, ctx, number-1)
	}
	for i, a := range agents {
		r := a.next(t, ctx, number-1).GetRound()
		if r.GetNumber() != number || r.GetGroupRank() != int32(i) || r.GetGroupWorldSize() != int32(len(agents)) {
			t.Fatalf("%s: round %v, want round %d, group rank %d of %d", a.n.GetPod(), r, number, i, len(agents))
		}
	}
}

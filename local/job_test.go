package local

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"
	kferrors "github.com/kfelastic/kfelastic/errors"
	"github.com/kfelastic/kfelastic/master"
	"github.com/kfelastic/kfelastic/master/relaunch"
	"golang.org/x/sys/unix"
)

// TestJobScenarios replays the scripts in testdata/job against the Job
// bookkeeping: each a command, "----", and what the Job asked the engine
// to do.
// The runner does what the engine's carryOut does: it starts every pod the
// Job asks for (pids 1000, 1001, …) and tells the Job at once. Commands:
//
//	config [min=2] [max=2] [slots=…] [memory=768Mi] [tf-ps=1 tf-workers=1] [chaos=SPEC,SPEC…]
//	at 12s                     set the clock (from the scenario's start)
//	begin                      the job starts
//	refuse POD                 the pod's start will fail
//	step POD N                 the pod printed step N
//	restarts POD N             its agent printed restart_count=N
//	round N POD… [workers=W]   the master completed round N with these pods
//	decide SEQ KIND POD [reason=CODE] [counted] [msg=…]   a master's decision
//	stop SEQ MESSAGE…          the master stopped the job
//	caused POD CODE            the engine did CODE to the pod
//	exited POD ok|exit=N|signal=NAME|oom   its agent process ended
//	reported POD               its end is written and told
//	unwritten POD CODE         the engine could not write the pod's document
//	owner POD ok|CODE [user]   a TF pod's end, told to its owner (tfOwner)
//	tick                       time passes (timed chaos)
//	finish                     the engine stops
//	pods                       the view's table
//	outcome                    how the job ended
//
// The scripts are cockroachdb/datadriven files, as the master's scenarios
// and the agent's policy scripts: run with -rewrite to accept a deliberate
// change, then read the diff.
func TestJobScenarios(t *testing.T) {
	datadriven.Walk(t, "testdata/job", func(t *testing.T, path string) {
		s := &jobScript{t: t, t0: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), refused: map[string]bool{}}
		s.now = s.t0
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			return s.run(d.FullCmd())
		})
	})
}

type jobScript struct {
	t       *testing.T
	job     *Job
	tf      *tfOwner
	t0, now time.Time
	pids    int
	refused map[string]bool
}

func (s *jobScript) fail(format string, args ...any) {
	s.t.Helper()
	s.t.Fatalf(format, args...)
}

func (s *jobScript) num(v string) int64 {
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		s.fail("bad number %q", v)
	}
	return n
}

func (s *jobScript) pod(name string) Pod {
	p := s.job.book.Pod(name)
	if p == nil {
		s.fail("no pod %q", name)
	}
	return *p
}

// args reads key=value words (a bare word is key=true); msg= takes the rest.
func args(words []string) map[string]string {
	m := map[string]string{}
	for i, w := range words {
		k, v, ok := strings.Cut(w, "=")
		if k == "msg" {
			m[k] = strings.Join(append([]string{v}, words[i+1:]...), " ")
			break
		}
		if !ok {
			v = "true"
		}
		m[k] = v
	}
	return m
}

func (s *jobScript) run(command string) string {
	f := strings.Fields(command)
	var b strings.Builder
	switch f[0] {
	case "config":
		a := args(f[1:])
		cfg := JobConfig{Job: "job", MinNodes: 2, OOM: relaunch.DefaultOOM, Limits: "cgroup v2"}
		if v, ok := a["min"]; ok {
			cfg.MinNodes = int(s.num(v))
		}
		cfg.MaxNodes = cfg.MinNodes
		if v, ok := a["max"]; ok {
			cfg.MaxNodes = int(s.num(v))
		}
		cfg.Slots = cfg.MaxNodes
		if v, ok := a["slots"]; ok {
			cfg.Slots = int(s.num(v))
		}
		if v, ok := a["memory"]; ok {
			cfg.Memory = s.num(strings.TrimSuffix(v, "Mi")) << 20
		}
		if v, ok := a["chaos"]; ok {
			for spec := range strings.SplitSeq(v, ",") {
				c, err := ParseChaos(spec)
				if err != nil {
					s.fail("%v", err)
				}
				cfg.Chaos = append(cfg.Chaos, c)
			}
		}
		if _, ok := a["tf-ps"]; ok {
			tf := TF{PS: int(s.num(a["tf-ps"])), Workers: int(s.num(a["tf-workers"]))}
			cfg.TF, cfg.MinNodes, cfg.MaxNodes, cfg.Slots = &tf, tf.Replicas(), tf.Replicas(), tf.Replicas()
			s.tf = newTFOwner(tf, nil, relaunch.Policy{MaxPerRank: 3, OOM: relaunch.DefaultOOM})
		}
		s.job = NewJob(cfg)
		fmt.Fprintf(&b, "%d pods pending", len(s.job.book.Pods()))
	case "at":
		d, err := time.ParseDuration(f[1])
		if err != nil {
			s.fail("bad duration %q", f[1])
		}
		s.now = s.t0.Add(d)
		b.WriteString("t=" + f[1])
	case "begin":
		s.job.Begin(s.now)
	case "refuse":
		s.refused[f[1]] = true
		b.WriteString(f[1] + " will not start")
	case "step":
		s.job.Step(f[1], s.num(f[2]), s.now)
	case "restarts":
		s.job.Restarts(f[1], s.num(f[2]))
	case "round":
		r := master.CompletedRound{Number: s.num(f[1]), At: s.now}
		for _, w := range f[2:] {
			if v, ok := strings.CutPrefix(w, "workers="); ok {
				r.WorldSize = int(s.num(v))
			} else {
				r.Pods = append(r.Pods, w)
			}
		}
		if r.WorldSize == 0 {
			r.WorldSize = len(r.Pods)
		}
		s.job.Round(r)
	case "decide":
		p, a := s.pod(f[3]), args(f[4:])
		d := master.Decision{Seq: s.num(f[1]), Kind: s.kind(f[2]), Rank: p.Rank, Pod: p.Name, Reason: a["reason"],
			Message: a["msg"], Counted: a["counted"] == "true", Time: s.now}
		s.job.Carry(d, s.now)
	case "stop":
		s.job.Carry(master.Decision{Seq: s.num(f[1]), Kind: master.StopJob, Message: strings.Join(f[2:], " "), Time: s.now}, s.now)
	case "caused":
		s.job.Caused(f[1], f[2])
	case "exited":
		end := PodEnd{}
		switch v := f[2]; {
		case v == "ok":
			end.Succeeded = true
		case v == "oom":
			end.OOMKilled, end.Signal = true, unix.SIGKILL
		case strings.HasPrefix(v, "exit="):
			end.ExitStatus = int(s.num(strings.TrimPrefix(v, "exit=")))
		case strings.HasPrefix(v, "signal="):
			end.Signal = unix.SignalNum(strings.TrimPrefix(v, "signal="))
		default:
			s.fail("exited %s: want ok, oom, exit=N or signal=NAME", v)
		}
		e := s.job.Exited(f[1], end, s.now)
		fmt.Fprintf(&b, "%s: %s", f[1], e.Exit)
		if e.Document != nil {
			fmt.Fprintf(&b, "\ndocument %s (recoverable %v): %s", e.Document.Code, e.Document.Recoverable, e.Document.Message)
		}
	case "reported":
		s.job.Reported(f[1])
	case "unwritten":
		s.job.Unwritten(kferrors.SystemFailure(f[2], f[2]+" in "+f[1], f[1], s.now))
	case "owner":
		var fl *kferrors.Failure
		if f[2] != "ok" {
			fl = &kferrors.Failure{Code: f[2], Message: f[2] + " in " + f[1], Recoverable: len(f) < 4 || f[3] != "user"}
		}
		s.tf.tell(s.job, s.pod(f[1]), fl, s.now)
	case "tick":
		s.job.Tick(s.now)
		if d := s.job.Deadline(); !d.IsZero() {
			fmt.Fprintf(&b, "next chaos at %s", d.Sub(s.t0))
		}
	case "finish":
		s.job.Finish()
	case "pods":
		for _, r := range s.job.rows() {
			fmt.Fprintf(&b, "%s rank %d %s restarts=%d world=%d step=%d exit=%q\n", r.pod, r.rank, r.state, r.restarts, r.groupWorldSize, r.lastStep, r.exit)
		}
	case "outcome":
		o := s.job.Outcome()
		fmt.Fprintf(&b, "succeeded=%v stopped=%q done=%v recovery=%v", o.Succeeded, o.Stopped, s.job.Done(), o.Recovery)
		for _, f := range o.Unwritten {
			fmt.Fprintf(&b, "\nunwritten %s %s", f.Worker, f.Code)
		}
	default:
		s.fail("unknown command %q", f[0])
	}
	s.carryOut(&b)
	return strings.TrimSpace(b.String())
}

// kind reads a decision kind by its name (master.KindName).
func (s *jobScript) kind(name string) relaunch.Kind {
	if name == master.KindName(master.StopJob) {
		return master.StopJob
	}
	for k := relaunch.None; k < 10; k++ {
		if k.String() == name {
			return k
		}
	}
	s.fail("unknown decision kind %q", name)
	return 0
}

// carryOut prints what the Job asks, starting its pods as the engine does.
func (s *jobScript) carryOut(b *strings.Builder) {
	for r := s.job.Ready(); !r.empty(); r = s.job.Ready() {
		for _, n := range r.Notes {
			fmt.Fprintf(b, "\n%s: %s", n.Kind, n.Text)
		}
		for _, p := range r.Start {
			fmt.Fprintf(b, "\nstart %s", p.Name)
			if s.refused[p.Name] {
				s.job.StartFailed(p.Name, errors.New("no such file"))
				continue
			}
			s.job.Started(p.Name, 1000+s.pids, s.now)
			s.pids++
		}
		for _, in := range r.Inject {
			fmt.Fprintf(b, "\ninject %s into %s", in.Chaos, in.Pod)
		}
		for _, p := range r.FailOnJoin {
			fmt.Fprintf(b, "\nfail %s once the master knows it", p)
		}
		for _, sp := range r.Supersede {
			fmt.Fprintf(b, "\nsupersede %s's documents before %s (%s trains)", sp.Old, sp.Before.Sub(s.t0), sp.By)
		}
		for _, rp := range r.Reap {
			fmt.Fprintf(b, "\nreap %s after the grace", rp.Pod)
			if rp.Cause != "" {
				fmt.Fprintf(b, " (cause %s)", rp.Cause)
			}
			fmt.Fprintf(b, ": %s", rp.Note)
		}
		if r.RestartMaster {
			b.WriteString("\nrestart the master")
		}
	}
}

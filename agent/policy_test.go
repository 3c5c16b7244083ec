package agent

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"
	kferrors "github.com/kfelastic/kfelastic/errors"
	"golang.org/x/sys/unix"
)

// TestPolicyScripts replays the scenarios in testdata/policy/*.txt
// (cockroachdb/datadriven: a command, "----", what the policy answered; run
// with -rewrite to accept a deliberate change, then read the diff). Each
// command is one event, answered by the actions of the policy, one a line,
// in order (none: nothing). Times are offsets from the start ("1.5s").
// Commands:
//
//	config workers=2 max-restarts=1 grace=5s hang=0 dump=SIGUSR1 dump-timeout=10s [command]
//	at 1s round 1
//	at 2s exit attempt=1 rank=0 code=1|signal=KILL [torch=(Type: msg, 1.25s)] [oom] [recoverable]
//	at 2s progress attempt=1 rank=0 at=1.5s
//	at 2s membership round=1 | sigterm | signal SIGINT | tick | rdzv-failed [code=C] [no-relaunch]
//	deadline            the policy's Deadline ("none" if zero)
func TestPolicyScripts(t *testing.T) {
	datadriven.Walk(t, "testdata/policy", func(t *testing.T, path string) {
		var p *Policy
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			switch d.Cmd {
			case "config":
				p = NewPolicy(policyConfig(t, d))
				return formatActions(p.Start())
			case "deadline":
				return offset(p.Deadline())
			case "at":
				if len(d.CmdArgs) < 2 {
					d.Fatalf(t, "at TIME EVENT …")
				}
				now := at(t, d.CmdArgs[0].Key)
				return formatActions(p.Step(scriptEvent(t, d), now))
			}
			d.Fatalf(t, "unknown command %q", d.Cmd)
			return ""
		})
	})
}

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func at(t *testing.T, s string) time.Time {
	d, err := time.ParseDuration(s)
	if err != nil {
		t.Fatalf("time %q: %v", s, err)
	}
	return t0.Add(d)
}

func offset(tm time.Time) string {
	if tm.IsZero() {
		return "none"
	}
	return tm.Sub(t0).String()
}

// kv maps each argument to its first value ("" for a bare word).
func kv(args []datadriven.CmdArg) map[string]string {
	m := map[string]string{}
	for _, a := range args {
		m[a.Key] = ""
		if len(a.Vals) > 0 {
			m[a.Key] = a.Vals[0]
		}
	}
	return m
}

func num(t *testing.T, s string) int {
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatalf("number %q: %v", s, err)
	}
	return n
}

func dur(t *testing.T, s string) time.Duration {
	if s == "" {
		return 0
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		t.Fatalf("duration %q: %v", s, err)
	}
	return d
}

func policyConfig(t *testing.T, d *datadriven.TestData) PolicyConfig {
	m := kv(d.CmdArgs)
	c := PolicyConfig{Pod: "pod-0", LocalWorkers: num(t, m["workers"]), MaxRestarts: num(t, m["max-restarts"]),
		StopGrace: dur(t, m["grace"]), HangTimeout: dur(t, m["hang"]), DumpTimeout: dur(t, m["dump-timeout"])}
	if s := m["dump"]; s != "" {
		c.DumpSignal = unix.SignalNum(s)
	}
	c.Command = d.HasArg("command")
	return c
}

// scriptEvent reads "at TIME EVENT [operand] [key=value…]".
func scriptEvent(t *testing.T, d *datadriven.TestData) Event {
	name, args := d.CmdArgs[1].Key, d.CmdArgs[2:]
	operand := func() string {
		if len(args) == 0 {
			d.Fatalf(t, "%s needs an operand", name)
		}
		return args[0].Key
	}
	m := kv(args)
	switch name {
	case "round":
		return RoundReady{Round: Round{Number: num(t, operand()), GroupWorldSize: 1, WorldSize: 2}}
	case "rdzv-failed":
		_, noRelaunch := m["no-relaunch"]
		return RendezvousFailed{Message: "join timeout", Code: m["code"], NoRelaunch: noRelaunch}
	case "exit":
		rank := num(t, m["rank"])
		e := kferrors.WorkerExit{Worker: workerName("pod-0", rank)}
		if s, ok := m["code"]; ok {
			e.ExitCode = num(t, s)
		}
		if s, ok := m["signal"]; ok {
			e.Signal = unix.SignalNum("SIG" + s)
		}
		if a, ok := d.Arg("torch"); ok {
			msg, when := a.TwoVals(t)
			e.TorchError = &kferrors.TorchError{Message: msg, Time: at(t, when)}
		}
		_, e.OOM = m["oom"]
		_, e.RecoverableMarker = m["recoverable"]
		return WorkerExited{Attempt: num(t, m["attempt"]), LocalRank: rank, Exit: e, StartError: m["start-error"]}
	case "progress":
		return Progress{Attempt: num(t, m["attempt"]), LocalRank: num(t, m["rank"]), At: at(t, m["at"])}
	case "membership":
		return MembershipChanged{Round: num(t, m["round"])}
	case "sigterm":
		return Terminate{}
	case "signal":
		return Terminate{Signal: unix.SignalNum(operand())}
	case "tick":
		return Tick{}
	}
	d.Fatalf(t, "unknown event %q", name)
	return nil
}

// formatActions prints the actions one a line.
func formatActions(as []Action) string {
	var out []string
	for _, a := range as {
		switch a := a.(type) {
		case JoinRound:
			if a.Restart == "" {
				out = append(out, "join")
			} else {
				out = append(out, fmt.Sprintf("join restart=%s count=%d", a.Restart, a.RestartCount))
			}
		case StartGroup:
			out = append(out, fmt.Sprintf("start attempt=%d restart=%d round=%d", a.Attempt, a.RestartCount, a.Round.Number))
		case SignalGroup:
			out = append(out, fmt.Sprintf("signal attempt=%d %s", a.Attempt, unix.SignalName(a.Signal)))
		case WriteDocument:
			f := a.Failure
			out = append(out, fmt.Sprintf("document code=%s worker=%s time=%s recoverable=%t origin=%s",
				f.Code, f.Worker, offset(f.Time), f.Recoverable, f.Origin))
		case Exit:
			out = append(out, fmt.Sprintf("exit %d", a.Code))
		case WatchRound:
			out = append(out, fmt.Sprintf("watch round=%d", a.Round.Number))
		default:
			out = append(out, fmt.Sprintf("%T", a))
		}
	}
	return strings.Join(out, "\n")
}

// TestRootCauseMatchesReference checks RootCause against a dumb reference:
// sort a copy by the documented total order and take the first.
func TestRootCauseMatchesReference(t *testing.T) {
	workers := []string{"p/0", "p/1", "q/0"}
	for seed := range 500 {
		n := 1 + seed%5
		fs := make([]kferrors.Failure, n)
		for i := range fs {
			x := (seed*31 + i*17) % 7
			var tm time.Time
			if x != 0 {
				tm = t0.Add(time.Duration(x) * 300 * time.Millisecond)
			}
			fs[i] = kferrors.UserError("E", "", workers[(seed+i)%3], tm)
		}
		got := RootCause(fs)
		ref := append([]kferrors.Failure(nil), fs...)
		for i := range ref { // selection sort by (zero time last, time, worker)
			for j := i + 1; j < len(ref); j++ {
				a, b := ref[j], ref[i]
				less := false
				switch {
				case a.Time.IsZero() != b.Time.IsZero():
					less = !a.Time.IsZero()
				case !a.Time.Equal(b.Time):
					less = a.Time.Before(b.Time)
				default:
					less = a.Worker < b.Worker
				}
				if less {
					ref[i], ref[j] = ref[j], ref[i]
				}
			}
		}
		if got != ref[0] {
			t.Fatalf("seed %d: RootCause = %+v, reference %+v", seed, got, ref[0])
		}
	}
}

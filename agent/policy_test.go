package agent

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	kferrors "github.com/kfelastic/kfelastic/errors"
	"golang.org/x/sys/unix"
)

// TestPolicyScripts replays the scenarios in testdata/policy/*.txt. A script
// is a list of events, each followed by the actions the policy must answer
// with ("> " lines, in order; none means no action). Times are offsets from
// the start ("1.5s"). Lines:
//
//	config workers=2 max-restarts=1 grace=5s hang=0 dump=SIGUSR1 dump-timeout=10s [command]
//	at 1s round 1
//	at 2s exit attempt=1 rank=0 code=1|signal=KILL [torch="Type: msg"@1.25s] [oom] [recoverable]
//	at 2s progress attempt=1 rank=0 at=1.5s
//	at 2s membership round=1 | sigterm | signal SIGINT | tick | rdzv-failed [code=C] [no-relaunch]
//	deadline 7s         (the policy's Deadline, "none" if zero)
func TestPolicyScripts(t *testing.T) {
	files, err := filepath.Glob("testdata/policy/*.txt")
	if err != nil || len(files) == 0 {
		t.Fatalf("no scripts: %v", err)
	}
	for _, file := range files {
		t.Run(strings.TrimSuffix(filepath.Base(file), ".txt"), func(t *testing.T) { runScript(t, file) })
	}
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

func runScript(t *testing.T, file string) {
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var p *Policy
	var got []string // actions not yet matched
	lineNo := 0
	flush := func() {
		if len(got) > 0 {
			t.Errorf("%s:%d: unexpected actions:\n  %s", file, lineNo, strings.Join(got, "\n  "))
			got = nil
		}
	}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		lineNo++
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if want, ok := strings.CutPrefix(line, "> "); ok {
			if len(got) == 0 {
				t.Errorf("%s:%d: want %q, got no action", file, lineNo, want)
				continue
			}
			if got[0] != want {
				t.Errorf("%s:%d: want %q, got %q", file, lineNo, want, got[0])
			}
			got = got[1:]
			continue
		}
		flush()
		fields := splitFields(line)
		switch fields[0] {
		case "config":
			p = NewPolicy(policyConfig(t, fields[1:]))
			got = formatActions(p.Start())
		case "deadline":
			if d := offset(p.Deadline()); d != fields[1] {
				t.Errorf("%s:%d: deadline %s, want %s", file, lineNo, d, fields[1])
			}
		case "at":
			now := at(t, fields[1])
			got = formatActions(p.Step(scriptEvent(t, fields[2:]), now))
		default:
			t.Fatalf("%s:%d: unknown line %q", file, lineNo, line)
		}
	}
	flush()
}

// splitFields splits on spaces, keeping "quoted strings" whole.
func splitFields(line string) []string {
	var out []string
	var cur strings.Builder
	quoted := false
	for _, r := range line {
		switch {
		case r == '"':
			quoted = !quoted
		case r == ' ' && !quoted:
			if cur.Len() > 0 {
				out = append(out, cur.String())
				cur.Reset()
			}
		default:
			cur.WriteRune(r)
		}
	}
	if cur.Len() > 0 {
		out = append(out, cur.String())
	}
	return out
}

func kv(t *testing.T, fields []string) map[string]string {
	m := map[string]string{}
	for _, f := range fields {
		k, v, _ := strings.Cut(f, "=")
		m[k] = v
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

func policyConfig(t *testing.T, fields []string) PolicyConfig {
	m := kv(t, fields)
	c := PolicyConfig{Pod: "pod-0", LocalWorkers: num(t, m["workers"]), MaxRestarts: num(t, m["max-restarts"]),
		StopGrace: dur(t, m["grace"]), HangTimeout: dur(t, m["hang"]), DumpTimeout: dur(t, m["dump-timeout"])}
	if s := m["dump"]; s != "" {
		c.DumpSignal = unix.SignalNum(s)
	}
	_, c.Command = m["command"]
	return c
}

func scriptEvent(t *testing.T, fields []string) Event {
	m := kv(t, fields[1:])
	switch fields[0] {
	case "round":
		return RoundReady{Round: Round{Number: num(t, fields[1]), GroupWorldSize: 1, WorldSize: 2}}
	case "rdzv-failed":
		_, noRelaunch := m["no-relaunch"]
		return RendezvousFailed{Message: "join timeout", Code: m["code"], NoRelaunch: noRelaunch}
	case "exit":
		rank := num(t, m["rank"])
		e := kferrors.Exit{Worker: workerName("pod-0", rank)}
		if s, ok := m["code"]; ok {
			e.ExitCode = num(t, s)
		}
		if s, ok := m["signal"]; ok {
			e.Signal = unix.SignalNum("SIG" + s)
		}
		if s, ok := m["torch"]; ok {
			msg, when, _ := strings.Cut(s, "@")
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
		return Terminate{Signal: unix.SignalNum(fields[1])}
	case "tick":
		return Tick{}
	}
	t.Fatalf("unknown event %q", fields[0])
	return nil
}

func formatActions(as []Action) []string {
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
	return out
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

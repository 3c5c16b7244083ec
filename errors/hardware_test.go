package errors_test

import (
	"math/rand/v2"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/flyteorg/flyte/flyteidl/gen/pb-go/flyteidl/core"

	kferrors "github.com/kfelastic/kfelastic/errors"
)

// Every Xid the table names gets its code and severity; a critical one is
// the system's and recoverable, a user one the workload's (recoverable on
// the task's own retries), a warning explains no failure.
func TestXidTable(t *testing.T) {
	cases := []struct {
		kind     kferrors.FaultKind
		xid      int
		code     string
		severity kferrors.Severity
	}{
		{kferrors.FaultXid, 79, kferrors.CodeGpuFallenOffBus, kferrors.SeverityCritical},
		{kferrors.FaultXid, 48, kferrors.CodeGpuEccUncorrectable, kferrors.SeverityCritical},
		{kferrors.FaultXid, 94, kferrors.CodeGpuEccUncorrectable, kferrors.SeverityCritical},
		{kferrors.FaultXid, 95, kferrors.CodeGpuEccUncorrectable, kferrors.SeverityCritical},
		{kferrors.FaultXid, 140, kferrors.CodeGpuEccUncorrectable, kferrors.SeverityCritical},
		{kferrors.FaultXid, 63, kferrors.CodeGpuRowRemapPending, kferrors.SeverityCritical},
		{kferrors.FaultXid, 64, kferrors.CodeGpuRowRemapPending, kferrors.SeverityCritical},
		{kferrors.FaultXid, 74, kferrors.CodeGpuNvlinkError, kferrors.SeverityCritical},
		{kferrors.FaultXid, 119, kferrors.CodeGpuGspError, kferrors.SeverityCritical},
		{kferrors.FaultXid, 120, kferrors.CodeGpuGspError, kferrors.SeverityCritical},
		{kferrors.FaultXid, 62, kferrors.CodeGpuDeviceError, kferrors.SeverityCritical},
		{kferrors.FaultXid, 109, kferrors.CodeGpuDeviceError, kferrors.SeverityCritical},
		{kferrors.FaultXid, 13, kferrors.CodeGpuXidError, kferrors.SeverityUser},
		{kferrors.FaultXid, 31, kferrors.CodeGpuXidError, kferrors.SeverityUser},
		{kferrors.FaultXid, 43, kferrors.CodeGpuXidError, kferrors.SeverityUser},
		{kferrors.FaultXid, 45, kferrors.CodeGpuXidError, kferrors.SeverityUser},
		{kferrors.FaultXid, 92, kferrors.CodeGpuXidError, kferrors.SeverityWarn},
		{kferrors.FaultXid, 4242, kferrors.CodeGpuXidError, kferrors.SeverityWarn},
		{kferrors.FaultSXid, 12028, kferrors.CodeGpuNvlinkError, kferrors.SeverityCritical},
	}
	at := time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC)
	for _, c := range cases {
		g := kferrors.GPUFault{Kind: c.kind, Code: c.xid, Severity: kferrors.XidSeverity(c.kind, c.xid), GPUIndex: 1, Node: "n1"}
		if g.FailureCode() != c.code || g.Severity != c.severity {
			t.Errorf("%s %d: code %s severity %s, want %s %s", c.kind, c.xid, g.FailureCode(), g.Severity, c.code, c.severity)
		}
		f, ok := g.Failure("job-worker-1", at, "exit code 1")
		switch c.severity {
		case kferrors.SeverityWarn:
			if ok {
				t.Errorf("%s %d: a warning made a failure %+v", c.kind, c.xid, f)
			}
			continue
		case kferrors.SeverityCritical:
			if !ok || f.Origin != core.ExecutionError_SYSTEM || !f.Recoverable {
				t.Errorf("%s %d: %+v, want SYSTEM recoverable", c.kind, c.xid, f)
			}
		case kferrors.SeverityUser:
			if !ok || f.Origin != core.ExecutionError_USER || !f.Recoverable {
				t.Errorf("%s %d: %+v, want USER recoverable", c.kind, c.xid, f)
			}
		}
		if f.Code != c.code || f.Worker != "job-worker-1" || !f.Time.Equal(at) ||
			!strings.HasPrefix(f.Message, "[gpu-health] [") || !strings.HasSuffix(f.Message, ". exit code 1") || !strings.Contains(f.Message, "on node n1") {
			t.Errorf("%s %d: failure %+v", c.kind, c.xid, f)
		}
	}
	// The daemon's severity decides over the table's: an Xid the table
	// calls a warning that the daemon calls critical condemns the device
	// (a replacement goes elsewhere); a critical one it calls a warning
	// explains no failure.
	if g := (kferrors.GPUFault{Kind: kferrors.FaultXid, Code: 92, Severity: kferrors.SeverityCritical}); g.FailureCode() != kferrors.CodeGpuDeviceError ||
		!kferrors.IsHardwareCode(g.FailureCode()) {
		t.Errorf("Xid 92 the daemon calls critical: code %s", g.FailureCode())
	}
	if f, ok := (kferrors.GPUFault{Kind: kferrors.FaultXid, Code: 62, Severity: kferrors.SeverityWarn}).Failure("w", at, ""); ok {
		t.Errorf("Xid 62 the daemon calls a warning: failure %+v", f)
	}
	g := kferrors.GPUFault{Kind: kferrors.FaultXid, Code: 79, Severity: kferrors.SeverityCritical, GPUIndex: 3, GPUUUID: "GPU-1a2b-3c", Node: "gpu-7"}
	if want := "[gpu-health] [CRITICAL] Xid 79 (GPU has fallen off the bus) on GPU 3 GPU-1a2b-3c on node gpu-7."; g.Sentence() != want {
		t.Errorf("sentence %q, want %q", g.Sentence(), want)
	}
}

// The health daemon's events as they are written (the format Flyte 2's
// gpufault package renders and parses: a sentence, then a key=value tail).
func TestParseGPUEvent(t *testing.T) {
	cases := []struct {
		name, reason, msg string
		want              kferrors.GPUFault
		err               string
	}{
		{"xid 79", kferrors.EventReasonXid,
			"[gpu-health] [CRITICAL] Xid 79 (GPU has fallen off the bus) on GPU 3 GPU-1a2b-3c. xid=79 severity=critical gpu_uuid=GPU-1a2b-3c gpu_index=3 pci=0000:3b:00.0 node=ip-10-0-0-1 pid=4242 process=python3",
			kferrors.GPUFault{Kind: kferrors.FaultXid, Code: 79, Severity: kferrors.SeverityCritical, GPUUUID: "GPU-1a2b-3c", GPUIndex: 3,
				PCI: "0000:3b:00.0", Node: "ip-10-0-0-1", PID: 4242, Process: "python3"}, ""},
		{"sxid", kferrors.EventReasonSXid, "[gpu-health] [CRITICAL] SXid 22 on NVSwitch 0000:3b:00.0. sxid=22 severity=critical pci=0000:3b:00.0 node=n",
			kferrors.GPUFault{Kind: kferrors.FaultSXid, Code: 22, Severity: kferrors.SeverityCritical, GPUIndex: -1, PCI: "0000:3b:00.0", Node: "n"}, ""},
		{"a node's event naming the pod", kferrors.EventReasonXid,
			"[gpu-health] [CRITICAL] Xid 48 (Double bit ECC error) on GPU 1. xid=48 severity=critical gpu_index=1 node=n pod=job-worker-1 namespace=team-a",
			kferrors.GPUFault{Kind: kferrors.FaultXid, Code: 48, Severity: kferrors.SeverityCritical, GPUIndex: 1, Node: "n",
				Pod: "job-worker-1", Namespace: "team-a"}, ""},
		{"user xid", kferrors.EventReasonXid, "[gpu-health] [USER] Xid 31 (GPU memory page fault) on GPU 0 GPU-abc. xid=31 severity=user gpu_index=0",
			kferrors.GPUFault{Kind: kferrors.FaultXid, Code: 31, Severity: kferrors.SeverityUser, GPUIndex: 0}, ""},
		{"no severity: the table's", kferrors.EventReasonXid, "[gpu-health] Xid 48. xid=48",
			kferrors.GPUFault{Kind: kferrors.FaultXid, Code: 48, Severity: kferrors.SeverityCritical, GPUIndex: -1}, ""},
		{"unknown severity: the table's", kferrors.EventReasonXid, "[gpu-health] Xid 13. xid=13 severity=apocalyptic",
			kferrors.GPUFault{Kind: kferrors.FaultXid, Code: 13, Severity: kferrors.SeverityUser, GPUIndex: -1}, ""},
		{"hostile values", kferrors.EventReasonXid, "[gpu-health] x. xid=79 node=\x1b[31mred\xff gpu_index=-4 pid=-1",
			kferrors.GPUFault{Kind: kferrors.FaultXid, Code: 79, Severity: kferrors.SeverityCritical, GPUIndex: -1, Node: "_[31mred_"}, ""},
		{"other reason", "BackOff", "[gpu-health] xid=79", kferrors.GPUFault{}, "not a GPU fault's"},
		{"free text posing as one", kferrors.EventReasonXid, "GPU has fallen off the bus xid=79", kferrors.GPUFault{}, "does not start with"},
		{"no tail", kferrors.EventReasonXid, "[gpu-health] [CRITICAL] Xid 79 (GPU has fallen off the bus).", kferrors.GPUFault{}, "no xid="},
		{"sxid reason, xid tail", kferrors.EventReasonSXid, "[gpu-health] x. xid=79", kferrors.GPUFault{}, "no sxid="},
		{"not a number", kferrors.EventReasonXid, "[gpu-health] x. xid=79a", kferrors.GPUFault{}, "not a fault number"},
	}
	for _, c := range cases {
		g, err := kferrors.ParseGPUEvent(c.reason, c.msg)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%s: %+v, %v: want an error with %q", c.name, g, err, c.err)
			}
			continue
		}
		if err != nil || g != c.want {
			t.Errorf("%s: %+v, %v\nwant %+v", c.name, g, err, c.want)
		}
	}
}

func FuzzParseGPUEvent(f *testing.F) {
	f.Add(kferrors.EventReasonXid, "[gpu-health] [CRITICAL] Xid 79 (GPU has fallen off the bus) on GPU 3 GPU-1. xid=79 severity=critical gpu_index=3 node=n pid=1 process=p")
	f.Add(kferrors.EventReasonSXid, "[gpu-health] [CRITICAL] SXid 22 on NVSwitch 0. sxid=22 severity=critical pci=0")
	f.Add(kferrors.EventReasonXid, "[gpu-health] xid= xid=1 xid=2 =3 gpu_index=99999999999999999999")
	f.Fuzz(func(t *testing.T, reason, msg string) {
		g, err := kferrors.ParseGPUEvent(reason, msg)
		if err != nil {
			if !utf8.ValidString(err.Error()) && utf8.ValidString(reason) {
				t.Errorf("error not UTF-8: %q", err)
			}
			return
		}
		if g.Code < 0 || g.GPUIndex < -1 || g.PID < 0 {
			t.Errorf("out of range: %+v", g)
		}
		for _, v := range []string{g.GPUUUID, g.PCI, g.Node, g.Process, g.Pod, g.Namespace} {
			if len(v) > 253 || !utf8.ValidString(v) || strings.ContainsAny(v, "\n\r\x1b") {
				t.Errorf("value %q", v)
			}
		}
		if _, ok := g.Failure("w", time.Now(), ""); ok != (g.Severity != kferrors.SeverityWarn) {
			t.Errorf("%+v: failure %v", g, ok)
		}
		if s := g.Sentence(); !utf8.ValidString(s) || strings.ContainsAny(s, "\n\x1b") {
			t.Errorf("sentence %q", s)
		}
	})
}

// Real error texts, each from the public log it was copied from (trimmed
// to the lines that carry the meaning), and what they mean.
var realTexts = []struct {
	source, exception, text string
	want                    string
}{
	// https://github.com/hiyouga/LlamaFactory/issues/7396 (torch 2.x)
	{"LlamaFactory#7396", "torch.distributed.DistBackendError",
		"[rank0]:[E321 02:07:08.408271257 ProcessGroupNCCL.cpp:607] [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1580, OpType=ALLREDUCE, NumelIn=466119168, NumelOut=466119168, Timeout(ms)=600000) ran for 600060 milliseconds before timing out.",
		kferrors.CodeNcclTimeout},
	// https://github.com/OFA-Sys/OFA/issues/271 (torch 1.x)
	{"OFA#271", "RuntimeError",
		"[E ProcessGroupNCCL.cpp:737] [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=469508, OpType=ALLREDUCE, Timeout(ms)=1800000) ran for 1802212 milliseconds before timing out.",
		kferrors.CodeNcclTimeout},
	// https://github.com/pytorch/pytorch/issues/149984
	{"pytorch#149984", "torch.distributed.DistBackendError",
		"Collective WorkNCCL(SeqNum=2, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=1000000) raised the following async exception: NCCL error: unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.25.1\nncclSystemError: System call (e.g. socket, malloc) or external library call failed or device error.",
		kferrors.CodeNcclSystemError},
	// https://github.com/jade-hpc-gpu/jade-hpc-gpu.github.io/issues/194
	{"jade-hpc-gpu#194", "RuntimeError",
		"RuntimeError: CUDA error: uncorrectable ECC error encountered\nCUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1.\nCompile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.",
		kferrors.CodeGpuEccUncorrectable},
	// https://github.com/kohya-ss/sd-scripts/issues/1434: the NCCL
	// watchdog reports the ECC error it caught; the hardware decides.
	{"sd-scripts#1434", "RuntimeError",
		"[E ProcessGroupNCCL.cpp:916] [Rank 1] NCCL watchdog thread terminated with exception: CUDA error: uncorrectable ECC error encountered\nCUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect.",
		kferrors.CodeGpuEccUncorrectable},
	// https://github.com/evo-design/evo/issues/136
	{"evo#136", "RuntimeError",
		"RuntimeError: CUDA error: an illegal memory access was encountered\nCUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1\nCompile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.",
		kferrors.CodeCudaIllegalAddress},
	// https://github.com/pytorch/pytorch/issues/16417 (a 2024 comment)
	{"pytorch#16417", "torch.cuda.OutOfMemoryError",
		"torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 22.00 MiB. GPU 0 has a total capacity of 23.65 GiB of which 11.06 MiB is free. Including non-PyTorch memory, this process has 23.60 GiB memory in use.",
		kferrors.CodeCudaOutOfMemory},
}

func TestRecognizeRealTexts(t *testing.T) {
	at := time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC)
	for _, c := range realTexts {
		f := kferrors.Recognize(kferrors.UserError(c.exception, c.text, "job-worker-1/0", at))
		m, _ := kferrors.RecognizeText(c.text)
		if f.Code != c.want || f.Origin != m.Origin || f.Recoverable != m.Recoverable {
			t.Errorf("%s: %s %s recoverable=%v, want %s", c.source, f.Code, f.Origin, f.Recoverable, c.want)
		}
		if !strings.Contains(f.Message, c.text) || !strings.Contains(f.Message, c.exception) || f.Worker != "job-worker-1/0" || !f.Time.Equal(at) {
			t.Errorf("%s: %+v lost what the worker said", c.source, f)
		}
		if kferrors.IsHardwareCode(f.Code) != (c.want == kferrors.CodeGpuEccUncorrectable) {
			t.Errorf("%s: hardware %v", c.source, kferrors.IsHardwareCode(f.Code))
		}
	}
}

// Recognize changes only workers' exceptions, once, and never a
// failure's time, worker or the words it had; what the platform observed
// stands. Seeded random failures built from the real texts and others.
func TestRecognizeInvariants(t *testing.T) {
	r := rand.New(rand.NewPCG(31, 31))
	codes := []string{"RuntimeError", "ValueError", kferrors.CodeNonZeroExit, kferrors.CodeOOMKilled, kferrors.CodePreempted,
		kferrors.CodeRecoverable, "SignalSIGSEGV", kferrors.CodeJobStopped, ""}
	for i := range 5000 {
		text := "step 20: loss is NaN"
		if r.IntN(2) == 0 {
			text = realTexts[r.IntN(len(realTexts))].text
		}
		if r.IntN(4) == 0 {
			text = strings.Repeat("x", r.IntN(200<<10)) + text + strings.Repeat("y", r.IntN(200<<10))
		}
		code := codes[r.IntN(len(codes))]
		f := kferrors.UserError(code, text, "w", time.Unix(int64(i), 0))
		if r.IntN(3) == 0 {
			f = kferrors.SystemFailure(code, text, "w", time.Unix(int64(i), 0))
		}
		g := kferrors.Recognize(f)
		if g.Worker != f.Worker || !g.Time.Equal(f.Time) || !strings.Contains(g.Message, f.Message) {
			t.Fatalf("case %d: %+v → %+v", i, f, g)
		}
		if h := kferrors.Recognize(g); h != g {
			t.Fatalf("case %d: not idempotent: %+v → %+v", i, g, h)
		}
		if f.Origin == core.ExecutionError_SYSTEM || code == kferrors.CodeRecoverable {
			if g != f {
				t.Fatalf("case %d: a platform failure changed: %+v → %+v", i, f, g)
			}
		}
		if g.Code != f.Code && !strings.Contains(g.Message, text) {
			t.Fatalf("case %d: recognized without its text", i)
		}
	}
}

// torch's ChildFailedError table lists the other ranks' failures before
// the root cause: only the root cause's section gives the meaning.
func TestRecognizeReadsTheRootCauseOnly(t *testing.T) {
	table := func(other, root string) string {
		return "USER:RuntimeError: error=\n============================================================\nspawn_helper FAILED\n" +
			"------------------------------------------------------------\nFailures:\n[1]:\n  traceback : " + other + "\n" +
			"------------------------------------------------------------\nRoot Cause (first observed failure):\n[0]:\n  rank      : 1 (local_rank: 1)\n" +
			"  traceback : " + root + "\n============================================================\n" +
			"Other text after the table: Watchdog caught collective operation timeout"
	}
	at := time.Unix(1, 0)
	f := kferrors.Recognize(kferrors.UserError("USER:RuntimeError", table(realTexts[0].text, "ValueError: loss is NaN"), "w", at))
	if f.Code != "USER:RuntimeError" {
		t.Errorf("a secondary failure in the table named the root cause: %s", f.Code)
	}
	f = kferrors.Recognize(kferrors.UserError("USER:RuntimeError", table("RuntimeError: Connection closed by peer", realTexts[3].text), "w", at))
	if f.Code != kferrors.CodeGpuEccUncorrectable || !strings.HasPrefix(f.Message, "USER:RuntimeError: error=") {
		t.Errorf("the root cause's ECC error: %s %q", f.Code, f.Message[:40])
	}
}

// A hardware fault's document is named as ours always are (time, worker),
// with its random element marked, so that readers open it whatever its
// time; no other name carries the mark, whatever the worker's name.
func TestDocumentKeyMarksHardwareFaults(t *testing.T) {
	at := time.Date(2026, 12, 6, 10, 0, 0, 123, time.UTC)
	for _, tc := range []struct {
		code, worker string
		marked       bool
	}{
		{kferrors.CodeGpuFallenOffBus, "job-worker-1", true},
		{kferrors.CodeGpuEccUncorrectable, "job-worker-1/0", true},
		{kferrors.CodeNcclTimeout, "job-worker-1", false},
		{"ValueError", "job-worker-hw", false},
		{"ValueError", "x-hwdeadbeef", false},
		{kferrors.CodeGpuNvlinkError, "../hw-../-hw", true},
	} {
		f := kferrors.SystemFailure(tc.code, "m", tc.worker, at)
		key := kferrors.DocumentKey(f, kferrors.RandomSuffix())
		if got := kferrors.IsHardwareKey(key); got != tc.marked {
			t.Errorf("%s of %q: key %s marked %v, want %v", tc.code, tc.worker, key, got, tc.marked)
		}
		if ts, ok := kferrors.TimeFromKey(key); !ok || !ts.Equal(at) {
			t.Errorf("%s: key %s does not carry the document's time", tc.code, key)
		}
		if w := kferrors.WorkerFromKey(key); w != kferrors.SanitizeWorker(tc.worker) {
			t.Errorf("%s: key %s names worker %q", tc.code, key, w)
		}
	}
	for _, key := range []string{"error-hw0123.pb", "error.pb", "error-" + strings.Repeat("a", 32) + ".pb"} {
		if kferrors.IsHardwareKey(key) {
			t.Errorf("%s taken for a hardware fault's key", key)
		}
	}
}

package errors

import (
	"cmp"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/flyteorg/flyte/flyteidl/gen/pb-go/flyteidl/core"
)

// Hardware and collective-communication faults: the failures that most often
// end large GPU jobs. Two sources name them: the Warning events a GPU health
// daemon on the node records against a pod (GPUXidError / GPUSXidError,
// the contract Flyte 2 reads; ParseGPUEvent), and the error text a worker
// prints for a fault it ran into (RecognizeText). One table of codes serves
// both, docs/DESIGN.md §2.4.
const (
	// CodeGpuXidError: a GPU fault that is the workload's (a user Xid:
	// 13, 31, 43, 45), or one with no more specific code that the daemon
	// did not call critical.
	CodeGpuXidError = "GpuXidError"
	// CodeGpuDeviceError: a critical GPU fault with no more specific code
	// (Xid 62, the GPU's micro-controller halted; 109, a context switch
	// timed out; any Xid the daemon calls critical): the device needs a
	// reset, and a replacement goes elsewhere.
	CodeGpuDeviceError = "GpuDeviceError"
	// CodeGpuFallenOffBus: Xid 79, the GPU is gone from the PCI bus.
	CodeGpuFallenOffBus = "GpuFallenOffBus"
	// CodeGpuEccUncorrectable: an uncorrectable ECC error (Xid 48, 94, 95,
	// 140; CUDA's "uncorrectable ECC error encountered").
	CodeGpuEccUncorrectable = "GpuEccUncorrectable"
	// CodeGpuRowRemapPending: a memory row remap recorded or failed (Xid
	// 63, 64); the GPU needs a reset.
	CodeGpuRowRemapPending = "GpuRowRemapPending"
	// CodeGpuNvlinkError: an NVLink error (Xid 74) or any NVSwitch SXid.
	CodeGpuNvlinkError = "GpuNvlinkError"
	// CodeGpuGspError: the GPU's system processor failed (Xid 119, 120).
	CodeGpuGspError = "GpuGspError"
	// CodeNcclTimeout: torch's NCCL watchdog timed a collective out, most
	// often because a peer's GPU or process hung: a secondary failure.
	CodeNcclTimeout = "NcclTimeout"
	// CodeNcclRemoteError: NCCL lost a peer (ncclRemoteError): secondary.
	CodeNcclRemoteError = "NcclRemoteError"
	// CodeNcclSystemError: a system call, library or device under NCCL
	// failed (ncclSystemError).
	CodeNcclSystemError = "NcclSystemError"
	// CodeCudaIllegalAddress: a kernel accessed memory it does not own (the
	// workload's doing, as Xid 13 and 31).
	CodeCudaIllegalAddress = "CudaIllegalAddress"
	// CodeCudaOutOfMemory: the workload asked for more GPU memory than
	// there is.
	CodeCudaOutOfMemory = "CudaOutOfMemory"
)

// Severity is how a GPU fault bears on the job, as the health daemon's
// events say it (severity=user|critical|warn).
type Severity string

const (
	// SeverityUser: the workload caused it (Xid 13, 31, 43, 45); the GPU is
	// fine once the process is gone.
	SeverityUser Severity = "user"
	// SeverityCritical: the device or node is condemned until reset or
	// replaced.
	SeverityCritical Severity = "critical"
	// SeverityWarn: worth a look, ends nothing.
	SeverityWarn Severity = "warn"
)

// FaultKind tells a GPU's Xid from an NVSwitch's SXid; their numbers share
// a space but not a meaning.
type FaultKind string

const (
	FaultXid  FaultKind = "xid"
	FaultSXid FaultKind = "sxid"
)

// The Kubernetes Event contract of a GPU health daemon: a Warning event on
// the pod that held the device, with one of these reasons and a message
// that starts with GPUHealthPrefix and ends in a key=value tail.
const (
	EventReasonXid  = "GPUXidError"
	EventReasonSXid = "GPUSXidError"
	GPUHealthPrefix = "[gpu-health]"
)

// GPUFault is one fault a health daemon reported.
type GPUFault struct {
	Kind     FaultKind
	Code     int
	Severity Severity
	GPUUUID  string
	// GPUIndex is -1 when unknown.
	GPUIndex int
	PCI      string
	Node     string
	PID      int
	Process  string
	// Pod and Namespace name the pod that held the GPU, when the daemon
	// knows it (from the kubelet's pod-resources API): what attributes an
	// event recorded against the node to one pod.
	Pod, Namespace string
}

// xidNames are NVIDIA's names of the Xids this table classifies
// (docs.nvidia.com/deploy/xid-errors).
var xidNames = map[int]string{
	13: "Graphics engine exception", 31: "GPU memory page fault", 43: "GPU stopped processing",
	45: "Preemptive cleanup, due to previous errors", 48: "Double bit ECC error",
	62: "Internal micro-controller halt", 63: "ECC page retirement or row remapping recording event",
	64: "ECC page retirement or row remapper recording failure", 74: "NVLink error",
	79: "GPU has fallen off the bus", 92: "High single-bit ECC error rate", 94: "Contained ECC error",
	95: "Uncontained ECC error", 109: "Context switch timeout error", 119: "GSP RPC timeout",
	120: "GSP error", 140: "Unrecovered ECC error",
}

// userXids are the workload's own faults; criticalXids condemn the device.
// Every other Xid is a warning, and every SXid is critical (an NVSwitch
// fault takes down links every GPU of the node shares).
var (
	userXids     = map[int]bool{13: true, 31: true, 43: true, 45: true}
	criticalXids = map[int]bool{48: true, 62: true, 63: true, 64: true, 74: true, 79: true, 94: true, 95: true,
		109: true, 119: true, 120: true, 140: true}
	xidCodes = map[int]string{79: CodeGpuFallenOffBus, 48: CodeGpuEccUncorrectable, 94: CodeGpuEccUncorrectable,
		95: CodeGpuEccUncorrectable, 140: CodeGpuEccUncorrectable, 63: CodeGpuRowRemapPending,
		64: CodeGpuRowRemapPending, 74: CodeGpuNvlinkError, 119: CodeGpuGspError, 120: CodeGpuGspError}
)

// XidSeverity is the table's severity of a fault code.
func XidSeverity(kind FaultKind, code int) Severity {
	switch {
	case kind == FaultSXid, criticalXids[code]:
		return SeverityCritical
	case userXids[code]:
		return SeverityUser
	}
	return SeverityWarn
}

// FailureCode is the failure code of the fault.
func (g GPUFault) FailureCode() string {
	if g.Kind == FaultSXid {
		return CodeGpuNvlinkError
	}
	if c, ok := xidCodes[g.Code]; ok {
		return c
	}
	if g.Severity == SeverityCritical {
		return CodeGpuDeviceError
	}
	return CodeGpuXidError
}

// Name is NVIDIA's name of the fault, or "Xid N" for one the table lacks.
func (g GPUFault) Name() string {
	if g.Kind == FaultSXid {
		return fmt.Sprintf("SXid %d", g.Code)
	}
	if n, ok := xidNames[g.Code]; ok {
		return n
	}
	return fmt.Sprintf("Xid %d", g.Code)
}

// Sentence says the fault as a person reads it, in the daemon's words:
// "[gpu-health] [CRITICAL] Xid 79 (GPU has fallen off the bus) on GPU 3
// GPU-1a2b on node n1."
func (g GPUFault) Sentence() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s [%s] ", GPUHealthPrefix, strings.ToUpper(string(g.Severity)))
	if g.Kind == FaultSXid {
		fmt.Fprintf(&b, "SXid %d on NVSwitch %s", g.Code, cmp.Or(g.PCI, "(unknown)"))
	} else {
		fmt.Fprintf(&b, "Xid %d (%s)", g.Code, g.Name())
		switch {
		case g.GPUIndex >= 0 && g.GPUUUID != "":
			fmt.Fprintf(&b, " on GPU %d %s", g.GPUIndex, g.GPUUUID)
		case g.GPUIndex >= 0:
			fmt.Fprintf(&b, " on GPU %d", g.GPUIndex)
		case g.GPUUUID != "":
			fmt.Fprintf(&b, " on GPU %s", g.GPUUUID)
		case g.PCI != "":
			fmt.Fprintf(&b, " on GPU at PCI %s", g.PCI)
		}
	}
	if g.Node != "" {
		fmt.Fprintf(&b, " on node %s", g.Node)
	}
	b.WriteString(".")
	return b.String()
}

// Failure is the pod's failure the fault explains, or false for a warning,
// which explains none. A critical fault is the system's and recoverable,
// so it uses no user retry; a user fault is the workload's, recoverable on
// the task's own retries (Flyte 2 charges it so). detail, when not empty,
// is what the pod's own failure said, kept after the sentence.
func (g GPUFault) Failure(worker string, at time.Time, detail string) (Failure, bool) {
	msg := g.Sentence()
	if detail != "" {
		msg += " " + detail
	}
	switch g.Severity {
	case SeverityCritical:
		return SystemFailure(g.FailureCode(), msg, worker, at), true
	case SeverityUser:
		f := UserError(g.FailureCode(), msg, worker, at)
		f.Recoverable = true
		return f, true
	}
	return Failure{}, false
}

// maxEventMessage bounds what ParseGPUEvent reads of a message (an event's
// message is at most 1 KiB on the API server; a hostile one is cut).
const maxEventMessage = 4 << 10

// maxEventValue bounds one value of the tail (a node name is at most 253).
const maxEventValue = 253

// ParseGPUEvent reads a health daemon's event: its reason must be
// EventReasonXid or EventReasonSXid and its message start with
// GPUHealthPrefix and carry the key=value tail (xid= or sxid=, severity=,
// gpu_uuid=, gpu_index=, pci=, node=, pid=, process=, pod=, namespace=).
// The severity the table gives a code wins over the one the message
// claims only when the message's is missing or unknown. An error says why the event is not one.
func ParseGPUEvent(reason, message string) (GPUFault, error) {
	var kind FaultKind
	switch reason {
	case EventReasonXid:
		kind = FaultXid
	case EventReasonSXid:
		kind = FaultSXid
	default:
		return GPUFault{}, fmt.Errorf("event reason %q is not a GPU fault's", CapMessage(reason, 64))
	}
	if len(message) > maxEventMessage {
		message = message[:maxEventMessage]
	}
	if !strings.HasPrefix(message, GPUHealthPrefix) {
		return GPUFault{}, fmt.Errorf("%s event: message does not start with %s", reason, GPUHealthPrefix)
	}
	codeKey := string(kind)
	start := strings.Index(message, " "+codeKey+"=")
	if start < 0 {
		return GPUFault{}, fmt.Errorf("%s event: no %s= in its message", reason, codeKey)
	}
	fields := map[string]string{}
	for _, tok := range strings.Fields(message[start:]) {
		k, v, ok := strings.Cut(tok, "=")
		if !ok || k == "" {
			continue
		}
		if _, seen := fields[k]; !seen {
			fields[k] = cleanValue(v)
		}
	}
	code, err := strconv.Atoi(fields[codeKey])
	if err != nil || code < 0 || code > 1<<20 {
		return GPUFault{}, fmt.Errorf("%s event: %s=%q is not a fault number", reason, codeKey, CapMessage(fields[codeKey], 32))
	}
	g := GPUFault{Kind: kind, Code: code, Severity: XidSeverity(kind, code), GPUUUID: fields["gpu_uuid"], GPUIndex: -1,
		PCI: fields["pci"], Node: fields["node"], Process: fields["process"], Pod: fields["pod"], Namespace: fields["namespace"]}
	switch s := Severity(fields["severity"]); s {
	case SeverityUser, SeverityCritical, SeverityWarn:
		g.Severity = s
	}
	if i, err := strconv.Atoi(fields["gpu_index"]); err == nil && i >= 0 && i < 1<<16 {
		g.GPUIndex = i
	}
	if p, err := strconv.Atoi(fields["pid"]); err == nil && p > 0 {
		g.PID = p
	}
	return g, nil
}

// cleanValue keeps a tail value printable and short: invalid UTF-8 and
// control characters become '_'.
func cleanValue(v string) string {
	if len(v) > maxEventValue {
		v = v[:maxEventValue]
	}
	return strings.Map(func(r rune) rune {
		if r == utf8.RuneError || r < 0x20 || r == 0x7f {
			return '_'
		}
		return r
	}, strings.ToValidUTF8(v, "_"))
}

// TextMeaning is what a known error text says about a failure.
type TextMeaning struct {
	Code        string
	Origin      core.ExecutionError_ErrorKind
	Recoverable bool
	// Hardware: the node's device is suspect; a replacement should go
	// elsewhere.
	Hardware bool
	// Secondary: a symptom of another rank's failure (a peer hung or
	// died), never a root cause when that failure is known.
	Secondary bool
}

// knownTexts are the error texts with a known meaning, first match wins:
// hardware before NCCL's reports of it (a watchdog's message carries the
// CUDA error it caught). Each text is the one CUDA, NCCL or torch prints;
// the tests hold real logs with their sources.
var knownTexts = []struct {
	text    string
	meaning TextMeaning
}{
	{"uncorrectable ECC error encountered", TextMeaning{CodeGpuEccUncorrectable, core.ExecutionError_SYSTEM, true, true, false}},
	{"GPU has fallen off the bus", TextMeaning{CodeGpuFallenOffBus, core.ExecutionError_SYSTEM, true, true, false}},
	{"an illegal memory access was encountered", TextMeaning{CodeCudaIllegalAddress, core.ExecutionError_USER, true, false, false}},
	{"CUDA out of memory", TextMeaning{CodeCudaOutOfMemory, core.ExecutionError_USER, false, false, false}},
	{"ncclSystemError", TextMeaning{CodeNcclSystemError, core.ExecutionError_SYSTEM, true, false, false}},
	{"Watchdog caught collective operation timeout", TextMeaning{CodeNcclTimeout, core.ExecutionError_SYSTEM, true, false, true}},
	{"ncclRemoteError", TextMeaning{CodeNcclRemoteError, core.ExecutionError_SYSTEM, true, false, true}},
}

// maxRecognizedBytes bounds how much of a message RecognizeText searches:
// the exception is at a traceback's end, the watchdog's line near a log's
// start; the head and the tail are read.
const maxRecognizedBytes = 64 << 10

// RecognizeText returns the meaning of the first known error text in msg.
func RecognizeText(msg string) (TextMeaning, bool) {
	if len(msg) > 2*maxRecognizedBytes {
		msg = msg[:maxRecognizedBytes] + "\n" + msg[len(msg)-maxRecognizedBytes:]
	}
	for _, k := range knownTexts {
		if strings.Contains(msg, k.text) {
			return k.meaning, true
		}
	}
	return TextMeaning{}, false
}

// IsSecondaryCode reports whether a failure code is a peer's symptom
// (TextMeaning.Secondary).
func IsSecondaryCode(code string) bool {
	return code == CodeNcclTimeout || code == CodeNcclRemoteError
}

// HardwareWindow is how long after a peer's secondary failure (an NCCL
// watchdog timeout or remote error: IsSecondaryCode) a hardware fault
// (IsHardwareCode: a GPU fallen off the bus, an uncorrectable ECC error)
// still explains it. A GPU that hangs or dies makes its peers' collectives
// fail within seconds (a remote error) or at NCCL's timeout; a node daemon
// reports the fault when it polls the driver, which can be after the
// first of them (docs/DESIGN.md §3). The reader (outputreader) and the
// agent's documents both go by it.
const HardwareWindow = 5 * time.Minute

// IsHardwareCode reports whether a failure code condemns the node's device
// (a replacement should go elsewhere).
func IsHardwareCode(code string) bool {
	switch code {
	case CodeGpuFallenOffBus, CodeGpuEccUncorrectable, CodeGpuRowRemapPending, CodeGpuNvlinkError, CodeGpuGspError,
		CodeGpuDeviceError:
		return true
	}
	return false
}

// Recognize gives a worker's exception the meaning of a known error text
// in its message: `RuntimeError: CUDA error: uncorrectable ECC error
// encountered` becomes GpuEccUncorrectable, the system's and recoverable.
// Only failures named after the workers' own exceptions (USER, by
// Classify or flytekit) are looked at: what the platform observed (an OOM
// kill, a preemption, a signal, the master's codes) stands. The message is
// kept; the code the exception had leads it when it is not there already.
//
// A message with torch's ChildFailedError table is read only in its root
// cause's section: the other failures it lists are the secondary ones.
func Recognize(f Failure) Failure { return RecognizeIn(f, rootCauseSection(f.Message)) }

// RecognizeIn is Recognize reading text instead of the failure's message
// (the agent reads the one rank's error that a document's exception came
// from).
func RecognizeIn(f Failure, text string) Failure {
	if f.Origin != core.ExecutionError_USER || f.Code == CodeRecoverable || f.Code == CodeStartFailed {
		return f
	}
	m, ok := RecognizeText(text)
	if !ok || m.Code == f.Code {
		return f
	}
	if f.Code != "" && f.Code != CodeNonZeroExit && !strings.Contains(f.Message, f.Code) {
		f.Message = f.Code + ": " + f.Message
	}
	f.Code, f.Origin, f.Recoverable = m.Code, m.Origin, m.Recoverable
	return f
}

// rootCauseSection is the "Root Cause (first observed failure):" section of
// torch's ChildFailedError table in msg, up to the table's closing rule;
// msg itself when it has none.
func rootCauseSection(msg string) string {
	_, rest, ok := strings.Cut(msg, "Root Cause (first observed failure):")
	if !ok {
		return msg
	}
	if i := strings.Index(rest, "\n====="); i >= 0 {
		rest = rest[:i]
	}
	return rest
}

package kube

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	kferrors "github.com/kfelastic/kfelastic/errors"
)

// GPUFault is a GPU health daemon's fault on a live pod of the job: the
// Warning event it recorded against the pod (kferrors.ParseGPUEvent), the
// pod's name, UID and node.
type GPUFault struct {
	Pod, UID, Node string
	Fault          kferrors.GPUFault
	// At is when the daemon saw it (the event's time), never later than
	// when the owner read it.
	At time.Time
	// EventUID names the event: one fault, one document.
	EventUID string
}

// Failure is the pod's failure the fault explains (kferrors.GPUFault's),
// the pod's node named when the event did not.
func (g GPUFault) Failure() (kferrors.Failure, bool) {
	f := g.Fault
	if f.Node == "" {
		f.Node = g.Node
	}
	return f.Failure(g.Pod, g.At, "")
}

// event is what the owner reads of a core/v1 Event.
type event struct {
	Metadata       objectMeta `json:"metadata"`
	InvolvedObject struct {
		Kind string `json:"kind"`
		Name string `json:"name"`
		UID  string `json:"uid"`
	} `json:"involvedObject"`
	Source struct {
		Component string `json:"component"`
	} `json:"source"`
	ReportingController string     `json:"reportingComponent"`
	Reason              string     `json:"reason"`
	Message             string     `json:"message"`
	Type                string     `json:"type"`
	EventTime           *time.Time `json:"eventTime"`
	LastTimestamp       *time.Time `json:"lastTimestamp"`
	FirstTimestamp      *time.Time `json:"firstTimestamp"`
	// Count and Series say how often the recorder saw the event: a
	// recorder that sees it again updates the one event (client-go's
	// correlator: count up, lastTimestamp later; events.k8s.io: series).
	Count  int32 `json:"count"`
	Series *struct {
		Count            int32      `json:"count"`
		LastObservedTime *time.Time `json:"lastObservedTime"`
	} `json:"series"`
}

// occurrence is which time the recorder saw the event: 1 the first.
func (e *event) occurrence() int32 {
	if e.Series != nil && e.Series.Count > 0 {
		return e.Series.Count
	}
	return max(e.Count, 1)
}

type eventList = objectList[event]

// when is the time of the event's latest occurrence: its series' last
// observed time or its last timestamp, else the daemon's eventTime (the
// first observation), its first timestamp, its creation; read is the bound
// (a daemon whose clock runs ahead is not believed past it).
func (e *event) when(read time.Time) time.Time {
	var last *time.Time
	if e.Series != nil {
		last = e.Series.LastObservedTime
	}
	for _, t := range []*time.Time{last, e.LastTimestamp, e.EventTime, e.FirstTimestamp, &e.Metadata.CreationTimestamp} {
		if t != nil && !t.IsZero() {
			if t.After(read) {
				return read
			}
			return *t
		}
	}
	return read
}

// PodWarnings are the handlers of the Warning events on the job's live
// pods that Owner.WatchPodWarnings hands on; a nil one is not called.
type PodWarnings struct {
	// GPUFault is a fault a GPU health daemon recorded against a pod
	// (reasons kferrors.EventReasonXid, EventReasonSXid).
	GPUFault func(GPUFault)
	// NodeNotReady is the Kubernetes node controller's NodeNotReady on a
	// pod: the pod's node stopped reporting.
	NodeNotReady func(NodeNotReady)
}

// NodeNotReady is the node controller's NodeNotReady event on a live pod
// of the job, with the pod's node; Condition is the node's Ready
// condition's reason and message when the master may read nodes ("" when
// its Role does not grant it, as the plugin's does not).
type NodeNotReady struct {
	Pod, UID, Node string
	At             time.Time
	Condition      string
}

// The node lifecycle controller's event on each pod of a node it found
// not ready (kube-controller-manager's MarkPodsNotReady), and the source
// it records under; the same reason from anyone else is not believed.
const (
	eventReasonNodeNotReady = "NodeNotReady"
	nodeController          = "node-controller"
)

// WatchPodWarnings lists and watches the namespace's Warning events until
// ctx ends and hands each one the master acts on, one call at a time,
// once per event, to h: a GPU fault or a NodeNotReady on a pod of the job
// that is the event's pod (same UID: a late event of a pod already
// replaced changes nothing) and has not ended. Events of other reasons,
// other pods, and messages that are not the daemon's are ignored (logged
// once). With Config.NodeEventNamespace it also watches the GPU faults
// recorded against nodes there (nodeWarning). It reconnects with backoff,
// as Watch does. The master's Role needs list and watch on events.
func (o *Owner) WatchPodWarnings(ctx context.Context, h PodWarnings) error {
	var mu sync.Mutex // one call at a time, from either watch
	serial := PodWarnings{}
	if h.GPUFault != nil {
		serial.GPUFault = func(g GPUFault) { mu.Lock(); defer mu.Unlock(); h.GPUFault(g) }
	}
	if h.NodeNotReady != nil {
		serial.NodeNotReady = func(n NodeNotReady) { mu.Lock(); defer mu.Unlock(); h.NodeNotReady(n) }
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	if ns := o.cfg.NodeEventNamespace; ns != "" && h.GPUFault != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			o.watchWarnings(ctx, ns, "Node", func(e *event, seen handled) { o.nodeWarning(ctx, e, seen, serial) })
		}()
	}
	o.watchWarnings(ctx, o.cfg.Namespace, "Pod", func(e *event, seen handled) { o.podWarning(ctx, e, seen, serial) })
	return nil
}

// handled is, per event UID, the latest occurrence of the event handed on.
// A recorder that sees a fault again records it on the same event (count
// up, a later time): that is a new occurrence, handed on again, for it may
// take out a pod that came after the first; a re-list, or an update that
// does not count, is not. An event the API server deletes (its TTL, an
// hour by default) is forgotten, so that a long job's map stays small.
type handled map[string]int32

// take marks e's occurrence handled and says whether it is new; undo gives
// the mark back, so that the next list reads the event again.
func (h handled) take(e *event) (undo func(), ok bool) {
	uid, n := e.Metadata.UID, e.occurrence()
	prev, had := h[uid]
	if had && n <= prev {
		return nil, false
	}
	h[uid] = n
	return func() {
		if had {
			h[uid] = prev
		} else {
			delete(h, uid)
		}
	}, true
}

// watchWarnings lists and watches the Warning events on objects of kind in
// namespace ns until ctx ends, handing each added or modified one to
// handle with the occurrences handled so far (handle's to keep). It reconnects
// with backoff. The node events' namespace is not the job's: where the
// master may not read it (403), it says once what to grant and stops.
func (o *Owner) watchWarnings(ctx context.Context, ns, kind string, handle func(*event, handled)) {
	seen := handled{}
	path := "/api/v1/namespaces/" + url.PathEscape(ns) + "/events"
	query := func() url.Values { return url.Values{"fieldSelector": {"type=Warning,involvedObject.kind=" + kind}} }
	backoff := time.Second
	for {
		var l eventList
		err := o.c.do(ctx, http.MethodGet, path, query(), nil, &l)
		if err == nil {
			for i := range l.Items {
				handle(&l.Items[i], seen)
			}
			err = o.watchEvents(ctx, path, query(), l.Metadata.ResourceVersion, seen, handle)
		}
		if ctx.Err() != nil {
			return
		}
		if kind == "Node" && isStatus(err, http.StatusForbidden) {
			o.log.Info("the master may not read the events of nodes: a GPU fault a daemon records against a node is not seen, "+
				"only those recorded against the job's pods (a Role in that namespace with list and watch on events, bound to "+
				"the master's service account, adds them)", "namespace", ns, "err", err)
			return
		}
		if err == nil {
			backoff = time.Second
			continue // expired (410): list again
		}
		o.log.Warn("event watch failed; reconnecting", "namespace", ns, "kind", kind, "err", err, "backoff", backoff)
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 30*time.Second)
	}
}

func (o *Owner) watchEvents(ctx context.Context, path string, q url.Values, rv string, seen handled, handle func(*event, handled)) error {
	for {
		q.Set("resourceVersion", rv)
		q.Set("allowWatchBookmarks", "true")
		timeout := 240 + int(o.now().UnixNano()%120)
		q.Set("timeoutSeconds", strconv.Itoa(timeout))
		wctx, cancel := context.WithTimeout(ctx, time.Duration(timeout+30)*time.Second)
		w, err := o.c.watch(wctx, path, q)
		if err != nil {
			cancel()
			return err
		}
		err = func() error {
			defer cancel()
			defer w.close()
			for {
				ev, err := w.next()
				if errors.Is(err, io.EOF) {
					return nil // the server's timeout: watch on from rv
				}
				if err != nil {
					return fmt.Errorf("kube: event watch: %w", err)
				}
				if ev.Type == "ERROR" {
					var st status
					_ = json.Unmarshal(ev.Object, &st)
					if st.Code == http.StatusGone {
						return errExpired
					}
					return &APIError{Code: st.Code, Reason: st.Reason, Message: st.Message, Op: "WATCH events"}
				}
				var e event
				if err := json.Unmarshal(ev.Object, &e); err != nil {
					return fmt.Errorf("kube: event watch: decoding a %s event: %w", ev.Type, err)
				}
				if e.Metadata.ResourceVersion != "" {
					rv = e.Metadata.ResourceVersion
				}
				switch ev.Type {
				case "ADDED", "MODIFIED":
					handle(&e, seen)
				case "DELETED":
					delete(seen, e.Metadata.UID)
				}
			}
		}()
		if errors.Is(err, errExpired) {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// errExpired: the watch's resource version is too old; list again.
var errExpired = errors.New("kube: watch expired")

// podWarning hands one event on when h acts on it and it is of a live pod
// of the job, once per occurrence (handled).
func (o *Owner) podWarning(ctx context.Context, e *event, seen handled, h PodWarnings) {
	var gpu kferrors.GPUFault
	switch e.Reason {
	case kferrors.EventReasonXid, kferrors.EventReasonSXid:
		if h.GPUFault == nil {
			return
		}
	case eventReasonNodeNotReady:
		if h.NodeNotReady == nil {
			return
		}
	default:
		return
	}
	undo, ok := seen.take(e)
	if !ok {
		return // a re-list, or an update of an occurrence handed on
	}
	read := o.now()
	if e.Reason == eventReasonNodeNotReady {
		if e.Source.Component != nodeController && e.ReportingController != nodeController {
			o.log.Warn("a NodeNotReady event not from the node controller; ignored", "event", e.Metadata.Name, "pod", e.InvolvedObject.Name,
				"source", e.Source.Component, "reporting_controller", e.ReportingController)
			return
		}
	} else {
		g, err := kferrors.ParseGPUEvent(e.Reason, e.Message)
		if err != nil {
			o.log.Warn("a GPU fault event that cannot be read", "event", e.Metadata.Name, "pod", e.InvolvedObject.Name, "err", err)
			return
		}
		gpu = g
	}
	p, err := o.getPod(ctx, e.InvolvedObject.Name)
	switch {
	case err != nil:
		undo() // read it again on the next list
		o.log.Warn("cannot read the pod of a Warning event", "pod", e.InvolvedObject.Name, "reason", e.Reason, "err", err)
		return
	case p == nil || !o.ours(p):
		return // another job's pod, or gone
	case p.Metadata.UID != e.InvolvedObject.UID:
		o.log.Info("Warning event of a pod already replaced; ignored", "pod", p.Metadata.Name, "reason", e.Reason,
			"event_uid", e.InvolvedObject.UID, "pod_uid", p.Metadata.UID, "message", e.Message)
		return
	}
	if _, ended := classify(p, o.cfg.Container, false, read); ended {
		o.log.Info("Warning event of a pod that has ended", "pod", p.Metadata.Name, "reason", e.Reason, "message", e.Message)
		return
	}
	if e.Reason == eventReasonNodeNotReady {
		n := NodeNotReady{Pod: p.Metadata.Name, UID: p.Metadata.UID, Node: p.Spec.NodeName, At: e.when(read),
			Condition: o.nodeCondition(ctx, p.Spec.NodeName)}
		o.log.Warn("the node controller says a pod's node is not ready", "pod", n.Pod, "node", n.Node, "condition", n.Condition)
		h.NodeNotReady(n)
		return
	}
	o.log.Warn("GPU fault on a pod of the job", "pod", p.Metadata.Name, "node", p.Spec.NodeName, "fault", gpu.Sentence())
	h.GPUFault(GPUFault{Pod: p.Metadata.Name, UID: p.Metadata.UID, Node: p.Spec.NodeName, Fault: gpu, At: e.when(read), EventUID: e.Metadata.UID})
}

// nodeWarning hands on a GPU fault a daemon recorded against a node (as
// node-problem-detector records its problems), once per occurrence, as a
// fault of each live pod of the job on that node that it may be: the pod
// the event names (pod=, namespace=: a daemon that maps GPUs to pods
// through the kubelet's pod-resources API says which), else every one
// there. A node's event cannot say which of several pods held the GPU, and
// a critical fault condemns the node until it is reset; the replacements
// go elsewhere. A pod created after the fault was last seen is not its
// pod; one there when the fault recurs is (the event's later occurrence).
func (o *Owner) nodeWarning(ctx context.Context, e *event, seen handled, h PodWarnings) {
	if e.Reason != kferrors.EventReasonXid && e.Reason != kferrors.EventReasonSXid {
		return
	}
	undo, ok := seen.take(e)
	if !ok {
		return
	}
	read := o.now()
	node := e.InvolvedObject.Name
	g, err := kferrors.ParseGPUEvent(e.Reason, e.Message)
	if err != nil {
		o.log.Warn("a GPU fault event on a node that cannot be read", "event", e.Metadata.Name, "node", node, "err", err)
		return
	}
	if g.Namespace != "" && g.Namespace != o.cfg.Namespace {
		return // another namespace's pod held the GPU
	}
	var l podList
	if err := o.c.do(ctx, http.MethodGet, o.podPath, o.listQuery(), nil, &l); err != nil {
		undo() // read it again on the next list
		o.log.Warn("cannot list the job's pods for a GPU fault on a node", "node", node, "err", err)
		return
	}
	at := e.when(read)
	var hit []*pod
	for i := range l.Items {
		p := &l.Items[i]
		if p.Spec.NodeName != node || node == "" || !o.ours(p) || (g.Pod != "" && p.Metadata.Name != g.Pod) {
			continue
		}
		if _, ended := classify(p, o.cfg.Container, false, read); ended {
			continue
		}
		if at.Before(p.Metadata.CreationTimestamp) {
			o.log.Info("GPU fault on a node before the pod came to it; not the pod's", "pod", p.Metadata.Name, "node", node,
				"fault_at", at, "pod_created", p.Metadata.CreationTimestamp)
			continue
		}
		hit = append(hit, p)
	}
	if len(hit) > 1 {
		o.log.Warn("a GPU fault on a node does not say which pod held the GPU: every pod of the job on the node takes it",
			"node", node, "pods", len(hit), "fault", g.Sentence())
	}
	for _, p := range hit {
		o.log.Warn("GPU fault on the node of a pod of the job", "pod", p.Metadata.Name, "node", node, "fault", g.Sentence())
		h.GPUFault(GPUFault{Pod: p.Metadata.Name, UID: p.Metadata.UID, Node: node, Fault: g, At: at,
			EventUID: e.Metadata.UID + "/" + p.Metadata.UID})
	}
}

// node is what the owner reads of a core/v1 Node: its conditions.
type node struct {
	Status struct {
		Conditions []struct {
			Type    string `json:"type"`
			Status  string `json:"status"`
			Reason  string `json:"reason"`
			Message string `json:"message"`
		} `json:"conditions"`
	} `json:"status"`
}

// nodeCondition is the node's Ready condition in words, "Ready=Unknown
// (NodeStatusUnknown: Kubelet stopped posting node status.)", for the
// document of a pod lost with its node. Nodes are cluster objects: the
// plugin's Role does not grant reading them, so it is "" unless a
// ClusterRole does (said once in the log).
func (o *Owner) nodeCondition(ctx context.Context, name string) string {
	if name == "" || o.nodesForbidden.Load() {
		return ""
	}
	var n node
	err := o.c.do(ctx, http.MethodGet, "/api/v1/nodes/"+url.PathEscape(name), nil, nil, &n)
	switch {
	case isStatus(err, http.StatusForbidden):
		o.nodesForbidden.Store(true)
		o.log.Info("the master may not read nodes: a lost node's document says the node controller's word only "+
			"(a ClusterRole with get on nodes bound to the master's service account adds the node's condition)", "err", err)
		return ""
	case err != nil:
		o.log.Warn("cannot read the node of a pod whose node is not ready", "node", name, "err", err)
		return ""
	}
	for _, c := range n.Status.Conditions {
		if c.Type == "Ready" {
			return strings.TrimSpace(fmt.Sprintf("Ready=%s (%s: %s)", c.Status, c.Reason, c.Message))
		}
	}
	return ""
}

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
}

type eventList = objectList[event]

// when is the event's time: the daemon's eventTime, else its last or first
// timestamp, else its creation; read is the bound (a daemon whose clock runs
// ahead is not believed past it).
func (e *event) when(read time.Time) time.Time {
	for _, t := range []*time.Time{e.EventTime, e.LastTimestamp, e.FirstTimestamp, &e.Metadata.CreationTimestamp} {
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
// once). It reconnects with backoff, as Watch does. The master's Role
// needs list and watch on events.
func (o *Owner) WatchPodWarnings(ctx context.Context, h PodWarnings) error {
	seen := map[string]bool{}
	path := "/api/v1/namespaces/" + url.PathEscape(o.cfg.Namespace) + "/events"
	query := func() url.Values { return url.Values{"fieldSelector": {"type=Warning,involvedObject.kind=Pod"}} }
	backoff := time.Second
	for {
		var l eventList
		err := o.c.do(ctx, http.MethodGet, path, query(), nil, &l)
		if err == nil {
			for i := range l.Items {
				o.podWarning(ctx, &l.Items[i], seen, h)
			}
			err = o.watchEvents(ctx, path, query(), l.Metadata.ResourceVersion, seen, h)
		}
		if ctx.Err() != nil {
			return nil
		}
		if err == nil {
			backoff = time.Second
			continue // expired (410): list again
		}
		o.log.Warn("event watch failed; reconnecting", "err", err, "backoff", backoff)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 30*time.Second)
	}
}

func (o *Owner) watchEvents(ctx context.Context, path string, q url.Values, rv string, seen map[string]bool, h PodWarnings) error {
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
				if ev.Type == "ADDED" || ev.Type == "MODIFIED" {
					o.podWarning(ctx, &e, seen, h)
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
// of the job, once per event UID.
func (o *Owner) podWarning(ctx context.Context, e *event, seen map[string]bool, h PodWarnings) {
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
	if seen[e.Metadata.UID] {
		return // a series' later count, or a re-list
	}
	seen[e.Metadata.UID] = true
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
		seen[e.Metadata.UID] = false // read it again on the next list
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

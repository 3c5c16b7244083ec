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
	Reason         string     `json:"reason"`
	Message        string     `json:"message"`
	Type           string     `json:"type"`
	EventTime      *time.Time `json:"eventTime"`
	LastTimestamp  *time.Time `json:"lastTimestamp"`
	FirstTimestamp *time.Time `json:"firstTimestamp"`
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

// WatchGPUFaults lists and watches the namespace's Warning events until ctx
// ends and calls fault, one call at a time, once per event, for each GPU
// fault a health daemon recorded against a pod of the job that is the
// event's pod (same UID: a late event of a pod already replaced changes
// nothing) and has not ended. Events of other reasons, other pods, and
// messages that are not the daemon's are ignored (logged once). It
// reconnects with backoff, as Watch does. The master's Role needs list and
// watch on events.
func (o *Owner) WatchGPUFaults(ctx context.Context, fault func(GPUFault)) error {
	seen := map[string]bool{}
	path := "/api/v1/namespaces/" + url.PathEscape(o.cfg.Namespace) + "/events"
	query := func() url.Values { return url.Values{"fieldSelector": {"type=Warning,involvedObject.kind=Pod"}} }
	backoff := time.Second
	for {
		var l eventList
		err := o.c.do(ctx, http.MethodGet, path, query(), nil, &l)
		if err == nil {
			for i := range l.Items {
				o.gpuEvent(ctx, &l.Items[i], seen, fault)
			}
			err = o.watchEvents(ctx, path, query(), l.Metadata.ResourceVersion, seen, fault)
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

func (o *Owner) watchEvents(ctx context.Context, path string, q url.Values, rv string, seen map[string]bool, fault func(GPUFault)) error {
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
					o.gpuEvent(ctx, &e, seen, fault)
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

// gpuEvent hands one event on when it is a GPU fault on a live pod of the
// job, once per event UID.
func (o *Owner) gpuEvent(ctx context.Context, e *event, seen map[string]bool, fault func(GPUFault)) {
	if e.Reason != kferrors.EventReasonXid && e.Reason != kferrors.EventReasonSXid {
		return
	}
	if seen[e.Metadata.UID] {
		return // a series' later count, or a re-list
	}
	seen[e.Metadata.UID] = true
	read := o.now()
	g, err := kferrors.ParseGPUEvent(e.Reason, e.Message)
	if err != nil {
		o.log.Warn("a GPU fault event that cannot be read", "event", e.Metadata.Name, "pod", e.InvolvedObject.Name, "err", err)
		return
	}
	p, err := o.getPod(ctx, e.InvolvedObject.Name)
	switch {
	case err != nil:
		seen[e.Metadata.UID] = false // read it again on the next list
		o.log.Warn("cannot read the pod of a GPU fault event", "pod", e.InvolvedObject.Name, "err", err)
		return
	case p == nil || !o.ours(p):
		return // another job's pod, or gone
	case p.Metadata.UID != e.InvolvedObject.UID:
		o.log.Info("GPU fault event of a pod already replaced; ignored", "pod", p.Metadata.Name, "event_uid", e.InvolvedObject.UID,
			"pod_uid", p.Metadata.UID, "fault", g.Sentence())
		return
	}
	if _, ended := classify(p, o.cfg.Container, false, read); ended {
		o.log.Info("GPU fault event of a pod that has ended", "pod", p.Metadata.Name, "fault", g.Sentence())
		return
	}
	o.log.Warn("GPU fault on a pod of the job", "pod", p.Metadata.Name, "node", p.Spec.NodeName, "fault", g.Sentence())
	fault(GPUFault{Pod: p.Metadata.Name, UID: p.Metadata.UID, Node: p.Spec.NodeName, Fault: g, At: e.when(read), EventUID: e.Metadata.UID})
}

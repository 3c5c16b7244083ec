package kube

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	kferrors "github.com/kfelastic/kfelastic/errors"
	"github.com/kfelastic/kfelastic/master/relaunch"
)

// Config is where the job is and how to reach the API server.
type Config struct {
	// Host is the API server's base URL, https://host:port.
	Host string
	// BearerToken authenticates the calls; TokenFile, when set, is read
	// instead (and re-read every minute: projected service account tokens
	// rotate).
	BearerToken string
	TokenFile   string
	// CAData verifies the server (PEM); CertData/KeyData are a client
	// certificate (PEM), as envtest's admin user has.
	CAData, CertData, KeyData []byte

	// Namespace and Job name the PyTorchJob.
	Namespace, Job string
	// ReplicaType is the replica type whose pods the owner watches and
	// whose template it edits; default "Worker".
	ReplicaType string
	// Container is the primary container (memory, exit code); default
	// "pytorch".
	Container string
	// OOM is how memory grows after an OOM kill; the zero value means
	// relaunch.DefaultOOM. Give the master's own policy.
	OOM relaunch.OOM

	// Logger gets structured logs; default slog.Default().
	Logger *slog.Logger
	// HTTPClient replaces the client built from the TLS fields.
	HTTPClient *http.Client
	// Resync is how often Watch re-checks the pods that decisions are still
	// waiting on (a replacement not yet conforming, a deletion stuck);
	// default 10 s.
	Resync time.Duration
	// ForceAfter is how long past its grace period a pod the owner deleted
	// may stay terminating (its kubelet is gone) before it is deleted with
	// no grace, so that the operator can recreate it; default 30 s.
	ForceAfter time.Duration
	// TaintNodes also taints the node an avoid-host relaunch leaves
	// (UnhealthyTaint, NoSchedule), so that other workloads stay off it
	// too. Off by default: it needs a ClusterRole (get and update on
	// nodes), and it changes the cluster beyond the job.
	TaintNodes bool
	// NodeEventNamespace is where the events recorded against nodes land
	// ("default" for the kubelet's and node-problem-detector's): the owner
	// reads the GPU faults there too (WatchPodWarnings) where a Role in it
	// grants list and watch on events; "" reads none.
	NodeEventNamespace string
}

// Action is one relaunch decision for the owner to carry out.
type Action struct {
	// Seq is the decision's sequence number: Carry edits the job at most
	// once per Seq.
	Seq  int64
	Kind relaunch.Kind
	// Rank is the master's node rank (logged; the pod is found by name).
	Rank int
	// Pod is the failed pod's name, <job>-<replica type>-<index>.
	Pod string
	// UID is the failed pod's UID, when known (PodGone.UID; an agent that
	// reports its pod's metadata.uid). It tells the failed pod from its
	// replacement, which has the same name. Without it the owner uses Time
	// and what its Watch saw.
	UID string
	// Host is the Kubernetes node (spec.nodeName) the failed pod ran on, when
	// the caller knows it. The owner prefers the node it saw the failed pod
	// on; Host is the fallback for AvoidHost.
	Host string
	// Reason is the failure code (logged).
	Reason string
	// Time is when the master decided; pods created later are replacements.
	// Required for Relaunch unless UID is set.
	Time time.Time
}

// PodGone is a worker pod that died without its agent saying so, as the
// owner's Watch observes it.
type PodGone struct {
	Pod string
	UID string
	// Index is the pod's replica index (-1 if unlabelled).
	Index int
	// Node is the node the pod ran on.
	Node string
	// Failure is the pod's failure as errors.ClassifyPod reads its status;
	// its Time is when the pod ended: the container's finish time, else the
	// pod's last condition transition, else when the owner saw it.
	kferrors.Failure
}

// Owner carries out relaunch decisions for one PyTorchJob by editing its
// replica template and deleting pods, which the training operator (restart
// policy ExitCode) recreates from the current template under the same name;
// and it watches the job's pods for deaths the agents did not report.
type Owner struct {
	cfg     Config
	c       *restClient
	log     *slog.Logger
	now     func() time.Time
	jobPath string
	podPath string
	// names are <job>-<replica type in lower case>-<index>.
	names    *regexp.Regexp
	selector string

	// nodesForbidden: the API server refused to let the owner read a node
	// (nodeCondition asks no more); taintForbidden: to taint one.
	nodesForbidden, taintForbidden atomic.Bool

	mu sync.Mutex
	// expect: pod name → what its next incarnation must satisfy.
	expect map[string]*expectation
	// deleted: UIDs of pods the owner deleted → when, and the pod's name.
	deleted map[string]deletion
	// known: the pods Watch saw last, by UID (to notice deletions missed
	// while disconnected).
	known map[string]*pod
	// reported: UIDs already reported to gone.
	reported map[string]bool
	// history: pod name → its recent incarnations, newest last.
	history map[string][]incarnation
}

type expectation struct {
	memory int64
	hosts  []string
	seqs   []int64
	// deletions counts the pods deleted for not satisfying it; past
	// maxReplacements the owner stops (something keeps the template from
	// holding the edit) rather than delete pods forever.
	deletions int
	lastUID   string
}

const maxReplacements = 5

func (e *expectation) satisfiedBy(p *pod, container string) bool {
	if e.memory > 0 && p.memory(container) < e.memory {
		return false
	}
	for _, h := range e.hosts {
		if p.Spec.NodeName == h || !p.avoids(h) {
			return false
		}
	}
	return true
}

type deletion struct {
	name string
	at   time.Time
}

// incarnation is one pod of a given name as Watch saw it.
type incarnation struct {
	uid     string
	node    string
	memory  int64
	created time.Time
	ended   time.Time // when Watch first saw it dead or deleted; zero: alive
}

// New checks cfg and returns an owner; it makes no call yet.
func New(cfg Config) (*Owner, error) {
	switch {
	case cfg.Host == "":
		return nil, errors.New("kube: no API server host")
	case cfg.Namespace == "" || cfg.Job == "":
		return nil, errors.New("kube: namespace and job are required")
	}
	if cfg.ReplicaType == "" {
		cfg.ReplicaType = "Worker"
	}
	if cfg.Container == "" {
		cfg.Container = "pytorch"
	}
	if cfg.OOM == (relaunch.OOM{}) {
		cfg.OOM = relaunch.DefaultOOM
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Resync <= 0 {
		cfg.Resync = 10 * time.Second
	}
	if cfg.ForceAfter <= 0 {
		cfg.ForceAfter = 30 * time.Second
	}
	c, err := newClient(cfg)
	if err != nil {
		return nil, err
	}
	rt := strings.ToLower(cfg.ReplicaType)
	return &Owner{
		cfg:      cfg,
		c:        c,
		log:      cfg.Logger.With("job", cfg.Job, "namespace", cfg.Namespace),
		now:      time.Now,
		jobPath:  "/apis/kubeflow.org/v1/namespaces/" + url.PathEscape(cfg.Namespace) + "/pytorchjobs/" + url.PathEscape(cfg.Job),
		podPath:  "/api/v1/namespaces/" + url.PathEscape(cfg.Namespace) + "/pods",
		names:    regexp.MustCompile("^" + regexp.QuoteMeta(cfg.Job+"-"+rt+"-") + "(0|[1-9][0-9]{0,6})$"),
		selector: jobNameLabel + "=" + cfg.Job + "," + replicaTypeLabel + "=" + rt,
		expect:   map[string]*expectation{},
		deleted:  map[string]deletion{},
		known:    map[string]*pod{},
		reported: map[string]bool{},
		history:  map[string][]incarnation{},
	}, nil
}

// Carry carries out one decision. It is idempotent: the template edit of a
// Seq is recorded on the job (CarriedAnnotation) in the same update, and
// pods are deleted only when they are the failed one or do not satisfy the
// decision, with the pod's UID as precondition. Retry on error unless
// Permanent(err).
//
//   - None: nothing (logged).
//   - Relaunch: the failed pod, if it still exists, is deleted (with no
//     grace if its node is lost), so that the operator recreates it; a
//     replacement is left alone.
//   - MoreMemory: the template's memory limit and request grow by the OOM
//     policy from what the failed pod had; then the index's pod is deleted
//     unless it already has that much. ErrMemoryAtCap when it cannot grow.
//   - AvoidHost: the template gets a required node affinity
//     kubernetes.io/hostname NotIn [host, …]; then the index's pod is
//     deleted unless it has that affinity and is elsewhere.
//
// A replacement the operator creates later from a stale template is
// deleted in turn by Watch, until the index's pod satisfies the decision.
func (o *Owner) Carry(ctx context.Context, a Action) error {
	log := o.log.With("seq", a.Seq, "kind", a.Kind.String(), "rank", a.Rank, "pod", a.Pod, "reason", a.Reason)
	switch a.Kind {
	case relaunch.None:
		log.Info("decision leaves the pod as it is")
		return nil
	case relaunch.Relaunch, relaunch.MoreMemory, relaunch.AvoidHost:
	default:
		return fmt.Errorf("%w: kind %v is not carried out by the pod owner", ErrInvalidAction, a.Kind)
	}
	if !o.names.MatchString(a.Pod) {
		return fmt.Errorf("%w: %q is not a %s pod of job %s", ErrInvalidAction, a.Pod, o.cfg.ReplicaType, o.cfg.Job)
	}
	if a.Kind == relaunch.Relaunch && a.UID == "" && a.Time.IsZero() {
		return fmt.Errorf("%w: relaunch of %s needs the failed pod's UID or the decision time", ErrInvalidAction, a.Pod)
	}
	current, err := o.getPod(ctx, a.Pod)
	if err != nil {
		return err
	}
	failed := o.failedIncarnation(a, current)
	if a.Kind == relaunch.Relaunch {
		return o.relaunch(ctx, a, current, failed, log)
	}
	rec, err := o.editJob(ctx, a, failed, log)
	if err != nil {
		return err
	}
	if o.cfg.TaintNodes && rec.Host != "" {
		o.taintNode(ctx, rec.Host, a.Reason, log)
	}
	o.addExpectation(a.Pod, rec)
	if current == nil {
		log.Info("no pod yet; the operator creates it from the edited template")
		return nil
	}
	return o.check(ctx, current)
}

func (o *Owner) relaunch(ctx context.Context, a Action, current *pod, failed *incarnation, log *slog.Logger) error {
	switch {
	case current == nil:
		log.Info("pod already gone; the operator recreates it")
		return nil
	case failed == nil || failed.uid != current.Metadata.UID:
		log.Info("pod already replaced", "uid", current.Metadata.UID)
		return nil
	case !o.ours(current):
		return fmt.Errorf("%w: pod %s does not carry job %s's labels", ErrInvalidAction, a.Pod, o.cfg.Job)
	}
	if current.Metadata.DeletionTimestamp != nil {
		o.markDeleted(current)
		return o.forceIfStuck(ctx, current)
	}
	var grace *int64
	if current.nodeLost() {
		zero := int64(0)
		grace = &zero // its kubelet will never confirm a graceful deletion
	}
	log.Info("deleting the failed pod so that the operator recreates it", "uid", current.Metadata.UID, "node", current.Spec.NodeName, "force", grace != nil)
	return o.deletePod(ctx, current, grace)
}

// endedWindow: a pod Watch saw end this close to a decision is the one the
// decision is about, even if the operator already replaced it (the watch
// reported it, the master decided, the operator was faster).
const endedWindow = 5 * time.Second

// failedIncarnation is the pod that failed, as far as the owner can tell:
// the one with a.UID; else, among those created before the decision, the
// newest that Watch saw end within endedWindow of it, else the newest.
// current is the pod of that name now (nil if none). nil: unknown. Without
// a UID this is a heuristic: pass PodGone.UID (or the agent's pod UID).
func (o *Owner) failedIncarnation(a Action, current *pod) *incarnation {
	o.mu.Lock()
	hist := append([]incarnation(nil), o.history[a.Pod]...)
	o.mu.Unlock()
	if current != nil {
		cur := incarnationOf(current, o.cfg.Container)
		found := false
		for i := range hist {
			if hist[i].uid == cur.uid {
				cur.ended = hist[i].ended
				hist[i], found = cur, true
			}
		}
		if !found {
			hist = append(hist, cur)
		}
	}
	if a.UID != "" {
		for i := range hist {
			if hist[i].uid == a.UID {
				return &hist[i]
			}
		}
		return &incarnation{uid: a.UID}
	}
	if a.Time.IsZero() {
		if current == nil {
			return nil
		}
		inc := incarnationOf(current, o.cfg.Container)
		return &inc
	}
	// Creation times are whole seconds.
	before := a.Time.Truncate(time.Second)
	var newest, ended *incarnation
	for i := range hist {
		h := &hist[i]
		if !h.created.Before(before) {
			continue
		}
		if newest == nil || h.created.After(newest.created) {
			newest = h
		}
		if !h.ended.IsZero() && h.ended.After(a.Time.Add(-endedWindow)) && h.ended.Before(a.Time.Add(endedWindow)) &&
			(ended == nil || h.created.After(ended.created)) {
			ended = h
		}
	}
	if ended != nil {
		return ended
	}
	return newest
}

func incarnationOf(p *pod, container string) incarnation {
	return incarnation{uid: p.Metadata.UID, node: p.Spec.NodeName, memory: p.memory(container), created: p.Metadata.CreationTimestamp}
}

// editJob makes the decision's template edit and records its Seq, in one
// update with the job's resourceVersion (retried on conflict). A Seq
// already recorded is not applied again; its record is returned.
func (o *Owner) editJob(ctx context.Context, a Action, failed *incarnation, log *slog.Logger) (carriedRecord, error) {
	for attempt := 0; ; attempt++ {
		var job object
		if err := o.c.do(ctx, http.MethodGet, o.jobPath, nil, nil, &job); err != nil {
			return carriedRecord{}, err
		}
		if rec, ok := findCarried(carriedOf(job), a.Seq); ok {
			if rec.Pod != a.Pod {
				return carriedRecord{}, fmt.Errorf("%w: decision %d was carried out for pod %s, not %s", ErrInvalidAction, a.Seq, rec.Pod, a.Pod)
			}
			log.Info("template edit already made", "memory", rec.Memory, "host", rec.Host)
			return rec, nil
		}
		rec := carriedRecord{Seq: a.Seq, Pod: a.Pod}
		changed := false
		switch a.Kind {
		case relaunch.MoreMemory:
			var base int64
			if failed != nil {
				base = failed.memory
			}
			target, ch, err := raiseMemory(job, o.cfg.ReplicaType, o.cfg.Container, o.cfg.OOM, base)
			if err != nil {
				return carriedRecord{}, err
			}
			rec.Memory, changed = target, ch
		case relaunch.AvoidHost:
			host := a.Host
			if failed != nil && failed.node != "" {
				if host != "" && host != failed.node {
					log.Info("the failed pod ran on another node than the action names; avoiding the pod's", "action_host", host, "node", failed.node)
				}
				host = failed.node
			}
			if host == "" {
				return carriedRecord{}, fmt.Errorf("%w: pod %s's node is unknown and the action names none", ErrNoHost, a.Pod)
			}
			ch, err := avoidHost(job, o.cfg.ReplicaType, host)
			if err != nil {
				return carriedRecord{}, err
			}
			rec.Host, changed = host, ch
		}
		addCarried(job, rec)
		err := o.c.do(ctx, http.MethodPut, o.jobPath, nil, job, nil)
		switch {
		case err == nil:
			log.Info("replica template edited", "replica_type", o.cfg.ReplicaType, "memory", memoryField(rec.Memory), "avoid_host", rec.Host, "changed", changed)
			return rec, nil
		case isConflict(err) && attempt < 20:
			continue // someone (the operator, a user) updated the job: read it again
		}
		return carriedRecord{}, err
	}
}

func memoryField(b int64) string {
	if b <= 0 {
		return ""
	}
	return formatMemory(b)
}

func (o *Owner) addExpectation(name string, rec carriedRecord) {
	o.mu.Lock()
	defer o.mu.Unlock()
	e := o.expect[name]
	if e == nil {
		e = &expectation{}
		o.expect[name] = e
	}
	for _, s := range e.seqs {
		if s == rec.Seq {
			return
		}
	}
	e.seqs = append(e.seqs, rec.Seq)
	e.memory = max(e.memory, rec.Memory)
	if rec.Host != "" && !contains(e.hosts, rec.Host) {
		e.hosts = append(e.hosts, rec.Host)
	}
}

// check brings one pod in line with the decisions waiting on its name: a pod
// the owner deleted that is stuck terminating is force-deleted; a pod that
// does not satisfy them is deleted; one that does ends the wait.
func (o *Owner) check(ctx context.Context, p *pod) error {
	o.mu.Lock()
	_, deletedByUs := o.deleted[p.Metadata.UID]
	e := o.expect[p.Metadata.Name]
	var want expectation
	if e != nil {
		want = *e
	}
	o.mu.Unlock()
	if deletedByUs || (e != nil && p.Metadata.DeletionTimestamp != nil) {
		return o.forceIfStuck(ctx, p)
	}
	if e == nil {
		return nil
	}
	log := o.log.With("pod", p.Metadata.Name, "uid", p.Metadata.UID, "seqs", want.seqs)
	if want.satisfiedBy(p, o.cfg.Container) {
		o.mu.Lock()
		if o.expect[p.Metadata.Name] == e && len(e.seqs) == len(want.seqs) {
			delete(o.expect, p.Metadata.Name)
		}
		o.mu.Unlock()
		log.Info("pod satisfies the decisions", "memory", memoryField(p.memory(o.cfg.Container)), "node", p.Spec.NodeName)
		return nil
	}
	if !o.ours(p) {
		return fmt.Errorf("%w: pod %s does not carry job %s's labels", ErrInvalidAction, p.Metadata.Name, o.cfg.Job)
	}
	o.mu.Lock()
	if e.lastUID != p.Metadata.UID {
		e.deletions, e.lastUID = e.deletions+1, p.Metadata.UID
	}
	giveUp := e.deletions > maxReplacements
	if giveUp && o.expect[p.Metadata.Name] == e {
		delete(o.expect, p.Metadata.Name)
	}
	o.mu.Unlock()
	if giveUp {
		log.Error("pods keep coming back without what the decisions put in the template; leaving this one",
			"replaced", maxReplacements, "memory", memoryField(p.memory(o.cfg.Container)), "want_memory", memoryField(want.memory), "avoid_hosts", want.hosts)
		return nil
	}
	log.Info("deleting a pod that does not satisfy the decisions, so that the operator recreates it from the edited template",
		"memory", memoryField(p.memory(o.cfg.Container)), "want_memory", memoryField(want.memory), "node", p.Spec.NodeName, "avoid_hosts", want.hosts)
	var grace *int64
	if p.nodeLost() {
		zero := int64(0)
		grace = &zero
	}
	return o.deletePod(ctx, p, grace)
}

// forceIfStuck deletes with no grace a terminating pod whose node is lost,
// or that is still terminating ForceAfter past its grace period: no kubelet
// will confirm its end, nothing else removes it, and the operator does not
// recreate a name that exists.
func (o *Owner) forceIfStuck(ctx context.Context, p *pod) error {
	dt := p.Metadata.DeletionTimestamp
	if dt == nil || (!p.nodeLost() && o.now().Before(dt.Add(o.cfg.ForceAfter))) {
		return nil
	}
	zero := int64(0)
	o.log.Warn("pod stuck terminating; deleting it with no grace", "pod", p.Metadata.Name, "uid", p.Metadata.UID, "node", p.Spec.NodeName, "node_lost", p.nodeLost(), "deletion_deadline", *dt)
	return o.deletePod(ctx, p, &zero)
}

func (o *Owner) ours(p *pod) bool {
	return p.Metadata.Labels[jobNameLabel] == o.cfg.Job && p.Metadata.Labels[replicaTypeLabel] == strings.ToLower(o.cfg.ReplicaType)
}

func (o *Owner) markDeleted(p *pod) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if _, ok := o.deleted[p.Metadata.UID]; !ok {
		o.deleted[p.Metadata.UID] = deletion{name: p.Metadata.Name, at: o.now()}
	}
}

// deletePod deletes exactly this pod (its UID as precondition: never a
// newer pod of the same name). A pod already gone or replaced is not an
// error. grace nil: the pod's own grace period.
func (o *Owner) deletePod(ctx context.Context, p *pod, grace *int64) error {
	o.markDeleted(p)
	body := map[string]any{
		"apiVersion":        "v1",
		"kind":              "DeleteOptions",
		"preconditions":     map[string]any{"uid": p.Metadata.UID},
		"propagationPolicy": "Background",
	}
	if grace != nil {
		body["gracePeriodSeconds"] = *grace
	}
	err := o.c.do(ctx, http.MethodDelete, o.podPath+"/"+url.PathEscape(p.Metadata.Name), nil, body, nil)
	if isNotFound(err) || isConflict(err) {
		return nil // gone, or replaced by a pod with another UID
	}
	return err
}

func (o *Owner) getPod(ctx context.Context, name string) (*pod, error) {
	var p pod
	err := o.c.do(ctx, http.MethodGet, o.podPath+"/"+url.PathEscape(name), nil, nil, &p)
	if isNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return &p, nil
}

// Watch lists and watches the job's pods of the replica type until ctx
// ends, calling gone (from this goroutine, one call at a time) for each pod
// that died without its agent saying so — pods already dead when it starts
// too (level-based; a pod may be reported again after a reconnect, and the
// master ignores a pod that already left). Pods the owner deleted itself are
// not reported. It also deletes replacements that do not satisfy a carried
// decision and force-deletes deletions stuck on a lost node. It reconnects
// with backoff and returns nil when ctx ends. Call it once per Owner.
func (o *Owner) Watch(ctx context.Context, gone func(PodGone)) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Add(1)
	go func() {
		defer wg.Done()
		o.resyncLoop(ctx)
	}()
	backoff := time.Second
	for {
		rv, err := o.list(ctx, gone)
		if err == nil {
			err = o.watchFrom(ctx, rv, gone)
		}
		if ctx.Err() != nil {
			return nil
		}
		if err == nil {
			backoff = time.Second
			continue // the watch expired (410): list again
		}
		level := slog.LevelWarn
		if Permanent(err) {
			level = slog.LevelError // e.g. 403: the Role lacks list/watch on pods
		}
		o.log.Log(ctx, level, "pod watch failed; reconnecting", "err", err, "backoff", backoff)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 30*time.Second)
	}
}

func (o *Owner) listQuery() url.Values {
	return url.Values{"labelSelector": {o.selector}}
}

// list observes every pod of the job now, and reports pods known before
// that are gone (deleted while the watch was down).
func (o *Owner) list(ctx context.Context, gone func(PodGone)) (string, error) {
	var l podList
	if err := o.c.do(ctx, http.MethodGet, o.podPath, o.listQuery(), nil, &l); err != nil {
		return "", err
	}
	present := map[string]bool{}
	for i := range l.Items {
		present[l.Items[i].Metadata.UID] = true
	}
	o.mu.Lock()
	var vanished []*pod
	for uid, p := range o.known {
		if !present[uid] {
			vanished = append(vanished, p)
		}
	}
	o.mu.Unlock()
	for _, p := range vanished {
		o.observe(ctx, "DELETED", p, gone)
	}
	for i := range l.Items {
		o.observe(ctx, "ADDED", &l.Items[i], gone)
	}
	return l.Metadata.ResourceVersion, nil
}

// watchFrom follows the pods from resource version rv; nil when the server
// says rv is too old (list again), an error when the stream breaks.
func (o *Owner) watchFrom(ctx context.Context, rv string, gone func(PodGone)) error {
	for {
		q := o.listQuery()
		q.Set("resourceVersion", rv)
		q.Set("allowWatchBookmarks", "true")
		timeout := 240 + int(o.now().UnixNano()%120)
		q.Set("timeoutSeconds", strconv.Itoa(timeout))
		// The server ends the watch after timeout; a connection that died
		// without a word is ended by this deadline.
		wctx, cancel := context.WithTimeout(ctx, time.Duration(timeout+30)*time.Second)
		w, err := o.c.watch(wctx, o.podPath, q)
		if err != nil {
			cancel()
			return err
		}
		for {
			ev, err := w.next()
			if err != nil {
				w.close()
				cancel()
				if errors.Is(err, io.EOF) {
					break // the server's timeout: watch on from rv
				}
				return fmt.Errorf("kube: pod watch: %w", err)
			}
			switch ev.Type {
			case "ERROR":
				w.close()
				cancel()
				var st status
				_ = json.Unmarshal(ev.Object, &st)
				if st.Code == http.StatusGone {
					return nil
				}
				return &APIError{Code: st.Code, Reason: st.Reason, Message: st.Message, Op: "WATCH pods"}
			case "ADDED", "MODIFIED", "DELETED", "BOOKMARK":
				var p pod
				if err := json.Unmarshal(ev.Object, &p); err != nil {
					w.close()
					cancel()
					return fmt.Errorf("kube: pod watch: decoding a %s event: %w", ev.Type, err)
				}
				if p.Metadata.ResourceVersion != "" {
					rv = p.Metadata.ResourceVersion
				}
				if ev.Type != "BOOKMARK" {
					o.observe(ctx, ev.Type, &p, gone)
				}
			}
		}
	}
}

// observe handles one pod state: remembers it, reports its death once,
// and checks it against decisions waiting on its name.
func (o *Owner) observe(ctx context.Context, typ string, p *pod, gone func(PodGone)) {
	if !o.ours(p) {
		return
	}
	uid := p.Metadata.UID
	now := o.now()
	deleting := typ == "DELETED" || p.Metadata.DeletionTimestamp != nil
	o.mu.Lock()
	_, byUs := o.deleted[uid]
	g, dead := classify(p, o.cfg.Container, deleting && !byUs, now)
	if deleting && byUs && dead && g.Code == kferrors.CodePreempted {
		dead = false // our own deletion carries out a decision
	}
	report := dead && !o.reported[uid]
	if dead {
		o.reported[uid] = true
	}
	o.remember(p, dead || deleting, now)
	if typ == "DELETED" {
		delete(o.known, uid)
		delete(o.reported, uid)
		delete(o.deleted, uid)
	} else {
		o.known[uid] = p
	}
	o.mu.Unlock()
	if report {
		o.log.Info("pod died without its agent reporting", "pod", g.Pod, "uid", g.UID, "code", g.Code, "node", g.Node, "message", g.Message)
		gone(g)
	}
	if typ != "DELETED" {
		if err := o.check(ctx, p); err != nil {
			o.log.Warn("could not bring a pod in line with a decision", "pod", p.Metadata.Name, "err", err)
		}
	}
}

// remember records the pod in its name's history (mu held).
func (o *Owner) remember(p *pod, ended bool, now time.Time) {
	const keep = 4
	name := p.Metadata.Name
	inc := incarnationOf(p, o.cfg.Container)
	hist := o.history[name]
	for i := range hist {
		if hist[i].uid == inc.uid {
			inc.ended = hist[i].ended
			if inc.ended.IsZero() && ended {
				inc.ended = now
			}
			hist[i] = inc
			return
		}
	}
	if ended {
		inc.ended = now
	}
	hist = append(hist, inc)
	if len(hist) > keep {
		hist = hist[len(hist)-keep:]
	}
	o.history[name] = hist
}

// resyncLoop re-checks, every Resync, the pods that decisions wait on and
// the pods the owner deleted (events alone do not come for a pod stuck
// terminating on a lost node).
func (o *Owner) resyncLoop(ctx context.Context) {
	t := time.NewTicker(o.cfg.Resync)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		o.resync(ctx)
	}
}

func (o *Owner) resync(ctx context.Context) {
	now := o.now()
	names := map[string]bool{}
	o.mu.Lock()
	for n := range o.expect {
		names[n] = true
	}
	for uid, d := range o.deleted {
		if now.Sub(d.at) > time.Hour {
			delete(o.deleted, uid) // long gone; its DELETED event was missed
			continue
		}
		names[d.name] = true
	}
	o.mu.Unlock()
	for n := range names {
		p, err := o.getPod(ctx, n)
		if err == nil && p != nil {
			err = o.check(ctx, p)
		}
		if err != nil && ctx.Err() == nil {
			o.log.Warn("resync of a pod failed", "pod", n, "err", err)
		}
	}
}

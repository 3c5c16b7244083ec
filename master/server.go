package master

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/url"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"gocloud.dev/blob"

	"github.com/kfelastic/kfelastic/api/masterpb"
	kferrors "github.com/kfelastic/kfelastic/errors"
	podevents "github.com/kfelastic/kfelastic/events"
	"github.com/kfelastic/kfelastic/internal/jobtoken"
	"github.com/kfelastic/kfelastic/master/relaunch"
	"github.com/kfelastic/kfelastic/master/store"
)

// PodOwner carries out relaunch decisions: on Kubernetes the master's own
// client (master/kube), locally the engine. Carry must be idempotent (a
// decision is carried again after a master restart or an error).
type PodOwner interface {
	Carry(ctx context.Context, d Decision) error
}

// Options configure a Server.
type Options struct {
	Job Config
	// ExitWhenDone ends Run (and Serve) once the job has succeeded
	// (Job.Succeeded), or was stopped and every node has left
	// (Job.StoppedAndLeft), and that is durable: on Kubernetes the
	// master's pod must complete for the training operator to end the job.
	// A stopped job's master first writes its own error document under
	// EventsURL (JobStopped, naming Pod), so that a job whose pods all
	// exited 0 (flytekit writes its document and exits 0) never reads as a
	// success.
	ExitWhenDone bool
	// SupersedeDeparted: the master moves aside the documents of the pods
	// its job went on without (departed.go), under EventsURL. On
	// Kubernetes, where no later agent of such a pod may ever start; the
	// local engine does it for the replacements it starts.
	SupersedeDeparted bool
	// Pod is the master's pod name, the worker its own document names
	// (ExitWhenDone); "master" when empty.
	Pod string
	// Token is the job's token; every call must carry it.
	Token string
	// StateURL is where the state lives (file://, s3://, mem://); empty: in
	// memory only (tests).
	StateURL string
	// StateTimeout bounds NewServer's opening and reading of the state
	// (--state-timeout); DefaultStateTimeout when 0.
	StateTimeout time.Duration
	// HeartbeatInterval is how long a heartbeat call is held when there is
	// nothing to say (the agents' call rate).
	HeartbeatInterval time.Duration
	// Store bounds the torch store.
	Store store.Limits
	// Owner carries out decisions; nil: they are only logged.
	Owner PodOwner
	// OnRound, when set, hears of each round this master completes, once
	// the round is durable: an owner in the same process (the local engine)
	// learns the rounds and their members from the master, not from the
	// agents' output. It is called in the master's loop: it must return at
	// once and must not call the Server. A round reloaded from the state is
	// not told again.
	OnRound func(CompletedRound)
	// EventsURL is the job's error prefix: the master appends a relaunch
	// event (package events) there for each relaunch it decides, so that
	// the failure report shows it in the pod's lane. Empty: none.
	EventsURL string
	Logger    *slog.Logger
	// Transport carries the gRPC service (transport.go); empty: the
	// default.
	Transport Transport
	// Connections bound the lean transport's connections; zero: the
	// defaults.
	Connections ConnLimits

	// stateWriteHook, when set, runs before each write of a batch (tests:
	// a state that stalls or fails).
	stateWriteHook func(context.Context) error
}

// Server is the master: the Job and the store inside one loop that orders
// every call, persists each batch of changes before it answers (group
// commit), and wakes the calls that wait (long polls) when their answer
// changes.
type Server struct {
	// succeeded: Run ended because the job succeeded.
	succeeded atomic.Bool
	// stoppedForGood: Run ended on a stopped job (ExitWhenDone).
	stoppedForGood atomic.Bool
	opts           Options
	log            *slog.Logger
	job            *Job
	store          *store.Store
	durable        *durableLog
	bucket         *blob.Bucket
	metrics        *metrics

	inbox chan *call
	done  chan struct{} // closed when the loop ends
	err   error         // why it ended

	// owned by the loop
	joinWaiters  map[int][]*call
	hbWaiters    map[int][]*call
	storeWaiters map[string][]*call
	formingSince time.Time

	decisions chan Decision
	// superseding counts the departed pods' moves under way
	// (supersedeAfterRound); pruning the deletions of batches a snapshot
	// replaced (persist).
	superseding, pruning sync.WaitGroup
}

// A call is one request as the loop sees it: apply runs in the loop and
// either finishes it (finish) or leaves it waiting, with eval to run again
// when it may be answerable.
type call struct {
	apply func(s *Server, now time.Time) // in the loop
	eval  func(s *Server) bool           // in the loop: true when finished

	mu        sync.Mutex
	finished  bool
	abandoned bool
	result    any
	err       error
	done      chan struct{} // closed once the answer is durable
	once      sync.Once
}

func (c *call) release() { c.once.Do(func() { close(c.done) }) }

func newCall(apply func(s *Server, now time.Time)) *call {
	return &call{apply: apply, done: make(chan struct{})}
}

// finish sets the answer (in the loop); false if the caller gave up.
func (c *call) finish(result any, err error) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.abandoned || c.finished {
		return false
	}
	c.finished, c.result, c.err = true, result, err
	return true
}

// abandon is the caller giving up on a wait; false if the answer is
// already there (then the caller waits for done, which is near).
func (c *call) abandon() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.finished {
		return false
	}
	c.abandoned = true
	return true
}

func (c *call) live() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return !c.abandoned && !c.finished
}

// NewServer loads the state under opts.StateURL (a restarted master goes on
// where it stopped) and returns a server ready to Run.
func NewServer(ctx context.Context, opts Options) (*Server, error) {
	if err := jobtoken.Check(opts.Token); err != nil {
		return nil, err
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.HeartbeatInterval <= 0 {
		opts.HeartbeatInterval = DefaultHeartbeatInterval
	}
	t, err := ParseTransport(string(opts.Transport))
	if err != nil {
		return nil, err
	}
	opts.Transport = t
	s := &Server{opts: opts, log: opts.Logger, store: store.New(opts.Store), inbox: make(chan *call, 4096),
		done: make(chan struct{}), joinWaiters: map[int][]*call{}, hbWaiters: map[int][]*call{},
		storeWaiters: map[string][]*call{}, decisions: make(chan Decision, 1024)}
	if opts.EventsURL != "" {
		if err := kferrors.CheckURL(opts.EventsURL); err != nil {
			return nil, fmt.Errorf("--error-prefix: %w", err)
		}
	}
	var records []*masterpb.StateRecord
	if opts.StateURL != "" {
		if records, err = s.openState(ctx); err != nil {
			return nil, err
		}
	}
	job, err := RestoreJob(opts.Job, records, time.Now())
	if err != nil {
		s.closeBucket()
		return nil, err
	}
	s.job = job
	kvs, sessions := storeRecordsFrom(records)
	if err := s.store.Restore(kvs, sessions); err != nil {
		s.closeBucket()
		return nil, fmt.Errorf("%w: torch store: %v", ErrBadState, err)
	}
	s.store.TakeChanges() // what was restored is durable already
	s.job.Ready()
	s.metrics = newMetrics(s)
	if len(records) > 0 {
		n := 0
		if l := job.Latest(); l != nil {
			n = int(l.Number)
		}
		s.log.Info("master state reloaded", "state", opts.StateURL, "seq", s.durable.seq, "round", n,
			"nodes", len(job.nodes), "claims", len(job.claims), "decisions", len(job.decisions), "store_keys", s.store.Len())
	}
	return s, nil
}

// DefaultStateTimeout bounds the master's start on its state (--state-timeout):
// ample for a store that answers, and a store that never does (a wrong
// endpoint that accepts and stays silent, a network that drops) fails the
// start with an error instead of a master that waits without end or word.
const DefaultStateTimeout = 2 * time.Minute

// stateWaitLogEvery is how often a start that waits for its state says so.
var stateWaitLogEvery = 5 * time.Second

// openState opens and loads the state under Options.StateURL within
// Options.StateTimeout, logging every stateWaitLogEvery what it waits for
// and since when.
func (s *Server) openState(ctx context.Context) ([]*masterpb.StateRecord, error) {
	stateURL, limit := s.opts.StateURL, s.opts.StateTimeout
	if limit <= 0 {
		limit = DefaultStateTimeout
	}
	since := time.Now()
	bounded, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	go func() {
		tick := time.NewTicker(stateWaitLogEvery)
		defer tick.Stop()
		for {
			select {
			case <-bounded.Done():
				return
			case <-tick.C:
				s.log.Warn("waiting for the state to answer", "state", stateURL, "since", since.Format(time.RFC3339),
					"waited", time.Since(since).Round(time.Second), "state_timeout", limit)
			}
		}
	}()
	records, err := s.openAndLoad(bounded)
	if err != nil && ctx.Err() == nil && errors.Is(bounded.Err(), context.DeadlineExceeded) {
		return nil, fmt.Errorf("--state %s: no answer within --state-timeout %s (since %s): %w", stateURL, limit,
			since.Format(time.RFC3339), err)
	}
	return records, err
}

// openAndLoad opens the state's bucket and loads it (loadState), claiming
// it for this master.
func (s *Server) openAndLoad(ctx context.Context) ([]*masterpb.StateRecord, error) {
	b, err := kferrors.OpenPrefix(ctx, s.opts.StateURL, true)
	if err != nil {
		return nil, fmt.Errorf("--state: %w", err)
	}
	dir, scheme := "", ""
	if u, err := url.Parse(s.opts.StateURL); err == nil {
		scheme = u.Scheme
		if scheme == "file" {
			dir = u.Path
		}
	}
	// A mem:// bucket is this master's own (each open is a new one):
	// no other master can write it, so there is no fence to check for.
	d, recs, err := loadState(ctx, stateSpec{bucket: b, dir: dir, private: scheme == "mem", job: s.opts.Job.JobID, token: s.opts.Token})
	if err != nil {
		b.Close()
		return nil, err
	}
	d.beforeAppend = s.opts.stateWriteHook
	s.bucket, s.durable = b, d
	return recs, nil
}

func (s *Server) closeBucket() {
	s.durable.close()
	if s.bucket != nil {
		s.bucket.Close()
	}
}

// Job returns the server's job configuration (defaults filled in).
func (s *Server) Job() Config { return s.job.Config() }

// Succeeded reports whether Run ended because the job succeeded
// (Options.ExitWhenDone).
func (s *Server) Succeeded() bool { return s.succeeded.Load() }

// StoppedForGood reports whether Run ended because the job was stopped and
// every node had left, with the master's document written
// (Options.ExitWhenDone).
func (s *Server) StoppedForGood() bool { return s.stoppedForGood.Load() }

// Run is the loop; it returns when ctx ends (nil) or the state cannot be
// written any more (ErrFenced: another master took over).
func (s *Server) Run(ctx context.Context) error {
	defer close(s.done)
	defer s.superseding.Wait()
	defer s.closeBucket()
	defer s.pruning.Wait() // before the bucket closes
	owner, stopOwner := s.startOwner(ctx)
	defer stopOwner()
	evlog, err := podevents.OpenAppender(ctx, s.opts.EventsURL, s.log, 10*time.Second, 5*time.Second)
	if err != nil {
		s.log.Warn("cannot open the error prefix for events; relaunches are not drawn in the report", "prefix", s.opts.EventsURL, "err", err)
	}
	defer evlog.Close()
	for _, d := range s.job.Decisions() {
		owner(d) // carried again: the owner is idempotent
	}
	if end, err := s.jobDone(ctx); end {
		return err
	}
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	var batch []*call
	for {
		timer.Stop()
		var tick <-chan time.Time
		if d := s.job.Deadline(); !d.IsZero() {
			timer.Reset(time.Until(d))
			tick = timer.C
		}
		select {
		case <-ctx.Done():
			s.fail(errStopped)
			return nil
		case c := <-s.inbox:
			batch = append(batch, c)
		case <-tick:
			batch = append(batch, newCall(func(s *Server, now time.Time) { s.job.Tick(now) }))
		}
		// Group commit: take whatever else is queued, up to a bound. The
		// connections' goroutines that have a call ready hand it in first
		// (Gosched): on a busy master a batch then holds several calls,
		// not one (16 store clients on mem://: 1.2 → 4.5 calls a batch,
		// the master's CPU a call 48 → 35 µs, p50 0.6 → 0.5 ms).
		runtime.Gosched()
	more:
		for len(batch) < 1024 {
			select {
			case c := <-s.inbox:
				batch = append(batch, c)
			default:
				break more
			}
		}
		var answered []*call
		if s.formingSince.IsZero() {
			s.formingSince = time.Now() // a round may start forming in this batch
		}
		for _, c := range batch {
			c.apply(s, time.Now())
			if !c.live() {
				answered = append(answered, c)
			}
		}
		batch = batch[:0]
		settling := time.Now()
		woken, ready, wrote, err := s.settle(ctx)
		answered = append(answered, woken...)
		if err == nil && !wrote && len(answered) > 0 {
			// Nothing written, so nothing fenced this batch: its answers
			// (reads, held calls) go out only if the state is still ours.
			err = s.confirmHeld(ctx)
		}
		if err != nil && ctx.Err() != nil {
			s.fail(errStopped)
			return nil
		}
		if err != nil {
			s.err = err
			s.fail(fmt.Errorf("%w: %w", errStopped, err))
			return err
		}
		// Nothing was answered while the state held the loop: that time is
		// no node's silence (a storage stall longer than the heartbeat
		// timeout would otherwise have every node declared lost).
		s.job.Stalled(time.Since(settling), time.Now())
		for _, c := range answered {
			c.release()
		}
		for _, d := range ready.Decided {
			owner(d)
			if ev, ok := relaunchEvent(d); ok {
				evlog.Append(ev)
			}
		}
		s.tellRound(ready.Rounds)
		s.supersedeAfterRound(ctx, ready.Rounds)
		if end, err := s.jobDone(ctx); end {
			return err
		}
	}
}

// jobDone ends Run, with ExitWhenDone, once the job succeeded or was stopped
// with every node gone (a master restarted on such a state ends at once).
func (s *Server) jobDone(ctx context.Context) (bool, error) {
	if !s.opts.ExitWhenDone {
		return false, nil
	}
	if s.job.Succeeded() {
		if err := s.supersedeOnSuccess(ctx); err != nil {
			// Exiting 0 with them in place would read as a departed
			// pod's failure: the restarted master tries again.
			err = fmt.Errorf("the departed pods' documents: %w", err)
			s.err = err
			s.fail(fmt.Errorf("%w: %w", errStopped, err))
			return true, err
		}
		s.log.Info("job succeeded: every node of the latest round finished its workers", "round", s.job.Latest().Number)
		s.succeeded.Store(true)
		s.fail(fmt.Errorf("%w: job succeeded", errStopped))
		return true, nil
	}
	d, ok := s.job.StoppedAndLeft()
	if !ok {
		return false, nil
	}
	key, err := s.writeStopDocument(ctx, d)
	if err != nil {
		// Exiting 0 without it could read as the job's success: the
		// restarted master (the pod's OnFailure) tries again.
		s.err = err
		s.fail(fmt.Errorf("%w: %w", errStopped, err))
		return true, err
	}
	s.log.Info("job stopped and every node has left: the master ends", "reason", d.Message, "document", key)
	s.stoppedForGood.Store(true)
	s.fail(fmt.Errorf("%w: job stopped", errStopped))
	return true, nil
}

// settle takes the job's Ready: logs, metrics, wake-ups, then persists the
// batch. The woken calls' answers are returned to be released with the
// batch's own, once durable, and the Ready for the decisions and rounds.
func (s *Server) settle(ctx context.Context) (answered []*call, r Ready, wrote bool, err error) {
	r = s.job.Ready()
	for _, l := range r.Log {
		level := slog.LevelInfo
		if l.Level == "warn" {
			level = slog.LevelWarn
		}
		s.log.Log(ctx, level, l.Msg, l.Attrs...)
	}
	now := time.Now()
	for range r.Rounds {
		s.metrics.rounds.Inc()
		s.metrics.rendezvousLatency.Observe(now.Sub(s.formingSince).Seconds())
		s.formingSince = now
	}
	if s.job.nWaiting == 0 {
		s.formingSince = time.Time{} // nobody waits: the next round starts forming with the next join
	}
	s.metrics.heartbeatsMissed.Add(float64(len(r.Dead)))
	for _, d := range r.Decided {
		s.metrics.decisions.WithLabelValues(KindName(d.Kind), d.Reason).Inc()
	}
	evalAll := func(m map[int][]*call) {
		for rank := range m {
			answered = s.evalWaiters(m, rank, answered)
		}
	}
	switch {
	case r.WakeAll:
		evalAll(s.joinWaiters)
		evalAll(s.hbWaiters)
	case r.WakeHeartbeats:
		evalAll(s.hbWaiters)
	}
	for rank := range r.Wake {
		answered = s.evalWaiters(s.joinWaiters, rank, answered)
		answered = s.evalWaiters(s.hbWaiters, rank, answered)
	}
	kvs, sessions := s.store.TakeChanges()
	for _, kv := range kvs {
		answered = s.evalStoreWaiters(kv.Key, answered)
	}
	records := s.job.dirtyRecords(r.Dirty)
	records = append(records, storeRecords(kvs, sessions)...)
	if len(records) > 0 && s.durable != nil {
		if err := s.persist(ctx, records); err != nil {
			return nil, Ready{}, false, err
		}
		wrote = true
	}
	return answered, r, wrote, nil
}

// tellRound tells Options.OnRound of the latest round if this batch
// completed it. Only the latest can have been seen by a pod: a round that
// another outdated in the same batch was never answered to anyone (the
// woken calls are answered from the state after the batch).
func (s *Server) tellRound(completed []int64) {
	l := s.job.Latest()
	if s.opts.OnRound == nil || l == nil || !slices.Contains(completed, l.Number) {
		return
	}
	s.opts.OnRound(l.completed())
}

// confirmHeld checks that no other master has written the state since this
// one's last batch, retrying what is not an answer (an unreadable store)
// until it is one; a fence or the end of ctx stops it.
func (s *Server) confirmHeld(ctx context.Context) error {
	if s.durable == nil {
		return nil
	}
	return s.retryState(ctx, "check held", "cannot check that this master still holds the state; retrying (nothing is answered meanwhile)", s.durable.held)
}

// retryState runs op (named name in the logs) on the state, each try
// bounded, with backoff, until it succeeds, fails for good (ErrFenced,
// ErrStateIO) or ctx ends. A try slower than slowStateOp is logged with
// its HTTP steps.
func (s *Server) retryState(ctx context.Context, name, msg string, op func(context.Context) error) error {
	backoff := 50 * time.Millisecond
	for attempt := 1; ; attempt++ {
		octx, cancel := context.WithTimeout(ctx, 30*time.Second)
		octx, trace := traceState(octx)
		err := op(octx)
		cancel()
		if took := time.Since(trace.start); took > slowStateOp {
			s.log.Warn("a state operation was slow; nothing was answered meanwhile", "op", name, "took", took.Round(time.Millisecond),
				"attempt", attempt, "err", err, "steps", trace.String())
		}
		if err == nil || errors.Is(err, ErrFenced) || errors.Is(err, ErrStateIO) || ctx.Err() != nil {
			return err
		}
		s.metrics.stateErrors.Inc()
		s.log.Error(msg, "attempt", attempt, "err", err)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(backoff + rand.N(backoff)):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

// persist writes one batch, retrying until it is durable; only a fence (or
// the end of ctx) stops it. Nothing is acknowledged meanwhile.
func (s *Server) persist(ctx context.Context, records []*masterpb.StateRecord) error {
	start := time.Now()
	if err := s.retryState(ctx, "write batch", "cannot write master state; retrying (nothing is acknowledged meanwhile)", func(ctx context.Context) error {
		return s.durable.append(ctx, records)
	}); err != nil {
		return err
	}
	s.metrics.stateWrites.Inc()
	s.metrics.stateWriteSeconds.Observe(time.Since(start).Seconds())
	if s.durable.wantsSnapshot() {
		all := s.job.allRecords()
		kvs, sessions := s.store.Snapshot()
		all = append(all, storeRecords(kvs, sessions)...)
		wctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
		defer cancel()
		prune, err := s.durable.snapshot(wctx, all)
		if err != nil {
			// The log still holds everything; a later batch tries again.
			s.log.Warn("cannot write master state snapshot", "err", err)
		}
		if prune != nil {
			s.pruning.Go(func() {
				pctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
				defer cancel()
				start := time.Now()
				if err := prune(pctx); err != nil && ctx.Err() == nil {
					// They load the same; they only take room.
					s.log.Warn("cannot delete every batch the snapshot replaced; they stay, and a restarted master skips them", "err", err)
					return
				}
				s.log.Debug("deleted the batches the snapshot replaced", "took", time.Since(start))
			})
		}
	}
	return nil
}

func (s *Server) evalWaiters(m map[int][]*call, rank int, answered []*call) []*call {
	ws := m[rank]
	if len(ws) == 0 {
		return answered
	}
	keep := ws[:0]
	for _, c := range ws {
		switch {
		case !c.live():
			// abandoned by its caller, or ended by fail: drop it
		case c.eval(s):
			answered = append(answered, c)
		default:
			keep = append(keep, c)
		}
	}
	if len(keep) == 0 {
		delete(m, rank)
	} else {
		m[rank] = keep
	}
	return answered
}

func (s *Server) evalStoreWaiters(key string, answered []*call) []*call {
	ws := s.storeWaiters[key]
	if len(ws) == 0 {
		return answered
	}
	delete(s.storeWaiters, key)
	for _, c := range ws {
		if !c.live() {
			continue
		}
		if c.eval(s) {
			answered = append(answered, c)
		}
		// else: it re-registered under its other missing keys
	}
	return answered
}

// fail ends every call that waits or is queued, as the loop ends: err wraps
// errStopped, so that the calls end UNAVAILABLE (grpcError) and the agents
// redial and retry, whatever stopped this master.
func (s *Server) fail(err error) {
	for _, m := range []map[int][]*call{s.joinWaiters, s.hbWaiters} {
		for _, ws := range m {
			for _, c := range ws {
				c.finish(nil, err)
			}
		}
	}
	for _, ws := range s.storeWaiters {
		for _, c := range ws {
			c.finish(nil, err)
		}
	}
}

// submit hands a call to the loop.
//
// While the state cannot be written, calls wait in the queue, reads
// included, and end at their deadline: the loop orders every call, and a
// read's answer may depend on writes it holds until they are durable.
// Refusing calls at once instead would refuse heartbeats too, and the
// nodes would be declared lost when the state came back.
func (s *Server) submit(ctx context.Context, c *call) error {
	select {
	case s.inbox <- c:
		return nil
	case <-s.done:
		return errStopped
	case <-ctx.Done():
		return ctx.Err()
	}
}

// errStopped is the answer of a master that stops: UNAVAILABLE, which the
// agents retry (a restarted or replacement master answers them).
var errStopped = errors.New("master stopping")

// barrier returns once a batch of the loop has passed: its answers are
// released only when the state is still this master's (confirmHeld).
func (s *Server) barrier(ctx context.Context) error {
	c := newCall(nil)
	c.apply = func(*Server, time.Time) { c.finish(nil, nil) }
	_, err := s.do(ctx, c, 0, nil)
	return err
}

// do runs apply in the loop and waits for its durable answer; wait > 0 lets
// a call that is left waiting give up after wait, with timeout's answer.
func (s *Server) do(ctx context.Context, c *call, wait time.Duration, timeout func() (any, error)) (any, error) {
	if err := s.submit(ctx, c); err != nil {
		return nil, err
	}
	var expire <-chan time.Time
	if wait > 0 {
		t := time.NewTimer(wait)
		defer t.Stop()
		expire = t.C
	}
	select {
	case <-c.done:
		return c.result, c.err
	case <-s.done:
		select {
		case <-c.done:
			return c.result, c.err
		default:
		}
		if c.err != nil {
			return nil, c.err
		}
		return nil, errStopped
	case <-expire:
		if c.abandon() {
			// "Nothing yet" is an answer too: it goes out once the loop
			// has confirmed that this master still holds the state.
			if err := s.barrier(ctx); err != nil {
				return nil, err
			}
			return timeout()
		}
	case <-ctx.Done():
		if c.abandon() {
			return nil, ctx.Err()
		}
	}
	// Answered meanwhile: it is being made durable. A caller that gives up
	// meanwhile gets its context's error, not the answer (which is not
	// acknowledged until durable), so that a state that cannot be written
	// (a full disk) ends each call at its deadline instead of holding it.
	select {
	case <-c.done:
		return c.result, c.err
	case <-s.done:
		return nil, errStopped
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// ---- owner ----

// startOwner runs the PodOwner beside the loop: decisions are queued and
// carried with retries, so that a slow API server never stalls the master.
func (s *Server) startOwner(ctx context.Context) (func(Decision), func()) {
	if s.opts.Owner == nil {
		return func(Decision) {}, func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-ctx.Done():
				return
			case d := <-s.decisions:
				s.carry(ctx, d)
			}
		}
	}()
	return func(d Decision) {
			select {
			case s.decisions <- d:
			default:
				s.log.Error("decision queue full; decision dropped", "decision", d.String())
			}
		}, func() {
			cancel()
			wg.Wait()
		}
}

func (s *Server) carry(ctx context.Context, d Decision) {
	backoff := 200 * time.Millisecond
	for attempt := 1; ctx.Err() == nil; attempt++ {
		cctx, cancel := context.WithTimeout(ctx, time.Minute)
		err := s.opts.Owner.Carry(cctx, d)
		cancel()
		if err == nil {
			s.log.Info("decision carried out", "seq", d.Seq, "kind", KindName(d.Kind), "rank", d.Rank, "pod", d.Pod)
			return
		}
		s.log.Warn("cannot carry out decision; retrying", "seq", d.Seq, "attempt", attempt, "err", err)
		if attempt >= 10 {
			s.log.Error("giving up on decision", "seq", d.Seq, "err", err)
			return
		}
		select {
		case <-ctx.Done():
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 30*time.Second)
	}
}

// PodGone reports a pod that ended without its agent saying so (from the
// owner of the pods).
func (s *Server) PodGone(ctx context.Context, pod string, f kferrors.Failure) error {
	c := newCall(nil)
	c.apply = func(s *Server, now time.Time) {
		_, news := s.job.PodGone(pod, f, now)
		c.finish(news, nil)
	}
	_, err := s.do(ctx, c, 0, nil)
	return err
}

// NodeNotReady hands the job the node controller's word that a pod's node
// is not ready (Job.NodeNotReady): the pod is taken out now if its agent
// is silent too, or later if it goes silent.
func (s *Server) NodeNotReady(ctx context.Context, n NodeNotReady) error {
	c := newCall(nil)
	c.apply = func(s *Server, now time.Time) {
		_, news := s.job.NodeNotReady(n, now)
		c.finish(news, nil)
	}
	_, err := s.do(ctx, c, 0, nil)
	return err
}

// relaunchEvent is the report's event of a relaunch decision.
func relaunchEvent(d Decision) (podevents.Event, bool) {
	if d.Kind == relaunch.None || d.Kind == StopJob || d.Pod == "" {
		return podevents.Event{}, false
	}
	counted := "not counted"
	if d.Counted {
		counted = "counted"
	}
	return podevents.Event{Time: d.Time, Pod: d.Pod, Kind: podevents.Relaunch, Code: d.Reason,
		Reason: KindName(d.Kind), Message: fmt.Sprintf("the master relaunches rank %d (%s, %s): %s", d.Rank, KindName(d.Kind), counted, d.Message)}, true
}

// ---- store records ----

func storeRecords(kvs []store.KV, sessions []store.Session) []*masterpb.StateRecord {
	out := make([]*masterpb.StateRecord, 0, len(kvs)+len(sessions))
	for _, kv := range kvs {
		out = append(out, &masterpb.StateRecord{Record: &masterpb.StateRecord_Kv{Kv: &masterpb.KVRecord{
			Key: kv.Key, Value: kv.Value, Deleted: kv.Deleted}}})
	}
	for _, ss := range sessions {
		out = append(out, &masterpb.StateRecord{Record: &masterpb.StateRecord_Session{Session: &masterpb.SessionRecord{
			Client: ss.Client, Seq: ss.Seq, Closed: ss.Closed, Response: storeResultPB(ss.Result)}}})
	}
	return out
}

func storeRecordsFrom(records []*masterpb.StateRecord) ([]store.KV, []store.Session) {
	var kvs []store.KV
	var sessions []store.Session
	for _, r := range records {
		switch x := r.GetRecord().(type) {
		case *masterpb.StateRecord_Kv:
			kvs = append(kvs, store.KV{Key: x.Kv.GetKey(), Value: x.Kv.GetValue(), Deleted: x.Kv.GetDeleted()})
		case *masterpb.StateRecord_Session:
			sessions = append(sessions, store.Session{Client: x.Session.GetClient(), Seq: x.Session.GetSeq(),
				Closed: x.Session.GetClosed(), Result: storeResultFrom(x.Session.GetResponse())})
		}
	}
	return kvs, sessions
}

func storeResultPB(r store.Result) *masterpb.StoreResponse {
	return &masterpb.StoreResponse{Value: r.Value, Values: r.Values, Number: r.Number, Ok: r.OK}
}

func storeResultFrom(p *masterpb.StoreResponse) store.Result {
	return store.Result{Value: p.GetValue(), Values: p.GetValues(), Number: p.GetNumber(), OK: p.GetOk()}
}

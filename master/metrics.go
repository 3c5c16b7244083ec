package master

import (
	"context"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// metrics are the master's Prometheus metrics (docs/DESIGN.md §5.10
// "Observability"), on a registry of its own.
type metrics struct {
	registry          *prometheus.Registry
	rounds            prometheus.Counter
	rendezvousLatency prometheus.Histogram
	heartbeatsMissed  prometheus.Counter
	decisions         *prometheus.CounterVec
	storeOps          *prometheus.CounterVec
	stateWrites       prometheus.Counter
	stateErrors       prometheus.Counter
	stateWriteSeconds prometheus.Histogram
	refused           prometheus.Counter
}

func newMetrics(s *Server) *metrics {
	m := &metrics{
		registry: prometheus.NewRegistry(),
		rounds: prometheus.NewCounter(prometheus.CounterOpts{Name: "kfelastic_master_rounds_total",
			Help: "Rendezvous rounds completed."}),
		rendezvousLatency: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "kfelastic_master_rendezvous_seconds",
			Help: "Time from the first join of a round to its completion.", Buckets: prometheus.ExponentialBuckets(0.01, 2, 16)}),
		heartbeatsMissed: prometheus.NewCounter(prometheus.CounterOpts{Name: "kfelastic_master_heartbeats_missed_total",
			Help: "Nodes declared lost because no call came within the heartbeat timeout."}),
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kfelastic_master_decisions_total",
			Help: "Relaunch decisions, by kind and the failure code that led to them."}, []string{"kind", "reason"}),
		storeOps: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kfelastic_master_store_operations_total",
			Help: "Torch store operations, by operation."}, []string{"op"}),
		stateWrites: prometheus.NewCounter(prometheus.CounterOpts{Name: "kfelastic_master_state_writes_total",
			Help: "Batches written to the durable state (one per group commit)."}),
		stateErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: "kfelastic_master_state_write_errors_total",
			Help: "Failed attempts to write the durable state (retried)."}),
		stateWriteSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "kfelastic_master_state_write_seconds",
			Help: "Time to make one batch durable.", Buckets: prometheus.ExponentialBuckets(0.0001, 2, 18)}),
		refused: prometheus.NewCounter(prometheus.CounterOpts{Name: "kfelastic_master_unauthenticated_total",
			Help: "Calls refused for a missing or wrong job token."}),
	}
	m.registry.MustRegister(m.rounds, m.rendezvousLatency, m.heartbeatsMissed, m.decisions, m.storeOps,
		m.stateWrites, m.stateErrors, m.stateWriteSeconds, m.refused, &stateCollector{s: s},
		prometheus.NewGoCollector(), prometheus.NewProcessCollector(prometheus.ProcessCollectorOpts{}))
	return m
}

var (
	nodesDesc = prometheus.NewDesc("kfelastic_master_nodes", "Ranks by the state of their current pod.", []string{"state"}, nil)
	roundDesc = prometheus.NewDesc("kfelastic_master_round", "Number of the latest completed round.", nil, nil)
	keysDesc  = prometheus.NewDesc("kfelastic_master_store_keys", "Keys in the torch store.", nil, nil)
	bytesDesc = prometheus.NewDesc("kfelastic_master_store_bytes", "Bytes of keys and values in the torch store.", nil, nil)
)

// stateCollector reads the job's counts from the loop at scrape time.
type stateCollector struct{ s *Server }

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- nodesDesc
	ch <- roundDesc
	ch <- keysDesc
	ch <- bytesDesc
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	type counts struct {
		states     map[NodeState]int
		round      int64
		keys       int
		storeBytes int64
	}
	call := newCall(nil)
	call.apply = func(s *Server, now time.Time) {
		k := counts{states: map[NodeState]int{}, round: s.job.latestNumber(), keys: s.store.Len(), storeBytes: s.store.Bytes()}
		for _, n := range s.job.nodes {
			k.states[n.State]++
		}
		call.finish(k, nil)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	res, err := c.s.do(ctx, call, 0, nil)
	if err != nil {
		return
	}
	k := res.(counts)
	for _, st := range []NodeState{Joining, Running, Succeeded, Failed} {
		ch <- prometheus.MustNewConstMetric(nodesDesc, prometheus.GaugeValue, float64(k.states[st]), string(st))
	}
	ch <- prometheus.MustNewConstMetric(roundDesc, prometheus.GaugeValue, float64(k.round))
	ch <- prometheus.MustNewConstMetric(keysDesc, prometheus.GaugeValue, float64(k.keys))
	ch <- prometheus.MustNewConstMetric(bytesDesc, prometheus.GaugeValue, float64(k.storeBytes))
}

// MetricsHandler serves the master's metrics in Prometheus' format.
func (s *Server) MetricsHandler() http.Handler {
	return promhttp.HandlerFor(s.metrics.registry, promhttp.HandlerOpts{})
}

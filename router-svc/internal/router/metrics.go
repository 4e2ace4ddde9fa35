package router

import (
	"time"

	"github.com/baton-serving/baton/router-svc/internal/workers"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// LatencyBuckets span LLM request latencies: 1 ms to 60 s.
var latencyBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 20, 30, 60}

type metrics struct {
	ttft     prometheus.Histogram
	e2e      prometheus.Histogram
	requests *prometheus.CounterVec
	// prefixPages and prefixHeld count, by role, the reusable leading
	// pages of the prompts routed and those the chosen worker held by the
	// router's index of its prefix cache: their ratio is the hit rate the
	// routing earned, whatever the policy.
	prefixPages, prefixHeld, prefixReported *prometheus.CounterVec
}

func newMetrics(reg *prometheus.Registry, inf *inflight) *metrics {
	m := &metrics{
		ttft: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "baton:time_to_first_token_seconds", Help: "Time from a request's arrival at the router to its first generated token.",
			Buckets: latencyBuckets}),
		e2e: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "baton:e2e_request_latency_seconds", Help: "Time from a request's arrival at the router to its end, whatever the outcome.",
			Buckets: latencyBuckets}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "baton_router_requests_total", Help: "Requests the router finished, by gRPC status code; HTTP requests refused before they ran (401, 404, 405, 413, ...) under the code of their status."}, []string{"code"}),
		prefixPages: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "baton_router_prefix_pages_total", Help: "Full leading pages of the prompts routed that a worker's prefix cache could supply (all but the page of the last prompt token), by the role of the worker chosen."}, []string{"role"}),
		prefixHeld: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "baton_router_prefix_pages_held_total", Help: "Of baton_router_prefix_pages_total, the pages the chosen worker held by the router's index of its prefix cache — the router's estimate, counting the prompts it routed there in the last seconds before the worker's reports confirm them — by role."}, []string{"role"}),
		prefixReported: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "baton_router_prefix_pages_reported_total", Help: "Of baton_router_prefix_pages_held_total, the pages the chosen worker's own cache reports held, by role."}, []string{"role"}),
	}
	reg.MustRegister(m.ttft, m.e2e, m.requests, m.prefixPages, m.prefixHeld, m.prefixReported, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "baton_router_inflight_requests", Help: "Requests in flight at the router."},
		func() float64 { return float64(inf.len()) }))
	return m
}

// routed counts the prompt pages a pick could have reused and those its
// worker of role held.
func (m *metrics) routed(role string, p workers.Prefix) {
	if m == nil || p.Total == 0 {
		return
	}
	m.prefixPages.WithLabelValues(role).Add(float64(p.Total))
	m.prefixHeld.WithLabelValues(role).Add(float64(p.Held))
	m.prefixReported.WithLabelValues(role).Add(float64(p.Reported))
}

// cacheIndexCollector reports the router's index of each worker's prefix
// cache (baton_router_cache_index_pages{role, worker}).
type cacheIndexCollector struct {
	desc *prometheus.Desc
	sets func() []*workers.Set
}

func newCacheIndexCollector(sets func() []*workers.Set) *cacheIndexCollector {
	return &cacheIndexCollector{sets: sets, desc: prometheus.NewDesc("baton_router_cache_index_pages",
		"Pages of each worker's prefix cache in the router's index, from the cache events it streams with its load reports (0 while its stream is down: a worker whose stream broke is taken to hold nothing until its next snapshot).",
		[]string{"role", "worker"}, nil)}
}

// Describe implements prometheus.Collector.
func (c *cacheIndexCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

// Collect implements prometheus.Collector.
func (c *cacheIndexCollector) Collect(ch chan<- prometheus.Metric) {
	for _, s := range c.sets() {
		if s == nil {
			continue
		}
		role := workers.RoleName(s.Role())
		for _, w := range s.Workers() {
			ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(w.CachePages()), role, w.Addr)
		}
	}
}

// refused counts a request the HTTP layers refused before it reached run
// (openai.CountRefusals): it finished with code too.
func (m *metrics) refused(code codes.Code) {
	if m == nil {
		return
	}
	m.requests.WithLabelValues(code.String()).Inc()
}

func (m *metrics) observeEnd(err error, took time.Duration) {
	if m == nil {
		return
	}
	m.e2e.Observe(took.Seconds())
	m.requests.WithLabelValues(status.Code(err).String()).Inc()
}

package router

import (
	"time"

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
	}
	reg.MustRegister(m.ttft, m.e2e, m.requests, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "baton_router_inflight_requests", Help: "Requests in flight at the router."},
		func() float64 { return float64(inf.len()) }))
	return m
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

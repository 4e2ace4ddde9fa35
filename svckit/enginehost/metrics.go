package enginehost

import (
	"math"
	"sync/atomic"
	"time"

	"github.com/baton-serving/baton/engine/sched"
	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"github.com/baton-serving/baton/kernels"
	"github.com/baton-serving/baton/svckit/canarylabel"
	"github.com/prometheus/client_golang/prometheus"
)

// Buckets for LLM latencies.
var (
	latencyBuckets    = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 20, 30, 60}
	interTokenBuckets = []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5}
)

// Metrics backs the scheduler's Observer with Prometheus metrics, under the
// names operators of other PD serving systems already graph (baton: prefix).
type Metrics struct {
	running, queue, prefillInflight, prealloc, transfer, prefilling prometheus.Gauge
	pagesUsed, pagesTotal, tokenUsage, genThroughput, leaked        prometheus.Gauge
	stalled                                                         prometheus.Gauge
	violations                                                      atomic.Uint64 // total since start, as the last audit counted
	ttft, e2e, itl, stepSeconds                                     prometheus.Histogram
	finished, canaries                                              *prometheus.CounterVec
	aborts                                                          *prometheus.CounterVec
	KVTransferBytes                                                 prometheus.Counter
	KVTransferSeconds                                               prometheus.Histogram
	cacheHitRate, prefixPages                                       prometheus.Gauge
	evictions                                                       atomic.Uint64 // the pool's count, as the last gauges saw it
	hits                                                            hitWindow
}

// hitWindowSize is how many recent requests baton:cache_hit_rate covers.
const hitWindowSize = 256

// hitWindow holds the prompt and cached token counts of the last
// hitWindowSize requests (canaries left out). Only the scheduler's
// goroutine writes it, through RequestDone.
type hitWindow struct {
	prompt, cached [hitWindowSize]int
	next, n        int
	sumP, sumC     int
}

// add records a request and returns the window's hit rate.
func (w *hitWindow) add(prompt, cached int) float64 {
	if w.n == hitWindowSize {
		w.sumP -= w.prompt[w.next]
		w.sumC -= w.cached[w.next]
	} else {
		w.n++
	}
	w.prompt[w.next], w.cached[w.next] = prompt, cached
	w.sumP += prompt
	w.sumC += cached
	w.next = (w.next + 1) % hitWindowSize
	if w.sumP == 0 {
		return 0
	}
	return float64(w.sumC) / float64(w.sumP)
}

func newMetrics(reg *prometheus.Registry, role batonv1.WorkerRole) *Metrics {
	g := func(name, help string) prometheus.Gauge {
		return prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help})
	}
	h := func(name, help string, b []float64) prometheus.Histogram {
		return prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, Buckets: b})
	}
	m := &Metrics{
		running:         g("baton:num_running_reqs", "Requests decoding in the running batch."),
		queue:           g("baton:num_queue_reqs", "Requests waiting for KV cache pages to start computing."),
		prefilling:      g("baton_num_prefilling_reqs", "Requests computing their prompt."),
		prefillInflight: g("baton:num_prefill_inflight_queue_reqs", "Prefill: requests whose prompt is done and whose KV cache is being sent to decode."),
		prealloc:        g("baton:num_decode_prealloc_queue_reqs", "Decode: requests waiting for KV cache pages to be reserved."),
		transfer:        g("baton:num_decode_transfer_queue_reqs", "Decode: requests whose KV cache is arriving from prefill."),
		pagesUsed:       g("baton_kv_pages_used", "KV cache pages in use."),
		pagesTotal:      g("baton_kv_pages_total", "KV cache pages in all."),
		tokenUsage:      g("baton:token_usage", "Fraction of KV cache pages in use."),
		genThroughput:   g("baton:gen_throughput", "Generated tokens per second, recent average."),
		leaked:          g("baton_kv_pages_leaked", "KV cache pages in use but owned by no live request, as the last audit found (must be 0)."),
		stalled:         g("baton_scheduler_stalled", "1 while the progress watchdog finds the engine stuck: a forward step past its bound, or computable requests without a step for --stall-timeout (readiness is NOT_SERVING then)."),
		ttft:            h("baton:time_to_first_token_seconds", "Time from a request's arrival at this worker to its first token.", latencyBuckets),
		e2e:             h("baton:e2e_request_latency_seconds", "Time from a request's arrival at this worker to its release.", latencyBuckets),
		itl:             h("baton:inter_token_latency_seconds", "Time between consecutive generated tokens of a request.", interTokenBuckets),
		stepSeconds:     h("baton_step_seconds", "Duration of one scheduler step (a batched forward pass).", interTokenBuckets),
		finished: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "baton_requests_finished_total",
			Help: "Requests released by the scheduler, by finish reason."}, []string{"finish"}),
		canaries: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "baton_canary_requests_total",
			Help: "Router canary requests released by the scheduler, by finish reason (left out of every other request statistic)."}, []string{"finish"}),
		aborts: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "baton_request_aborts_total",
			Help: "Requests that ended early, by the stage they were in and the reason."}, []string{"stage", "reason"}),
		KVTransferBytes: prometheus.NewCounter(prometheus.CounterOpts{Name: "baton:kv_transfer_bytes_total",
			Help: "KV cache bytes (K and V) moved between prefill and decode by this worker."}),
		KVTransferSeconds: h("baton:kv_transfer_seconds", "Duration of a request's KV cache transfer, handshake to PrefillDone.", latencyBuckets),
		cacheHitRate:      g("baton:cache_hit_rate", "Prompt tokens reused from the prefix cache / prompt tokens, over the last 256 requests."),
		prefixPages:       g("baton:prefix_cache_pages", "KV cache pages the prefix cache keeps (held by requests or evictable)."),
	}
	reg.MustRegister(m.running, m.queue, m.prefilling, m.prefillInflight, m.prealloc, m.transfer,
		m.pagesUsed, m.pagesTotal, m.tokenUsage, m.genThroughput, m.leaked, m.stalled,
		m.ttft, m.e2e, m.itl, m.stepSeconds, m.finished, m.canaries, m.aborts, m.KVTransferBytes, m.KVTransferSeconds,
		m.cacheHitRate, m.prefixPages)
	reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "baton_prefix_cache_evictions_total",
		Help: "KV cache pages evicted from the prefix cache since start."},
		func() float64 { return float64(m.evictions.Load()) }))
	// The scheduler counts violations itself; the counter shows its count.
	reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "baton_invariant_violations_total",
		Help: "Scheduler invariant violations found by audits since start (must stay 0)."},
		func() float64 { return float64(m.violations.Load()) }))
	_ = role
	return m
}

// Gauges implements sched.Observer.
func (m *Metrics) Gauges(g sched.Gauges) {
	m.running.Set(float64(g.Running))
	m.queue.Set(float64(g.Waiting))
	m.prefilling.Set(float64(g.Prefilling))
	m.prefillInflight.Set(float64(g.HandingOver))
	m.prealloc.Set(float64(g.Prealloc))
	m.transfer.Set(float64(g.Transferring))
	m.pagesUsed.Set(float64(g.PagesUsed))
	m.pagesTotal.Set(float64(g.PagesTotal))
	m.tokenUsage.Set(g.TokenUsage)
	m.genThroughput.Set(g.GenThroughput)
	m.prefixPages.Set(float64(g.PrefixCachePages))
	m.evictions.Store(g.PrefixEvictions)
}

// Step implements sched.Observer. Canaries' token gaps are left out of the
// inter-token latencies, as they are of every other user statistic.
func (m *Metrics) Step(s sched.StepStats) {
	if s.Seqs > 0 {
		m.stepSeconds.Observe(s.Duration.Seconds())
	}
	for i, gap := range s.TokenGaps {
		if i < len(s.GapRequests) && canarylabel.Is(s.GapRequests[i]) {
			continue
		}
		m.itl.Observe(gap.Seconds())
	}
}

// RequestDone implements sched.Observer.
func (m *Metrics) RequestDone(s sched.Summary) {
	if canarylabel.Is(s.ID) {
		m.canaries.WithLabelValues(s.Finish.String()).Inc()
		return
	}
	m.finished.WithLabelValues(s.Finish.String()).Inc()
	if s.Choice == 0 {
		// A request's prompt counts once: its other choices fork from it.
		m.cacheHitRate.Set(m.hits.add(s.Usage.PromptTokens, s.Usage.CachedTokens))
	}
	if s.TTFT > 0 {
		m.ttft.Observe(s.TTFT.Seconds())
	}
	m.e2e.Observe(s.E2E.Seconds())
	switch s.Finish {
	case sched.FinishCancelled, sched.FinishAborted, sched.FinishError:
		m.aborts.WithLabelValues(s.Stage.String(), s.Finish.String()).Inc()
	}
}

// TransferDone records the duration of request id's completed KV transfer,
// unless the request is a canary.
func (m *Metrics) TransferDone(id string, took time.Duration) {
	if !canarylabel.Is(id) {
		m.KVTransferSeconds.Observe(took.Seconds())
	}
}

// Audit implements sched.Observer.
func (m *Metrics) Audit(a sched.AuditReport) {
	m.leaked.Set(float64(a.LeakedPages))
	m.violations.Store(a.TotalViolations)
}

// registerDeviceMetrics exports what a backend with memory of its own (a
// GPU) holds: baton_device_memory_bytes{use="weights"|"kv_cache"|"buffers"}
// and the device's free and total memory. The CPU backend has none of its
// own to report (the weights are the file's mapping, the pages the pool's).
func registerDeviceMetrics(reg *prometheus.Registry, b kernels.Backend) {
	r, ok := b.(kernels.MemoryReporter)
	if !ok {
		return
	}
	read := func(f func(kernels.Memory) int64) func() float64 {
		return func() float64 {
			m, err := r.Memory()
			if err != nil {
				return math.NaN()
			}
			return float64(f(m))
		}
	}
	for use, f := range map[string]func(kernels.Memory) int64{
		"weights":  func(m kernels.Memory) int64 { return m.Weights },
		"kv_cache": func(m kernels.Memory) int64 { return m.KV },
		"buffers":  func(m kernels.Memory) int64 { return m.Buffers },
	} {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "baton_device_memory_bytes",
			Help:        "Device memory the engine's backend holds, by use (weights, kv_cache, buffers).",
			ConstLabels: prometheus.Labels{"use": use},
		}, read(f)))
	}
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "baton_device_memory_free_bytes", Help: "Free memory of the engine's device, as its driver reports it.",
	}, read(func(m kernels.Memory) int64 { return m.Free })))
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "baton_device_memory_total_bytes", Help: "Total memory of the engine's device.",
	}, read(func(m kernels.Memory) int64 { return m.Total })))
}

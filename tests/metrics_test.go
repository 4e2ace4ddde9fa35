//go:build e2e

package tests

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// scrape parses a service's /metrics with the Prometheus text parser.
func scrape(t testing.TB, httpAddr string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get("http://" + httpAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("%s/metrics is not Prometheus text: %v", httpAddr, err)
	}
	return fams
}

// designMetrics are the metrics docs/observability.md and DESIGN.md name,
// by the services that export them.
var designMetrics = map[string][]string{
	"worker": {
		"baton:num_running_reqs", "baton:num_queue_reqs", "baton:num_prefill_inflight_queue_reqs",
		"baton:num_decode_prealloc_queue_reqs", "baton:num_decode_transfer_queue_reqs",
		"baton:token_usage", "baton:gen_throughput",
		"baton:time_to_first_token_seconds", "baton:inter_token_latency_seconds", "baton:e2e_request_latency_seconds",
		"baton:kv_transfer_bytes_total", "baton:kv_transfer_seconds",
		"baton_kv_pages_leaked", "baton_invariant_violations_total", "baton_requests_finished_total",
		"baton:oldest_inflight_request_age_seconds", "baton_scheduler_stalled",
	},
	"router": {
		"baton:time_to_first_token_seconds", "baton:e2e_request_latency_seconds",
		"baton_router_requests_total", "baton_router_inflight_requests",
	},
	"all": {"baton_build_info", "baton_gpu_available", "process_cpu_seconds_total", "go_goroutines"},
}

// TestMetricsExposition: after PD, colocated and cancelled requests, every
// service's /metrics parses, every family has HELP, the metrics the design
// names are there, names carry their units, no label takes a request id or
// grows with traffic, latency buckets span LLM latencies, and the
// leak and invariant gauges read 0.
func TestMetricsExposition(t *testing.T) {
	g := loadGolden(t)
	c := startCluster(t, workerFlags)
	var ids []string
	for i, n := range []node{c.router, c.colocated, c.router} {
		req := greedy(g.Generations[i%len(g.Generations)].Prompt, 16)
		req.RequestId = fmt.Sprintf("metrics-probe-%d", i)
		ids = append(ids, req.RequestId)
		if _, err := complete(context.Background(), c.client(t, n), req); err != nil {
			t.Fatal(err)
		}
	}
	// One request cancelled mid-decode, for the aborts counter.
	ctx, cancel := context.WithCancel(context.Background())
	req := greedy("Once upon a time", 400)
	req.RequestId, req.Sampling.IgnoreEos = "metrics-probe-cancelled", true
	ids = append(ids, req.RequestId)
	stream, err := c.client(t, c.router).Generate(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	for {
		ev, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if len(ev.GetEvent().GetTokenIds()) > 0 {
			break
		}
	}
	cancel()
	c.waitIdle(t, 2*time.Second)

	for _, n := range []struct {
		node
		role string
	}{{c.prefill, "worker"}, {c.decode, "worker"}, {c.router, "router"}, {c.colocated, "router"}} {
		t.Run(n.name+"@"+n.http, func(t *testing.T) {
			fams := scrape(t, n.http)
			for _, name := range append(designMetrics[n.role], designMetrics["all"]...) {
				if fams[name] == nil {
					t.Errorf("metric %s missing", name)
				}
			}
			for name, f := range fams {
				checkFamily(t, name, f, ids)
			}
			if n.role == "worker" {
				for _, name := range []string{"baton_kv_pages_leaked", "baton_invariant_violations_total"} {
					if v := value(fams[name]); v != 0 {
						t.Errorf("%s = %v, want 0", name, v)
					}
				}
				checkBuckets(t, fams["baton:time_to_first_token_seconds"], 0.001, 60)
				checkBuckets(t, fams["baton:inter_token_latency_seconds"], 0.0001, 5)
			}
			checkBuckets(t, fams["baton:e2e_request_latency_seconds"], 0.001, 60)
			if v := value(fams["baton_gpu_available"]); v != 0 && v != 1 {
				t.Errorf("baton_gpu_available = %v", v)
			}
		})
	}
	// Aborts by stage and reason: the decode worker saw the cancel.
	if f := scrape(t, c.decode.http)["baton_request_aborts_total"]; f == nil || value(f) < 1 {
		t.Errorf("decode's baton_request_aborts_total does not count the cancelled request")
	} else {
		for _, m := range f.GetMetric() {
			if labelNames(m) != "reason,stage" {
				t.Errorf("baton_request_aborts_total labels %s, want reason,stage", labelNames(m))
			}
		}
	}
}

// checkFamily checks one metric family's HELP, name and labels.
func checkFamily(t *testing.T, name string, f *dto.MetricFamily, requestIDs []string) {
	t.Helper()
	if f.GetHelp() == "" {
		t.Errorf("%s has no HELP", name)
	}
	switch f.GetType() {
	case dto.MetricType_COUNTER:
		if !strings.HasSuffix(name, "_total") {
			t.Errorf("counter %s: name does not end in _total", name)
		}
	case dto.MetricType_HISTOGRAM:
		if !strings.HasSuffix(name, "_seconds") && !strings.HasSuffix(name, "_bytes") {
			t.Errorf("histogram %s: name carries no unit (_seconds, _bytes)", name)
		}
	}
	if strings.HasPrefix(name, "baton") && len(f.GetMetric()) > 64 {
		t.Errorf("%s has %d series: a label is not bounded", name, len(f.GetMetric()))
	}
	for _, m := range f.GetMetric() {
		for _, lp := range m.GetLabel() {
			if strings.Contains(strings.ToLower(lp.GetName()), "request") {
				t.Errorf("%s has a per-request label %q", name, lp.GetName())
			}
			for _, id := range requestIDs {
				if strings.Contains(lp.GetValue(), id) {
					t.Errorf("%s{%s=%q}: a request id became a label value", name, lp.GetName(), lp.GetValue())
				}
			}
		}
	}
}

// checkBuckets checks that a histogram's finite buckets run from lo to hi.
func checkBuckets(t *testing.T, f *dto.MetricFamily, lo, hi float64) {
	t.Helper()
	if f == nil || len(f.GetMetric()) == 0 {
		t.Errorf("histogram missing")
		return
	}
	b := f.GetMetric()[0].GetHistogram().GetBucket()
	if n := len(b); n > 0 && math.IsInf(b[n-1].GetUpperBound(), 1) {
		b = b[:n-1]
	}
	if len(b) < 2 || b[0].GetUpperBound() != lo || b[len(b)-1].GetUpperBound() != hi {
		var bounds []float64
		for _, x := range b {
			bounds = append(bounds, x.GetUpperBound())
		}
		t.Errorf("%s buckets %v, want %v to %v", f.GetName(), bounds, lo, hi)
	}
}

// value sums a gauge or counter family.
func value(f *dto.MetricFamily) float64 {
	v := 0.0
	for _, m := range f.GetMetric() {
		v += m.GetGauge().GetValue() + m.GetCounter().GetValue()
	}
	return v
}

func labelNames(m *dto.Metric) string {
	var names []string
	for _, lp := range m.GetLabel() {
		names = append(names, lp.GetName())
	}
	return strings.Join(names, ",")
}

package enginehost

import (
	"testing"
	"time"

	"github.com/baton-serving/baton/engine/sched"
	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
)

// TestCanaryMetrics: canary requests are counted by finish reason in
// baton_canary_requests_total and nowhere in the user statistics; other
// requests the other way round.
func TestCanaryMetrics(t *testing.T) {
	m := newMetrics(prometheus.NewRegistry(), batonv1.WorkerRole_WORKER_ROLE_DECODE)
	for _, s := range []sched.Summary{
		{ID: "canary-0a1b", Finish: sched.FinishLength, TTFT: time.Millisecond, E2E: 2 * time.Millisecond},
		{ID: "canary-0a1c", Finish: sched.FinishCancelled, Stage: sched.StateTransferring, E2E: time.Second},
		{ID: "req-1", Finish: sched.FinishLength, TTFT: time.Millisecond, E2E: 3 * time.Millisecond},
		{ID: "req-2", Finish: sched.FinishCancelled, Stage: sched.StateWaiting, E2E: time.Second},
		{ID: "my-canary-3", Finish: sched.FinishStop, TTFT: time.Millisecond, E2E: time.Millisecond}, // not the prefix
	} {
		m.RequestDone(s)
	}
	m.TransferDone("canary-0a1b", time.Millisecond)
	m.TransferDone("req-1", time.Millisecond)
	for _, c := range []struct {
		name string
		got  float64
		want float64
	}{
		{"canary length", testutil.ToFloat64(m.canaries.WithLabelValues("length")), 1},
		{"canary cancelled", testutil.ToFloat64(m.canaries.WithLabelValues("cancelled")), 1},
		{"finished length", testutil.ToFloat64(m.finished.WithLabelValues("length")), 1},
		{"finished cancelled", testutil.ToFloat64(m.finished.WithLabelValues("cancelled")), 1},
		{"finished stop", testutil.ToFloat64(m.finished.WithLabelValues("stop")), 1},
		{"aborts", testutil.ToFloat64(m.aborts.WithLabelValues("waiting", "cancelled")), 1},
		{"canary aborts", float64(testutil.CollectAndCount(m.aborts)), 1},
		{"ttft", float64(histCount(t, m.ttft)), 2},
		{"e2e", float64(histCount(t, m.e2e)), 3},
		{"kv transfer seconds", float64(histCount(t, m.KVTransferSeconds)), 1},
	} {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
}

func histCount(t *testing.T, h prometheus.Histogram) uint64 {
	t.Helper()
	ch := make(chan prometheus.Metric, 1)
	h.Collect(ch)
	var pb dto.Metric
	if err := (<-ch).Write(&pb); err != nil {
		t.Fatal(err)
	}
	return pb.GetHistogram().GetSampleCount()
}

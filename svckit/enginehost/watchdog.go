package enginehost

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/baton-serving/baton/engine/sched"
	"github.com/prometheus/client_golang/prometheus"
)

// Progress is the scheduler's progress watchdog: a readiness check that
// fails while work is waiting or running and no forward step has completed
// for the stall timeout, naming the oldest stuck requests. Readiness comes
// back by itself when steps resume. Requests waiting on a peer (pages being
// transferred in or handed over) do not count: their progress is the
// transfer's, bounded by its own deadlines.
func (h *Host) Progress(ctx context.Context) error {
	snap := h.Sched.Snapshot()
	stuck := stalled(snap, h.flags.StallTimeout)
	h.Metrics.stalled.Set(boolGauge(stuck != ""))
	if stuck == "" {
		return nil
	}
	return fmt.Errorf("%s", stuck)
}

func stalled(snap sched.Snapshot, after time.Duration) string {
	var busy []sched.RequestInfo
	for _, r := range snap.Requests {
		switch r.State {
		case sched.StateWaiting, sched.StatePrefilling, sched.StateRunning:
			if r.Mode == sched.ModeDecodeImported && r.State == sched.StateWaiting {
				continue // waiting for pages other requests hold; not the engine's stall
			}
			busy = append(busy, r)
		}
	}
	if len(busy) == 0 {
		return ""
	}
	// The clock starts at the later of the last completed step and the
	// arrival of the oldest request now waiting for one: an idle worker's
	// last step may be minutes old, and a request that arrived a moment ago
	// cannot have been starved for longer than its age.
	var oldest time.Duration
	for _, r := range busy {
		oldest = max(oldest, r.Age)
	}
	since := oldest
	if !snap.LastStep.IsZero() {
		since = min(since, snap.At.Sub(snap.LastStep))
	}
	if since < after {
		return ""
	}
	var ids []string
	for i, r := range busy {
		if i == 3 {
			ids = append(ids, fmt.Sprintf("and %d more", len(busy)-3))
			break
		}
		ids = append(ids, fmt.Sprintf("%s (%s, age %s)", r.ID, r.State, r.Age.Round(time.Millisecond)))
	}
	return fmt.Sprintf("no forward step for %s with %d requests to compute: %s",
		since.Round(time.Millisecond), len(busy), strings.Join(ids, ", "))
}

func boolGauge(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// oldestAge is the age of the oldest in-flight request, in seconds.
func (h *Host) oldestAge() float64 {
	snap := h.Sched.Snapshot()
	if len(snap.Requests) == 0 {
		return 0
	}
	return snap.Requests[0].Age.Seconds()
}

func (h *Host) registerProgressMetrics(reg *prometheus.Registry) {
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "baton:oldest_inflight_request_age_seconds",
		Help: "Age of the oldest request this worker holds (0 when idle).",
	}, h.oldestAge))
}

package enginehost

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/baton-serving/baton/engine/kvcache"
	"github.com/baton-serving/baton/engine/model"
	"github.com/baton-serving/baton/engine/sched"
	"github.com/prometheus/client_golang/prometheus"
)

// The progress watchdog tells a stuck engine from a slow one. A forward
// step in progress is progress until it outlives its bound: its expected
// time, from the measured speed × its tokens, times stepBoundFactor, and
// never less than --stall-timeout. So one long step of a big prompt is not
// a stall, while a hung kernel or a frozen step is still caught. Between
// steps, the clock runs only for requests the engine could compute:
// requests starved of pages or of a MaxSeqs slot that others hold (a
// transfer, most often) wait on their holders, whose own deadlines bound
// them. Readiness has hysteresis: once stalled, it comes back when the
// work is gone, or when steps have kept completing for recoveryFraction of
// the stall timeout — not on the first step between two hangs.
const (
	// stepBoundFactor is the slack over a step's expected time: steps
	// slow down under contention for the cores, and the estimate lags.
	stepBoundFactor = 4
	// speedMemory is the weight each earlier step keeps per new one, so
	// the speed follows the last few dozen steps.
	speedMemory = 0.95
	// recoveryFraction of the stall timeout is how long steps must keep
	// completing before a stalled worker reports ready again.
	recoveryFraction = 0.5
)

// stepSpeed is the measured forward-pass speed: seconds per token over the
// recent steps, each weighed by speedMemory per step since. Small steps
// (decode) cost more per token than big ones (prompt chunks), so a mix
// overestimates a big step's time, never underestimates it by much: the
// generous side for a stall bound.
type stepSpeed struct {
	mu      sync.Mutex
	seconds float64 // weighted sum of step durations
	tokens  float64 // weighted sum of step tokens
}

// observe records a completed step of n tokens that took d.
func (s *stepSpeed) observe(n int, d time.Duration) {
	if n <= 0 || d < 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seconds = s.seconds*speedMemory + d.Seconds()
	s.tokens = s.tokens*speedMemory + float64(n)
}

// expect is how long a step of n tokens should take (0 before any
// measurement).
func (s *stepSpeed) expect(n int) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.tokens == 0 {
		return 0
	}
	return time.Duration(float64(n) * s.seconds / s.tokens * float64(time.Second))
}

// calibrate measures the model's speed before the scheduler starts, with
// one forward pass over a page of tokens, so that even the first step has
// a bound from a measurement (a long prompt's first step may well outlast
// --stall-timeout). The pass also faults the weights in, so it is slow:
// the generous side.
func (s *stepSpeed) calibrate(m sched.Model, pool *kvcache.Pool) error {
	n := min(pool.Layout().PageSize, m.Config().ContextLength-1, 32)
	if n < 1 {
		return nil
	}
	table := pool.NewTable()
	defer func() { _ = table.Release() }()
	if err := table.Grow(n); err != nil {
		return fmt.Errorf("calibrating the step speed: %w", err)
	}
	tokens := make([]int32, n) // token 0 is in every vocabulary
	start := time.Now()
	if err := m.ForwardBatch(pool, []model.Chunk{{Tokens: tokens, Pages: table.Pages()}}); err != nil {
		return fmt.Errorf("calibrating the step speed: %w", err)
	}
	s.observe(n, time.Since(start))
	return nil
}

// watchdog is the progress watchdog's state: the measured speed and the
// verdict, which changes with hysteresis.
type watchdog struct {
	speed stepSpeed

	mu      sync.Mutex
	stalled bool
	tripped uint64    // steps completed when it last turned stalled
	healthy time.Time // while stalled: since when checks find progress (zero: not yet)
}

// assessment is one look at a snapshot.
type assessment struct {
	waited, bound time.Duration // waited ≥ bound: stuck
	busy          []sched.RequestInfo
	expected      time.Duration // of the step in progress
}

// assess measures how long the engine has gone without progress and what
// bound applies: for a step in progress, its running time against its
// bound; otherwise the time without a step, counted only while requests
// it could compute wait.
func assess(snap sched.Snapshot, timeout, expected time.Duration) assessment {
	a := assessment{bound: timeout}
	for _, r := range snap.Requests {
		switch r.State {
		case sched.StateWaiting, sched.StatePrefilling, sched.StateRunning:
			if r.Starved || (r.Mode == sched.ModeDecodeImported && r.State == sched.StateWaiting) {
				continue // waiting for capacity others hold; not the engine's stall
			}
			a.busy = append(a.busy, r)
		}
	}
	if snap.StepRunning > 0 {
		a.waited, a.expected = snap.StepRunning, expected
		a.bound = max(timeout, time.Duration(stepBoundFactor*float64(expected)))
		return a
	}
	if len(a.busy) == 0 {
		return a
	}
	// The clock starts at the later of the last completed step and the
	// arrival of the oldest request now waiting for one: an idle worker's
	// last step may be minutes old, and a request that arrived a moment ago
	// cannot have been starved for longer than its age.
	for _, r := range a.busy {
		a.waited = max(a.waited, r.Age)
	}
	if !snap.LastStep.IsZero() {
		a.waited = min(a.waited, snap.At.Sub(snap.LastStep))
	}
	return a
}

// check judges a snapshot and returns why the worker is stalled ("" when
// it is not).
func (w *watchdog) check(snap sched.Snapshot, timeout time.Duration) string {
	a := assess(snap, timeout, w.speed.expect(snap.StepTokens))
	over := a.waited >= a.bound
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case over:
		if !w.stalled {
			w.stalled, w.tripped = true, snap.Steps
		}
		w.healthy = time.Time{}
		return describe(snap, a)
	case !w.stalled:
		return ""
	case snap.StepRunning == 0 && len(a.busy) == 0:
		w.stalled = false // the work is gone: nothing is stuck
		return ""
	case snap.Steps == w.tripped || a.waited >= a.bound/2:
		w.healthy = time.Time{}
	case w.healthy.IsZero():
		w.healthy = snap.At
	}
	recovery := time.Duration(recoveryFraction * float64(timeout))
	if !w.healthy.IsZero() && snap.At.Sub(w.healthy) >= recovery {
		w.stalled = false
		return ""
	}
	return fmt.Sprintf("recovering from a stall: %d forward steps since, ready after %s of steady progress",
		snap.Steps-w.tripped, recovery)
}

// describe says what is stuck, naming the oldest requests.
func describe(snap sched.Snapshot, a assessment) string {
	var ids []string
	for i, r := range a.busy {
		if i == 3 {
			ids = append(ids, fmt.Sprintf("and %d more", len(a.busy)-3))
			break
		}
		ids = append(ids, fmt.Sprintf("%s (%s, age %s)", r.ID, r.State, r.Age.Round(time.Millisecond)))
	}
	step := ""
	if snap.StepRunning > 0 {
		step = fmt.Sprintf(" (the step in progress, %d tokens, is past its bound of %s)", snap.StepTokens, a.bound.Round(time.Millisecond))
	}
	return fmt.Sprintf("no forward step for %s%s with %d requests to compute: %s",
		a.waited.Round(time.Millisecond), step, len(a.busy), strings.Join(ids, ", "))
}

// Progress is the scheduler's progress watchdog, a readiness check: it
// fails while the engine is stuck (see the top of this file), naming the
// oldest requests it holds, and comes back by itself when steps resume.
func (h *Host) Progress(ctx context.Context) error {
	why := h.watchdog.check(h.Sched.Snapshot(), h.flags.StallTimeout)
	h.Metrics.stalled.Set(boolGauge(why != ""))
	if why == "" {
		return nil
	}
	return errors.New(why)
}

// stepExpected is how long the step in progress should take at the
// measured speed (0 when none runs or nothing is measured).
func (h *Host) stepExpected(snap sched.Snapshot) time.Duration {
	if snap.StepRunning == 0 {
		return 0
	}
	return h.watchdog.speed.expect(snap.StepTokens)
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
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "baton_step_running_seconds",
		Help: "How long the forward step in progress has been running (0 between steps); the watchdog calls it stuck past its bound.",
	}, func() float64 { return h.Sched.Snapshot().StepRunning.Seconds() }))
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "baton_step_seconds_per_token",
		Help: "Measured forward-step speed, seconds per token over the recent steps: the watchdog's bound for a step is its tokens times this, times 4, at least --stall-timeout.",
	}, func() float64 { return h.watchdog.speed.expect(1).Seconds() }))
}

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
// them — but only while live requests do hold that capacity: pages leaked
// (used in the pool, held by no live request) or a slot counted for no
// live request will never be freed, so a request starved of them is stuck
// like any other. Readiness has hysteresis: once stalled, it comes back when the
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
	// maxBoundFactor caps a step's bound at this many stall timeouts,
	// however slow the measured speed: a cold or inflated measurement must
	// not leave a hung step undetected for an hour.
	maxBoundFactor = 10
	// calibrateMinTimeout is the least time the calibration's forward
	// passes get at Open before Open fails (calibrateTimeout): the first
	// pass faults the weights in, which takes long for a big model.
	calibrateMinTimeout = 2 * time.Minute
)

// calibrateTimeout bounds the calibration at Open: the larger of
// calibrateMinTimeout and maxBoundFactor stall timeouts.
func calibrateTimeout(stall time.Duration) time.Duration {
	return max(calibrateMinTimeout, maxBoundFactor*stall)
}

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

// observe records a completed step of n tokens that took d. Once a speed
// is measured, d counts for at most the step's bound at that speed
// (stepBoundFactor × its expected time): a step that hung and then returned,
// or a frozen one, is not a measurement of the engine's speed, and taken
// whole it would raise the next steps' bounds for minutes.
func (s *stepSpeed) observe(n int, d time.Duration) {
	if n <= 0 || d < 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.tokens > 0 {
		limit := stepBoundFactor * float64(n) * s.seconds / s.tokens
		d = min(d, time.Duration(limit*float64(time.Second)))
	}
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

// calibrate measures the model's speed before the scheduler starts, so
// that even the first step has a bound from a measurement (a long prompt's
// first step may well outlast --stall-timeout). It runs two forward passes
// over a page of tokens and records the second: the first faults the
// weights in, and measured cold it would give the first steps bounds of an
// hour. The passes run on their own goroutine, bounded by ctx and timeout:
// a forward pass that hangs (a stuck kernel) fails calibration, and Open,
// with an error naming it instead of blocking Open — and SIGTERM — for
// ever. The hung goroutine is abandoned, holding its page and the model,
// for the process's exit to reclaim.
func (s *stepSpeed) calibrate(ctx context.Context, m sched.Model, pool *kvcache.Pool, timeout time.Duration) error {
	n := min(pool.Layout().PageSize, m.Config().ContextLength-1, 32)
	if n < 1 {
		return nil
	}
	table := pool.NewTable()
	if err := table.Grow(n); err != nil {
		_ = table.Release()
		return fmt.Errorf("calibrating the step speed: %w", err)
	}
	tokens := make([]int32, n) // token 0 is in every vocabulary
	type result struct {
		warm time.Duration
		err  error
	}
	done := make(chan result, 1) // buffered: an abandoned pass never blocks
	go func() {
		var r result
		for range 2 {
			start := time.Now()
			if r.err = m.ForwardBatch(pool, []model.Chunk{{Tokens: tokens, Pages: table.Pages()}}); r.err != nil {
				break
			}
			r.warm = time.Since(start)
		}
		_ = table.Release() // before the answer: the caller finds the page free
		done <- r
	}()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case r := <-done:
		if r.err != nil {
			return fmt.Errorf("calibrating the step speed: %w", r.err)
		}
		s.observe(n, r.warm)
		return nil
	case <-timer.C:
		return fmt.Errorf("calibrating the step speed: a %d-token forward pass did not return within %v (a hung kernel or device?); it is abandoned", n, timeout)
	case <-ctx.Done():
		return fmt.Errorf("calibrating the step speed: a %d-token forward pass did not return before %w", n, context.Cause(ctx))
	}
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
	// leakedPages and leakedSlots are the pages used and MaxSeqs slots
	// counted beyond those the live requests hold: capacity nothing will
	// free, so a request starved of it counts as stuck.
	leakedPages, leakedSlots int
}

// assess measures how long the engine has gone without progress and what
// bound applies: for a step in progress, its running time against its
// bound; otherwise the time without a step, counted only while requests
// it could compute wait.
func assess(snap sched.Snapshot, timeout, expected time.Duration) assessment {
	a := assessment{bound: timeout}
	owned, slots := 0, 0
	for _, r := range snap.Requests {
		owned += r.Pages
		switch r.State {
		case sched.StatePrefilling, sched.StateRunning, sched.StateTransferring:
			slots++
		}
	}
	g := snap.Gauges
	a.leakedPages = max(0, snap.Pages.Used-owned)
	a.leakedSlots = max(0, g.Prefilling+g.Running+g.Transferring-slots)
	held := a.leakedPages == 0 && a.leakedSlots == 0 // what starves requests is live requests'
	for _, r := range snap.Requests {
		switch r.State {
		case sched.StateWaiting, sched.StatePrefilling, sched.StateRunning:
			if (r.Starved && held) || (r.Mode == sched.ModeDecodeImported && r.State == sched.StateWaiting) {
				continue // waiting for capacity others hold; not the engine's stall
			}
			a.busy = append(a.busy, r)
		}
	}
	if snap.StepRunning > 0 {
		a.waited, a.expected = snap.StepRunning, expected
		a.bound = max(timeout, min(time.Duration(stepBoundFactor*float64(expected)), maxBoundFactor*timeout))
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
	leak := ""
	if a.leakedPages > 0 || a.leakedSlots > 0 {
		leak = fmt.Sprintf("; %d KV pages and %d MaxSeqs slots are held by no live request (leaked), so starved requests wait for nothing",
			a.leakedPages, a.leakedSlots)
	}
	return fmt.Sprintf("no forward step for %s%s with %d requests to compute: %s%s",
		a.waited.Round(time.Millisecond), step, len(a.busy), strings.Join(ids, ", "), leak)
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
		Help: "Measured forward-step speed, seconds per token over the recent steps: the watchdog's bound for a step is its tokens times this, times 4, at least --stall-timeout and at most 10 × --stall-timeout.",
	}, func() float64 { return h.watchdog.speed.expect(1).Seconds() }))
}

package canary

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// State is a pair's standing with the tracker.
type State int

const (
	// StatePending: no probe of the pair has ended yet.
	StatePending State = iota
	// StatePassing: the last probe passed; the pair takes traffic.
	StatePassing
	// StateQuarantined: the last probe failed or outlived its deadline;
	// the pair is routed around.
	StateQuarantined
)

func (s State) String() string {
	switch s {
	case StatePending:
		return "pending"
	case StatePassing:
		return "passing"
	case StateQuarantined:
		return "quarantined"
	}
	return fmt.Sprintf("State(%d)", int(s))
}

// MarshalText names the state in JSON.
func (s State) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// Probe results, the values of the result label.
const (
	ResultPass    = "pass"
	ResultFail    = "fail"
	ResultTimeout = "timeout"
	// ResultBusy is a probe that missed its deadline while the worker it
	// waited on kept computing (see Options.Progress): overloaded, not
	// stuck, and the pair keeps its state. Quarantining the only pair of a
	// busy fleet would turn overload into an outage.
	ResultBusy = "busy"
)

// busyFactor is how far past its expected time a step in progress still
// counts as computing, as the workers' own watchdogs allow.
const busyFactor = 4

// Progress is what a worker's last load report says of its forward steps.
type Progress struct {
	// Steps is the count of completed forward steps.
	Steps uint64
	// StepRunning is how long the step in progress has been running (0
	// between steps), StepExpected how long it should take at the
	// worker's measured speed (0: unknown).
	StepRunning, StepExpected time.Duration
}

// computing reports whether a worker made progress between two readings:
// a step completed, or the step in progress is long but within busyFactor
// of its expected time (one big prompt's step moves no count for seconds).
func computing(before, after Progress) bool {
	if after.Steps > before.Steps {
		return true
	}
	return after.StepRunning > 0 && after.StepExpected > 0 && after.StepRunning <= busyFactor*after.StepExpected
}

// stuck reports whether a worker's forward loop is frozen, so that it
// admits, activates and computes nothing, whatever its peer does: its step
// in progress is far past its expected time, and either no step completed
// over the whole probe (before to after; okBefore false when the first
// reading is unknown) or the step has run for at least the probe's
// deadline.
//
// Far past its expected time is not enough alone. The expected time comes
// from a per-token speed that the worker's recent steps set, which a
// decode step of one sequence after steps of many outlasts several times
// over (a step costs about the same whatever its batch); a worker that
// completed other steps while the probe waited was not frozen for it:
// without this the only pair of a fleet serving conversations, whose
// batches shrink and grow with think times, was quarantined (20 of 48
// multi-turn requests refused UNAVAILABLE in scripts/bench-prefix.sh's PD
// run). Nor may the step's age alone decide it: an idle worker frozen in
// the step that the probe's own request began, after the probe started,
// is younger than the deadline at the deadline, and its peer's progress on
// the same probe must not hide it (the chaos suite's stalled scheduler).
func stuck(before, after Progress, okBefore bool, deadline time.Duration) bool {
	if after.StepRunning <= 0 || after.StepExpected <= 0 || after.StepRunning <= busyFactor*after.StepExpected {
		return false
	}
	return after.StepRunning >= deadline || (okBefore && after.Steps == before.Steps)
}

// Options configure a Tracker.
type Options struct {
	// Probe sends one canary through a pair (required); usually
	// (*Prober).Probe.
	Probe Probe
	// Interval between probes of a passing pair (default 15 s).
	Interval time.Duration
	// QuarantineInterval between probes of a quarantined or pending pair
	// (default Interval/3), so that a pair that recovers is back soon.
	QuarantineInterval time.Duration
	// Timeout is each probe's deadline (default 5 s). A probe that misses
	// it quarantines the pair, unless Progress shows the worker it waits
	// on computing meanwhile (ResultBusy: overloaded, not stuck): the one
	// its Stage names — decode at admission and for the last token,
	// prefill or decode for the first (prefill's compute, the transfer,
	// decode's page reservation), either when the probe names no stage.
	Timeout time.Duration
	// Progress returns a worker's forward-step progress (from its load
	// reports), ok false when unknown. Nil: every late probe quarantines.
	Progress func(addr string) (Progress, bool)
	// Concurrency bounds the probes in flight at once (default 4).
	Concurrency int
	// Logger gets one line per change of a pair's state (default: none).
	Logger *slog.Logger
	// Registry gets the canary's metrics (nil: none).
	Registry prometheus.Registerer
}

// PairStatus is a pair's state and last probe, for /debug/workers.
type PairStatus struct {
	Pair  Pair  `json:"pair"`
	State State `json:"state"`
	// Since is when the pair entered State.
	Since time.Time `json:"since"`
	// LastResult is the last probe's result ("" before any), LastError its
	// error, LastLatencySeconds how long it took, LastProbe when it ended.
	LastResult         string    `json:"last_result,omitempty"`
	LastError          string    `json:"last_error,omitempty"`
	LastLatencySeconds float64   `json:"last_latency_seconds"`
	LastProbe          time.Time `json:"last_probe,omitzero"`
	// Failures counts the probes that failed since the last that passed.
	Failures int `json:"consecutive_failures"`
	// Probing is true while a probe of the pair is running — or hung past
	// its deadline: a pair is never probed twice at once.
	Probing bool `json:"probing"`
}

// Tracker probes pairs and keeps their state. Its methods are safe for
// concurrent use; Allowed, Passing and Snapshot never wait for a probe.
type Tracker struct {
	o    Options
	log  *slog.Logger
	scan time.Duration
	sem  chan struct{}

	mu    sync.Mutex
	pairs map[Pair]*pairState

	probes   *prometheus.CounterVec
	duration *prometheus.HistogramVec
}

type pairState struct {
	PairStatus
	next time.Time // when the next probe is due
	gone time.Time // when the pairs function stopped returning it (zero: it returns it)
}

// New checks o, fills in its defaults and registers the metrics.
func New(o Options) (*Tracker, error) {
	if o.Probe == nil {
		return nil, errors.New("canary: Options.Probe is required")
	}
	if o.Interval == 0 {
		o.Interval = 15 * time.Second
	}
	if o.QuarantineInterval == 0 {
		o.QuarantineInterval = o.Interval / 3
	}
	if o.Timeout == 0 {
		o.Timeout = 5 * time.Second
	}
	if o.Concurrency == 0 {
		o.Concurrency = 4
	}
	switch {
	case o.Interval < 0 || o.QuarantineInterval <= 0 || o.Timeout < 0:
		return nil, fmt.Errorf("canary: Interval %v, QuarantineInterval %v and Timeout %v must be positive", o.Interval, o.QuarantineInterval, o.Timeout)
	case o.Concurrency < 0:
		return nil, fmt.Errorf("canary: Concurrency %d, want ≥ 1", o.Concurrency)
	}
	t := &Tracker{o: o, log: o.Logger, sem: make(chan struct{}, o.Concurrency), pairs: map[Pair]*pairState{}}
	if t.log == nil {
		t.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	// Run looks for new pairs and due probes this often: a fraction of the
	// shortest interval, at most 250 ms (so a new pair waits little).
	t.scan = min(250*time.Millisecond, o.Interval/4, o.QuarantineInterval/4)
	t.scan = max(t.scan, time.Millisecond)
	t.probes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "baton_canary_probes_total", Help: "Canary probes of (prefill, decode) pairs, by result: pass, fail, timeout, or busy (late while the workers kept computing: not quarantined)."}, []string{"result"})
	t.duration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "baton_canary_probe_seconds", Help: "Duration of canary probes, by result (a timeout counts its deadline).",
		Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}}, []string{"result"})
	for _, r := range []string{ResultPass, ResultFail, ResultTimeout, ResultBusy} {
		t.probes.WithLabelValues(r) // export zeros: a dashboard sees the series before the first failure
	}
	if o.Registry != nil {
		for _, c := range []prometheus.Collector{t.probes, t.duration,
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "baton_canary_quarantined_pairs",
				Help: "(prefill, decode) pairs routed around because their last canary failed or stalled."},
				func() float64 { return float64(t.count(StateQuarantined)) }),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "baton_canary_passing_pairs",
				Help: "(prefill, decode) pairs whose last canary passed."},
				func() float64 { return float64(t.count(StatePassing)) }),
		} {
			if err := o.Registry.Register(c); err != nil {
				return nil, fmt.Errorf("canary: metrics: %w", err)
			}
		}
	}
	return t, nil
}

// Run probes the pairs that pairs returns until ctx ends: a pair it has not
// seen at once, then every Interval (QuarantineInterval while quarantined),
// at most Concurrency probes at a time. pairs is called often (several
// times a second at most) and must be cheap. Run returns when ctx has ended
// and every probe has returned; call it once.
func (t *Tracker) Run(ctx context.Context, pairs func() []Pair) {
	var wg sync.WaitGroup
	defer wg.Wait()
	tick := time.NewTicker(t.scan)
	defer tick.Stop()
	for {
		t.schedule(ctx, pairs(), &wg)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// schedule updates the set of pairs and starts the probes that are due, as
// many as free slots allow; the others wait for a later scan.
func (t *Tracker) schedule(ctx context.Context, current []Pair, wg *sync.WaitGroup) {
	now := time.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	live := make(map[Pair]bool, len(current))
	for _, p := range current {
		live[p] = true
	}
	for p, st := range t.pairs {
		switch {
		case live[p]:
			st.gone = time.Time{}
		case st.gone.IsZero():
			st.gone = now
		case now.Sub(st.gone) >= t.o.Interval && !st.Probing:
			delete(t.pairs, p)
		}
	}
	full := false
	for _, p := range current {
		st := t.pairs[p]
		if st == nil {
			st = &pairState{PairStatus: PairStatus{Pair: p, State: StatePending, Since: now}, next: now}
			t.pairs[p] = st
		}
		if full || st.Probing || now.Before(st.next) {
			continue
		}
		select {
		case t.sem <- struct{}{}:
		default:
			full = true // no free slot; a later scan tries again
			continue
		}
		st.Probing = true
		wg.Add(1)
		go func() {
			defer wg.Done()
			t.probe(ctx, p)
		}()
	}
}

// probe runs one probe of p and records its result. A probe that outlives
// its deadline is judged at the deadline; its slot is freed then, but the
// pair is not probed again until the probe has returned.
func (t *Tracker) probe(ctx context.Context, p Pair) {
	pctx, cancel := context.WithTimeout(ctx, t.o.Timeout)
	defer cancel()
	start := time.Now()
	before := t.progress(p)
	var stage atomic.Int32
	pctx = context.WithValue(pctx, stageKey{}, &stage)
	done := make(chan error, 1)
	go func() { done <- t.o.Probe(pctx, p) }()
	var err error
	returned := true
	select {
	case err = <-done:
	case <-pctx.Done():
		select {
		case err = <-done:
		default:
			returned = false
		}
	}
	took := time.Since(start)
	<-t.sem
	if ctx.Err() != nil {
		// The router is stopping: no verdict.
		if !returned {
			<-done
		}
		t.finish(p, nil)
		return
	}
	result := ResultPass
	switch {
	case !returned:
		result, err = ResultTimeout, fmt.Errorf("no answer within %v", t.o.Timeout)
	case err != nil && (pctx.Err() != nil || status.Code(err) == codes.DeadlineExceeded):
		// The probe's deadline travels with its RPCs: decode or prefill
		// may call it a moment before the probe's own timer does.
		result, err = ResultTimeout, fmt.Errorf("no answer within %v: %w", t.o.Timeout, err)
	case err != nil:
		result = ResultFail
	}
	if result == ResultTimeout {
		if who := t.busy(p, Stage(stage.Load()), before, t.progress(p)); who != "" {
			result, err = ResultBusy, fmt.Errorf("%w (%s computing: overloaded, not stuck)", err, who)
		}
	}
	t.probes.WithLabelValues(result).Inc()
	t.duration.WithLabelValues(result).Observe(took.Seconds())
	t.record(p, result, err, took)
	if !returned {
		// Judged already; wait for the probe so that the pair is not
		// probed twice at once, and keep its own account of the stall.
		late := <-done
		t.finish(p, late)
		return
	}
	t.finish(p, nil)
}

// progress reads the pair's workers' progress, by address (a worker whose
// progress is unknown is left out).
func (t *Tracker) progress(p Pair) map[string]Progress {
	out := map[string]Progress{}
	if t.o.Progress == nil {
		return out
	}
	for _, addr := range []string{p.Prefill, p.Decode} {
		if addr == "" {
			continue
		}
		if pr, ok := t.o.Progress(addr); ok {
			out[addr] = pr
		}
	}
	return out
}

// busy judges a late probe by the stage it waited in: it names the worker
// that kept computing meanwhile among those the stage waits on ("" when
// none did, or when one of them is stuck in a step, and the probe is a
// timeout). The first token needs both: decode's loop reserves the pages
// and activates the request, prefill computes the prompt.
func (t *Tracker) busy(p Pair, stage Stage, before, after map[string]Progress) string {
	var waitsOn []string
	switch {
	case p.Prefill == "" || stage == StageAdmission || stage == StageDecode:
		waitsOn = []string{p.Decode}
	default: // the first token, or no stage named
		waitsOn = []string{p.Prefill, p.Decode}
	}
	who := ""
	for _, addr := range waitsOn {
		b, okB := before[addr]
		a, okA := after[addr]
		switch {
		case okA && stuck(b, a, okB, t.o.Timeout):
			return ""
		case who == "" && okB && okA && computing(b, a):
			role := "decode"
			if addr == p.Prefill {
				role = "prefill"
			}
			who = fmt.Sprintf("%s %s, which the probe waited on at %s, kept", role, addr, stage)
		}
	}
	return who
}

// record applies a probe's result to p's state and logs a change of state.
func (t *Tracker) record(p Pair, result string, err error, took time.Duration) {
	now := time.Now()
	t.mu.Lock()
	st := t.pairs[p] // present: a probing pair is never deleted
	prev, since := st.State, st.Since
	st.LastResult, st.LastLatencySeconds, st.LastProbe, st.LastError = result, took.Seconds(), now, ""
	switch result {
	case ResultPass:
		st.State, st.Failures = StatePassing, 0
	case ResultBusy:
		st.LastError = err.Error() // the state stands
	default:
		st.State, st.LastError = StateQuarantined, err.Error()
		st.Failures++
	}
	if st.State != prev {
		st.Since = now
	}
	state := st.State
	t.mu.Unlock()

	if state == prev {
		return
	}
	switch {
	case state == StateQuarantined:
		t.log.Warn("canary: pair quarantined", "pair", p.String(), "prefill", p.Prefill, "decode", p.Decode,
			"result", result, "reason", err.Error(), "was", prev.String())
	case prev == StateQuarantined:
		t.log.Info("canary: pair quarantine lifted", "pair", p.String(), "prefill", p.Prefill, "decode", p.Decode,
			"quarantined_for", now.Sub(since).Round(time.Millisecond).String(), "latency", took.Round(time.Microsecond).String())
	default:
		t.log.Info("canary: pair passing", "pair", p.String(), "prefill", p.Prefill, "decode", p.Decode,
			"latency", took.Round(time.Microsecond).String())
	}
}

// finish marks p's probe over and schedules the next one. late is the error
// of a probe that returned after its deadline, kept as the detail of the
// timeout it was judged for.
func (t *Tracker) finish(p Pair, late error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	st := t.pairs[p]
	st.Probing = false
	if late != nil && st.LastResult == ResultTimeout {
		st.LastError = fmt.Sprintf("no answer within %v; then: %v", t.o.Timeout, late)
	}
	every := t.o.Interval
	if st.State != StatePassing {
		every = t.o.QuarantineInterval
	}
	st.next = time.Now().Add(every)
}

// Allowed reports whether p may take traffic: true only while its last
// probe passed. A pair not yet probed, or unknown to the tracker, is not
// allowed.
func (t *Tracker) Allowed(p Pair) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	st := t.pairs[p]
	return st != nil && st.State == StatePassing
}

// Passing is the number of pairs whose last probe passed.
func (t *Tracker) Passing() int { return t.count(StatePassing) }

func (t *Tracker) count(s State) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for _, st := range t.pairs {
		if st.State == s && st.gone.IsZero() {
			n++
		}
	}
	return n
}

// Check is a readiness check: ready once at least one pair passes.
func (t *Tracker) Check(context.Context) error {
	snap := t.Snapshot()
	var why []string
	for _, s := range snap {
		if s.State == StatePassing {
			return nil
		}
		w := s.Pair.String() + ": " + s.State.String()
		if s.LastError != "" {
			w += " (" + s.LastError + ")"
		}
		why = append(why, w)
	}
	if len(why) == 0 {
		return errors.New("no (prefill, decode) pair to probe yet")
	}
	return fmt.Errorf("no (prefill, decode) pair has passed a canary: %s", strings.Join(why, "; "))
}

// Snapshot returns every current pair's status, ordered by pair.
func (t *Tracker) Snapshot() []PairStatus {
	t.mu.Lock()
	out := make([]PairStatus, 0, len(t.pairs))
	for _, st := range t.pairs {
		if st.gone.IsZero() {
			out = append(out, st.PairStatus)
		}
	}
	t.mu.Unlock()
	slices.SortFunc(out, func(a, b PairStatus) int {
		if c := strings.Compare(a.Pair.Decode, b.Pair.Decode); c != 0 {
			return c
		}
		return strings.Compare(a.Pair.Prefill, b.Pair.Prefill)
	})
	return out
}

package canary

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/baton-serving/baton/router-svc/internal/logtest"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Probe behaviours of the scripted probe.
const (
	modePass  = "pass"
	modeFail  = "fail"
	modeHang  = "hang"  // blocks until its context ends
	modeStuck = "stuck" // blocks until released, ignoring its context
	modeBlock = "block" // blocks until released or its context ends, then passes
)

// script is a Probe whose behaviour per pair the test sets; it counts calls
// and the most probes it saw running at once.
type script struct {
	mu         sync.Mutex
	mode       map[Pair]string
	calls      map[Pair]int
	running    int
	maxRunning int
	release    chan struct{}
}

func newScript() *script {
	return &script{mode: map[Pair]string{}, calls: map[Pair]int{}, release: make(chan struct{})}
}

func (s *script) set(p Pair, mode string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.mode[p] = mode
}

func (s *script) callsOf(p Pair) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls[p]
}

func (s *script) probe(ctx context.Context, p Pair) error {
	s.mu.Lock()
	s.calls[p]++
	s.running++
	s.maxRunning = max(s.maxRunning, s.running)
	mode := s.mode[p]
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.running--
		s.mu.Unlock()
	}()
	switch mode {
	case modePass, "":
		return nil
	case modeFail:
		return errors.New("decode d: rpc error: code = Unavailable desc = prefill p: connection refused")
	case modeHang:
		<-ctx.Done()
		return fmt.Errorf("waiting for the first token: %w", ctx.Err())
	case modeStuck:
		<-s.release
		return errors.New("came back late")
	case modeBlock:
		select {
		case <-s.release:
		case <-ctx.Done():
			return ctx.Err()
		}
		return nil
	}
	return fmt.Errorf("unknown mode %q", mode)
}

// run starts tr.Run over a fixed or changing list of pairs and stops it at
// the end of the test.
type runner struct {
	pairs atomic.Pointer[[]Pair]
	stop  context.CancelFunc
	done  chan struct{}
}

func start(t *testing.T, tr *Tracker, pairs ...Pair) *runner {
	t.Helper()
	r := &runner{done: make(chan struct{})}
	r.set(pairs...)
	ctx, cancel := context.WithCancel(context.Background())
	r.stop = cancel
	go func() {
		defer close(r.done)
		tr.Run(ctx, func() []Pair { return *r.pairs.Load() })
	}()
	t.Cleanup(r.halt)
	return r
}

func (r *runner) set(pairs ...Pair) { r.pairs.Store(&pairs) }

func (r *runner) halt() {
	r.stop()
	<-r.done
}

// eventually fails the test when cond does not hold within 5 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func statusOf(tr *Tracker, p Pair) PairStatus {
	for _, s := range tr.Snapshot() {
		if s.Pair == p {
			return s
		}
	}
	return PairStatus{}
}

func newTracker(t *testing.T, o Options) (*Tracker, *logtest.Buffer, *prometheus.Registry) {
	t.Helper()
	logs := &logtest.Buffer{}
	reg := prometheus.NewRegistry()
	o.Logger, o.Registry = logs.Logger(), reg
	tr, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("logs:\n%s", logs)
		}
	})
	return tr, logs, reg
}

// TestTrackerLifecycle drives one pair through pass, fail, recover, hang and
// recover again, checking its state, Allowed, readiness, the metrics and
// that each change of state is logged exactly once.
func TestTrackerLifecycle(t *testing.T) {
	s := newScript()
	p := Pair{Prefill: "p:1", Decode: "d:1"}
	tr, logs, reg := newTracker(t, Options{Probe: s.probe, Interval: 30 * time.Millisecond,
		QuarantineInterval: 10 * time.Millisecond, Timeout: 60 * time.Millisecond})
	if tr.Allowed(p) || tr.Check(context.Background()) == nil {
		t.Fatal("a pair never probed is allowed, or the tracker is ready before any probe")
	}
	start(t, tr, p)
	eventually(t, "the first probe to pass", func() bool { return tr.Allowed(p) })
	if tr.Passing() != 1 || tr.Check(context.Background()) != nil {
		t.Fatalf("Passing %d, Check %v after a passing probe", tr.Passing(), tr.Check(context.Background()))
	}

	s.set(p, modeFail)
	eventually(t, "quarantine after a failure", func() bool { return !tr.Allowed(p) })
	st := statusOf(tr, p)
	if st.State != StateQuarantined || st.LastResult != ResultFail || !strings.Contains(st.LastError, "connection refused") {
		t.Fatalf("after a failure: %+v", st)
	}
	if err := tr.Check(context.Background()); err == nil || !strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("readiness with the only pair quarantined: %v", err)
	}
	if got := gauge(t, reg, "baton_canary_quarantined_pairs"); got != 1 {
		t.Fatalf("baton_canary_quarantined_pairs = %v, want 1", got)
	}
	// More failures keep the quarantine without logging it again.
	n := s.callsOf(p)
	eventually(t, "three more failing probes", func() bool { return s.callsOf(p) >= n+3 })
	if st := statusOf(tr, p); st.Failures < 3 || st.State != StateQuarantined {
		t.Fatalf("after repeated failures: %+v", st)
	}

	s.set(p, modePass)
	eventually(t, "the quarantine to lift", func() bool { return tr.Allowed(p) })
	if st := statusOf(tr, p); st.Failures != 0 || st.LastError != "" || st.LastResult != ResultPass {
		t.Fatalf("after recovery: %+v", st)
	}

	s.set(p, modeHang)
	began := time.Now()
	eventually(t, "quarantine after a stalled probe", func() bool { return !tr.Allowed(p) })
	if took := time.Since(began); took > 30*time.Millisecond+60*time.Millisecond+time.Second {
		t.Errorf("a stalled probe quarantined its pair after %v; the deadline is 60ms", took)
	}
	// The probe's own words (the stage it waited in) come with the verdict
	// only when it returns by the deadline; on a loaded machine the
	// tracker may judge it first.
	if st := statusOf(tr, p); st.LastResult != ResultTimeout || !strings.Contains(st.LastError, "no answer within 60ms") ||
		(!st.Probing && !strings.Contains(st.LastError, "waiting for the first token")) {
		t.Fatalf("after a stalled probe: %+v", st)
	}

	s.set(p, modePass)
	eventually(t, "the quarantine to lift again", func() bool { return tr.Allowed(p) })

	for msg, want := range map[string]int{
		"canary: pair passing": 1, "canary: pair quarantined": 2, "canary: pair quarantine lifted": 2,
	} {
		if got := logs.Count(msg); got != want {
			t.Errorf("%q logged %d times, want %d", msg, got, want)
		}
	}
	for result, atLeast := range map[string]float64{ResultPass: 3, ResultFail: 4, ResultTimeout: 1} {
		if got := testutil.ToFloat64(tr.probes.WithLabelValues(result)); got < atLeast {
			t.Errorf("baton_canary_probes_total{result=%q} = %v, want ≥ %v", result, got, atLeast)
		}
	}
	if got := testutil.CollectAndCount(tr.duration); got != 3 {
		t.Errorf("baton_canary_probe_seconds has %d series, want one per result", got)
	}
}

// gauge reads a registered gauge's value.
func gauge(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("metric %s not registered", name)
	return 0
}

// TestTrackerProbeIgnoringDeadline: a probe that ignores its context is
// judged at the deadline all the same, and its pair is not probed again
// until it returns.
func TestTrackerProbeIgnoringDeadline(t *testing.T) {
	s := newScript()
	p := Pair{Decode: "d:1"}
	s.set(p, modeStuck)
	tr, _, _ := newTracker(t, Options{Probe: s.probe, Interval: 20 * time.Millisecond,
		QuarantineInterval: 5 * time.Millisecond, Timeout: 50 * time.Millisecond})
	start(t, tr, p)
	eventually(t, "the stuck probe to be judged", func() bool { return statusOf(tr, p).State == StateQuarantined })
	if st := statusOf(tr, p); st.LastResult != ResultTimeout || !st.Probing {
		t.Fatalf("stuck probe: %+v", st)
	}
	time.Sleep(100 * time.Millisecond) // many quarantine intervals
	if n := s.callsOf(p); n != 1 {
		t.Fatalf("the pair was probed %d times while its first probe hung", n)
	}
	s.set(p, modePass)
	close(s.release)
	eventually(t, "probes to resume after the stuck one returned", func() bool { return tr.Allowed(p) })
	if n := s.callsOf(p); n < 2 {
		t.Fatalf("%d probes", n)
	}
}

// TestTrackerNewPairsAtOnce: new pairs are probed as soon as Run sees them,
// not after an interval (an hour here).
func TestTrackerNewPairsAtOnce(t *testing.T) {
	s := newScript()
	a, b := Pair{Prefill: "p:1", Decode: "d:1"}, Pair{Prefill: "p:2", Decode: "d:1"}
	tr, _, _ := newTracker(t, Options{Probe: s.probe, Interval: time.Hour, Timeout: time.Second})
	r := start(t, tr, a)
	eventually(t, "the first pair to pass", func() bool { return tr.Allowed(a) })
	if tr.Allowed(b) {
		t.Fatal("a pair never seen is allowed")
	}
	r.set(a, b)
	eventually(t, "a new pair to pass", func() bool { return tr.Allowed(b) })
	if tr.Passing() != 2 || s.callsOf(a) != 1 {
		t.Fatalf("Passing %d, pair a probed %d times", tr.Passing(), s.callsOf(a))
	}
}

// TestTrackerForgetsGonePairs: a pair the pairs function stops returning
// leaves the snapshot and the counts at once and the tracker after an
// interval; when it returns later it must pass a probe again.
func TestTrackerForgetsGonePairs(t *testing.T) {
	s := newScript()
	a, b := Pair{Decode: "d:1"}, Pair{Decode: "d:2"}
	tr, _, _ := newTracker(t, Options{Probe: s.probe, Interval: 20 * time.Millisecond, Timeout: time.Second})
	r := start(t, tr, a, b)
	eventually(t, "both pairs to pass", func() bool { return tr.Passing() == 2 })
	r.set(a)
	eventually(t, "the gone pair to leave the snapshot", func() bool { return len(tr.Snapshot()) == 1 && tr.Passing() == 1 })
	eventually(t, "the gone pair to be forgotten", func() bool { return !tr.Allowed(b) })
	s.set(b, modeBlock)
	r.set(a, b)
	eventually(t, "the returning pair to be probed", func() bool { return statusOf(tr, b).Probing })
	if st := statusOf(tr, b); st.State != StatePending || tr.Allowed(b) {
		t.Fatalf("a returning pair is %+v before its probe ends", st)
	}
	close(s.release)
	eventually(t, "the returning pair to pass", func() bool { return tr.Allowed(b) })
}

// TestTrackerConcurrencyBound: no more than Concurrency probes run at once,
// and the others get their turn.
func TestTrackerConcurrencyBound(t *testing.T) {
	s := newScript()
	var pairs []Pair
	for i := range 10 {
		p := Pair{Prefill: fmt.Sprintf("p:%d", i), Decode: "d:1"}
		s.set(p, modeBlock)
		pairs = append(pairs, p)
	}
	tr, _, _ := newTracker(t, Options{Probe: s.probe, Interval: 10 * time.Millisecond, Timeout: 5 * time.Second, Concurrency: 3})
	start(t, tr, pairs...)
	eventually(t, "three probes running", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.running == 3
	})
	time.Sleep(50 * time.Millisecond) // many scans
	if len(tr.Snapshot()) != 10 {
		t.Fatalf("%d pairs in the snapshot while slots are full, want 10", len(tr.Snapshot()))
	}
	close(s.release)
	eventually(t, "every pair to pass", func() bool { return tr.Passing() == 10 })
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.maxRunning > 3 {
		t.Fatalf("%d probes ran at once, want ≤ 3", s.maxRunning)
	}
}

// TestTrackerStopGivesNoVerdict: stopping Run ends probes in flight without
// quarantining their pairs, and Run returns promptly.
func TestTrackerStopGivesNoVerdict(t *testing.T) {
	s := newScript()
	p := Pair{Decode: "d:1"}
	tr, logs, _ := newTracker(t, Options{Probe: s.probe, Interval: 10 * time.Millisecond, Timeout: time.Minute})
	r := start(t, tr, p)
	eventually(t, "the pair to pass", func() bool { return tr.Allowed(p) })
	s.set(p, modeHang)
	eventually(t, "a hanging probe", func() bool { return statusOf(tr, p).Probing })
	began := time.Now()
	r.halt()
	if took := time.Since(began); took > 2*time.Second {
		t.Fatalf("Run took %v to stop", took)
	}
	if !tr.Allowed(p) || logs.Count("canary: pair quarantined") != 0 {
		t.Fatalf("stopping quarantined the pair: %+v", statusOf(tr, p))
	}
}

func TestNewOptions(t *testing.T) {
	probe := func(context.Context, Pair) error { return nil }
	cases := []struct {
		name string
		o    Options
		want string // error substring; "" = valid
	}{
		{"defaults", Options{Probe: probe}, ""},
		{"no probe", Options{}, "Probe is required"},
		{"negative interval", Options{Probe: probe, Interval: -time.Second}, "must be positive"},
		{"negative timeout", Options{Probe: probe, Timeout: -time.Second}, "must be positive"},
		{"negative concurrency", Options{Probe: probe, Concurrency: -1}, "Concurrency"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tr, err := New(c.o)
			if c.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				if tr.o.Interval != 15*time.Second || tr.o.QuarantineInterval != 5*time.Second || tr.o.Timeout != 5*time.Second || cap(tr.sem) != 4 || tr.scan != 250*time.Millisecond {
					t.Fatalf("defaults: %+v, scan %v", tr.o, tr.scan)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want one containing %q", err, c.want)
			}
		})
	}
	reg := prometheus.NewRegistry()
	if _, err := New(Options{Probe: probe, Registry: reg}); err != nil {
		t.Fatal(err)
	}
	if _, err := New(Options{Probe: probe, Registry: reg}); err == nil {
		t.Fatal("a second tracker on one registry registered its metrics twice without an error")
	}
}

func TestPairStatusJSON(t *testing.T) {
	b, err := json.Marshal(PairStatus{Pair: Pair{Decode: "d:1"}, State: StateQuarantined, LastResult: ResultTimeout})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"state":"quarantined"`, `"pair":{"decode":"d:1"}`, `"last_result":"timeout"`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("%s lacks %s", b, want)
		}
	}
	if strings.Contains(string(b), "last_probe") {
		t.Errorf("%s shows a probe that never ran", b)
	}
}

func TestPairString(t *testing.T) {
	for p, want := range map[Pair]string{
		{Decode: "d:1"}:                 "colocated decode=d:1",
		{Prefill: "p:1", Decode: "d:1"}: "prefill=p:1 decode=d:1",
	} {
		if got := p.String(); got != want {
			t.Errorf("%#v: %q, want %q", p, got, want)
		}
	}
	if !ReservedID(newID()) || ReservedID("req-1") {
		t.Error("ReservedID does not tell canary ids from others")
	}
}

// A probe that misses its deadline while both workers keep completing
// forward steps is a busy pair, not a stuck one: quarantining the only pair
// of an overloaded fleet would turn overload into an outage. When the
// steps stop, the same late probe quarantines.
func TestTrackerBusyIsNotStuck(t *testing.T) {
	s := newScript()
	p := Pair{Prefill: "p:1", Decode: "d:1"}
	var stepping atomic.Bool
	var steps atomic.Uint64
	progressOf := func(addr string) (Progress, bool) {
		if stepping.Load() {
			return Progress{Steps: steps.Add(1)}, true
		}
		return Progress{Steps: steps.Load()}, true
	}
	tr, _, _ := newTracker(t, Options{Probe: s.probe, Interval: 30 * time.Millisecond,
		QuarantineInterval: 10 * time.Millisecond, Timeout: 60 * time.Millisecond, Progress: progressOf})
	start(t, tr, p)
	eventually(t, "the first probe to pass", func() bool { return tr.Allowed(p) })

	stepping.Store(true)
	s.set(p, modeHang)
	eventually(t, "a late probe while the workers compute", func() bool { return statusOf(tr, p).LastResult == ResultBusy })
	if st := statusOf(tr, p); !tr.Allowed(p) || st.State != StatePassing || !strings.Contains(st.LastError, "overloaded, not stuck") {
		t.Fatalf("a busy pair lost its state: %+v", st)
	}

	stepping.Store(false)
	eventually(t, "quarantine once the steps stop", func() bool { return !tr.Allowed(p) })
	if st := statusOf(tr, p); st.LastResult != ResultTimeout {
		t.Fatalf("a stuck pair: %+v", st)
	}
	s.set(p, modePass)
	eventually(t, "the quarantine to lift", func() bool { return tr.Allowed(p) })
}

// TestTrackerBusyRule: a late probe is judged by the worker the stage it
// waits in depends on. One long step (no count moves, but the step in
// progress is within its expected time) is busy; a max_tokens-1-like probe
// waiting for its first token at a busy prefill is busy though decode runs
// no step; a probe waiting for decode's own step is a timeout while only
// prefill computes, as is a tiny step far past its expected time (a
// frozen forward loop).
func TestTrackerBusyRule(t *testing.T) {
	longStep := func(started time.Time) Progress {
		return Progress{Steps: 3, StepRunning: time.Since(started) + 2*time.Second, StepExpected: 3 * time.Second}
	}
	cases := []struct {
		name     string
		stage    Stage
		prefill  func(probes int, started time.Time) Progress // while the probe hangs
		decode   func(probes int, started time.Time) Progress
		colocate bool
		want     string
	}{
		{"one long step on prefill", StageFirstToken,
			func(_ int, s time.Time) Progress { return longStep(s) }, idle, false, ResultBusy},
		{"one long step on colocated decode", StageFirstToken,
			nil, func(_ int, s time.Time) Progress { return longStep(s) }, true, ResultBusy},
		{"first token waits at a busy prefill, decode runs no step", StageFirstToken,
			stepping, idle, false, ResultBusy},
		{"the probe names no stage, prefill busy", StageUnknown,
			stepping, idle, false, ResultBusy},
		{"decode's step awaited, only prefill computes", StageDecode,
			stepping, idle, false, ResultTimeout},
		{"decode's 1-token step frozen far past its expected time", StageDecode,
			stepping, func(_ int, s time.Time) Progress {
				return Progress{Steps: 9, StepRunning: time.Since(s) + 2*time.Second, StepExpected: 5 * time.Millisecond}
			}, false, ResultTimeout},
		// A step of one sequence after batches of many runs several times
		// its expected time without being frozen: younger than the
		// deadline, it does not make a stall.
		{"first token awaited, prefill busy, decode in a short step past 4× its expected time", StageFirstToken,
			stepping, func(n int, _ time.Time) Progress {
				return Progress{Steps: uint64(9 + n), StepRunning: 30 * time.Millisecond, StepExpected: 5 * time.Millisecond}
			}, false, ResultBusy},
		// An idle decode frozen in the step the probe's own request
		// began: the step is younger than the deadline, but no step
		// completed while the probe waited, and prefill's progress on the
		// same probe does not hide it.
		{"first token awaited, prefill busy, idle decode frozen in the probe's own step", StageFirstToken,
			stepping, func(int, time.Time) Progress {
				return Progress{Steps: 1, StepRunning: 40 * time.Millisecond, StepExpected: 5 * time.Millisecond}
			}, false, ResultTimeout},
		{"admission awaited, only prefill computes", StageAdmission,
			stepping, idle, false, ResultTimeout},
		// Decode frozen in another request's step cannot reserve or
		// activate: a busy prefill does not make the probe busy.
		{"first token awaited, prefill busy, decode frozen in a step", StageFirstToken,
			stepping, func(_ int, s time.Time) Progress {
				return Progress{Steps: 9, StepRunning: time.Since(s) + 2*time.Second, StepExpected: 5 * time.Millisecond}
			}, false, ResultTimeout},
		// The probe's deadline, enforced by decode a moment before the
		// probe's own timer: a timeout, judged by the same rule.
		{"decode answers DEADLINE_EXCEEDED first, prefill busy", stageDeadlineFromDecode,
			stepping, idle, false, ResultBusy},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := Pair{Prefill: "p:1", Decode: "d:1"}
			if c.colocate {
				p.Prefill = ""
			}
			var hanging atomic.Bool
			var calls atomic.Int64
			started := time.Now()
			progressOf := func(addr string) (Progress, bool) {
				f := c.decode
				if addr == "p:1" {
					f = c.prefill
				}
				if !hanging.Load() {
					return Progress{Steps: 1}, true
				}
				return f(int(calls.Add(1)), started), true
			}
			probe := func(ctx context.Context, _ Pair) error {
				if !hanging.Load() {
					return nil
				}
				if c.stage == stageDeadlineFromDecode {
					SetStage(ctx, StageFirstToken)
					dl, _ := ctx.Deadline()
					time.Sleep(time.Until(dl) - 5*time.Millisecond)
					return fmt.Errorf("canary x: failed during the first token: %w",
						status.Error(codes.DeadlineExceeded, "stream terminated by RST_STREAM with error code: CANCEL"))
				}
				SetStage(ctx, c.stage)
				<-ctx.Done()
				return ctx.Err()
			}
			tr, _, _ := newTracker(t, Options{Probe: probe, Interval: 20 * time.Millisecond,
				QuarantineInterval: 10 * time.Millisecond, Timeout: 60 * time.Millisecond, Progress: progressOf})
			start(t, tr, p)
			eventually(t, "the first probe to pass", func() bool { return tr.Allowed(p) })
			started = time.Now()
			hanging.Store(true)
			eventually(t, "a late probe", func() bool {
				r := statusOf(tr, p).LastResult
				return r == ResultBusy || r == ResultTimeout
			})
			st := statusOf(tr, p)
			if st.LastResult != c.want || tr.Allowed(p) != (c.want == ResultBusy) {
				t.Errorf("%s %s (%s); want %s", st.State, st.LastResult, st.LastError, c.want)
			}
		})
	}
}

// stageDeadlineFromDecode makes the test's probe fail with decode's
// DEADLINE_EXCEEDED just before its own deadline, waiting for the first
// token.
const stageDeadlineFromDecode Stage = 100

// idle is a worker that completes no step and runs none.
func idle(int, time.Time) Progress { return Progress{Steps: 1} }

// stepping is a worker whose count moves at every reading.
func stepping(n int, _ time.Time) Progress { return Progress{Steps: uint64(1 + n)} }

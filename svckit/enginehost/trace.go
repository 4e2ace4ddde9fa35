package enginehost

import (
	"context"
	"sync"
	"time"

	"github.com/baton-serving/baton/engine/sched"
	"github.com/baton-serving/baton/tracing"
)

// traceState is what a host keeps for its service's traces: the trace id of
// each traced request, for the request listings, and the recent forward
// steps, from which a prefill trace draws its forward spans.
type traceState struct {
	ids   sync.Map // request id -> trace id
	steps StepLog
}

// TraceRequest records the trace of ctx's span as request id's, shown by
// ListRequests and /debug/requests, until the returned func is called.
func (h *Host) TraceRequest(ctx context.Context, id string) (forget func()) {
	tid := tracing.TraceID(ctx)
	if tid == "" {
		return func() {}
	}
	h.trace.ids.Store(id, tid)
	return func() { h.trace.ids.CompareAndDelete(id, tid) }
}

// traceID is the trace id recorded for a request, or "".
func (h *Host) traceID(id string) string {
	if v, ok := h.trace.ids.Load(id); ok {
		return v.(string)
	}
	return ""
}

// Steps is the log of the scheduler's recent forward steps.
func (h *Host) Steps() *StepLog { return &h.trace.steps }

// stepObserver hands the scheduler's observations to the metrics, records
// each step in the step log and measures the step speed for the watchdog.
type stepObserver struct {
	*Metrics
	steps *StepLog
	speed *stepSpeed
}

// Step implements sched.Observer.
func (o stepObserver) Step(s sched.StepStats) {
	o.steps.add(s)
	o.Metrics.Step(s)
	if s.Seqs > 0 && s.Err == nil {
		o.speed.observe(s.DecodeTokens+s.PrefillTokens, s.Duration)
	}
}

// Step is one forward step of the scheduler: a batched forward pass.
type Step struct {
	Start, End time.Time
	// Seqs is the number of sequences in the batch; PrefillTokens and
	// DecodeTokens split its tokens.
	Seqs, PrefillTokens, DecodeTokens int
}

// stepLogSize bounds the step log. A prefill trace looks its steps up when
// its request ends, which is within a few hundred steps of them unless the
// worker is swamped; then its forward spans lose their batch sizes.
const stepLogSize = 512

// StepLog remembers the scheduler's last forward steps, so that a request's
// trace can show the batches it was computed in without the engine knowing
// about tracing. It is safe for concurrent use.
type StepLog struct {
	mu   sync.Mutex
	ring [stepLogSize]Step
	n    uint64 // steps recorded since start
}

func (l *StepLog) add(s sched.StepStats) {
	if s.Seqs == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ring[l.n%stepLogSize] = Step{Start: s.Start, End: s.Start.Add(s.Duration), Seqs: s.Seqs,
		PrefillTokens: s.PrefillTokens, DecodeTokens: s.DecodeTokens}
	l.n++
}

// LastPrefill returns the latest remembered step that ended no later than t
// and computed prompt tokens. The scheduler emits a step's events at its
// end, so for an event received at t this is the step that produced it,
// unless the receiver fell a whole step behind. The observer records a step
// just after emitting its events: look steps up once a later event has
// arrived (the request's last), not on the event itself.
func (l *StepLog) LastPrefill(t time.Time) (Step, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i := uint64(0); i < min(l.n, stepLogSize); i++ {
		s := l.ring[(l.n-1-i)%stepLogSize]
		if s.PrefillTokens > 0 && !s.End.After(t) {
			return s, true
		}
	}
	return Step{}, false
}

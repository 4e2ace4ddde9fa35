package enginehost

import (
	"context"
	"testing"
	"time"

	"github.com/baton-serving/baton/engine/sched"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

func TestStepLogLastPrefill(t *testing.T) {
	t0 := time.Now()
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	var l StepLog
	for _, s := range []sched.StepStats{
		{Start: at(0), Duration: 10 * time.Millisecond, Seqs: 2, PrefillTokens: 64, DecodeTokens: 1},
		{Start: at(10), Duration: 5 * time.Millisecond, Seqs: 0}, // nothing ran: not logged
		{Start: at(15), Duration: 5 * time.Millisecond, Seqs: 3, DecodeTokens: 3},
		{Start: at(20), Duration: 10 * time.Millisecond, Seqs: 1, PrefillTokens: 32},
	} {
		l.add(s)
	}
	cases := []struct {
		name      string
		t         time.Time
		wantOK    bool
		wantStart time.Time
		wantSeqs  int
	}{
		{"before any step ended", at(5), false, time.Time{}, 0},
		{"at the first step's end", at(10), true, at(0), 2},
		{"after a decode-only step: the prefill step before it", at(22), true, at(0), 2},
		{"after the last step", at(100), true, at(20), 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s, ok := l.LastPrefill(c.t)
			if ok != c.wantOK || !s.Start.Equal(c.wantStart) || s.Seqs != c.wantSeqs {
				t.Errorf("LastPrefill = %+v, %v; want start %v seqs %d, %v", s, ok, c.wantStart, c.wantSeqs, c.wantOK)
			}
		})
	}
}

func TestStepLogWraps(t *testing.T) {
	var l StepLog
	t0 := time.Now()
	for i := range stepLogSize + 10 {
		l.add(sched.StepStats{Start: t0.Add(time.Duration(i) * time.Second), Duration: time.Millisecond, Seqs: 1, PrefillTokens: i + 1})
	}
	if _, ok := l.LastPrefill(t0.Add(5 * time.Second)); ok {
		t.Error("found a step that the log has forgotten")
	}
	s, ok := l.LastPrefill(t0.Add(time.Hour))
	if !ok || s.PrefillTokens != stepLogSize+10 {
		t.Errorf("newest step = %+v, %v", s, ok)
	}
}

func TestTraceRequest(t *testing.T) {
	h := &Host{}
	forget := h.TraceRequest(context.Background(), "untraced")
	forget()
	if id := h.traceID("untraced"); id != "" {
		t.Errorf("trace id %q for a request without a span", id)
	}
	tp := sdktrace.NewTracerProvider()
	defer tp.Shutdown(context.Background())
	ctx, span := tp.Tracer("t").Start(context.Background(), "rpc")
	defer span.End()
	forget = h.TraceRequest(ctx, "r1")
	if got, want := h.traceID("r1"), span.SpanContext().TraceID().String(); got != want {
		t.Errorf("traceID = %q, want %q", got, want)
	}
	forget()
	if id := h.traceID("r1"); id != "" {
		t.Errorf("trace id %q kept after forget", id)
	}
}

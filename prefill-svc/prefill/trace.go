package prefill

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/baton-serving/baton/engine/sched"
	"github.com/baton-serving/baton/kvtransfer"
	"github.com/baton-serving/baton/svckit/enginehost"
	"github.com/baton-serving/baton/tracing"
	"go.opentelemetry.io/otel/trace"
)

// prefillTrace draws a prefill request's queue_wait and forward spans. The
// scheduler knows nothing of traces: follow notes when each of the
// request's events arrives, and once the request is over the host's step log
// (complete by then) tells which forward steps produced them, when they ran
// and how big their batches were.
type prefillTrace struct {
	ctx                      context.Context // the TransferKV span's
	steps                    *enginehost.StepLog
	submitted                time.Time
	pageTokens, promptTokens int

	mu          sync.Mutex
	marks       []progressMark
	first       bool   // the first token has arrived
	decodeAbort string // decode's reason, when it aborted the transfer
	failed      error  // the scheduler's error, when it ended the request with one
}

// failure is the scheduler's error for the request, nil if it ended
// without one (or has not ended).
func (p *prefillTrace) failure() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.failed
}

// abortedBy records decode's reason for aborting the transfer.
func (p *prefillTrace) abortedBy(reason string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.decodeAbort = reason
}

// endSend ends the kv_send span. When the transfer ended early its abort
// event names the stage the prompt was in and why: decode's own reason when
// decode aborted (the stream's end follows it and would hide it).
func (p *prefillTrace) endSend(ctx context.Context, span trace.Span, err error) {
	stage := p.stage()
	p.mu.Lock()
	reason := p.decodeAbort
	p.mu.Unlock()
	if err == nil || reason == "" || !errors.Is(err, kvtransfer.ErrAborted) {
		tracing.EndAborted(ctx, span, stage, err)
		return
	}
	tracing.RecordError(span, err)
	tracing.Abort(span, stage, "decode aborted: "+reason)
	span.End()
}

// progressMark is the arrival of an event that says the prompt advanced.
type progressMark struct {
	at     time.Time
	tokens int  // prompt tokens computed by then
	first  bool // the event was the first token
}

// note records a scheduler event; on the last one it draws the spans.
func (p *prefillTrace) note(ev sched.Event) {
	now := time.Now()
	p.mu.Lock()
	switch ev.Kind {
	case sched.EventPagesReady:
		p.marks = append(p.marks, progressMark{at: now, tokens: min(ev.Ready*p.pageTokens, p.promptTokens)})
	case sched.EventToken:
		p.marks = append(p.marks, progressMark{at: now, tokens: p.promptTokens, first: true})
		p.first = true
	case sched.EventDone:
		if ev.Err != nil && ev.Finish != sched.FinishHandedOver {
			p.failed = ev.Err
		}
	}
	marks := p.marks
	p.mu.Unlock()
	if ev.Kind == sched.EventDone {
		p.draw(marks, now)
	}
}

// stage names the span of the stage the request is in: queue_wait until its
// first forward step, forward until its first token, then kv_send.
func (p *prefillTrace) stage() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.first:
		return tracing.SpanKVSend
	case len(p.marks) > 0:
		return tracing.SpanForward
	}
	return tracing.SpanQueueWait
}

// draw makes the queue_wait span and one forward span per step that
// advanced the prompt. A step no longer in the log (a swamped worker) gets a
// span from the previous event to its own, without batch sizes.
func (p *prefillTrace) draw(marks []progressMark, end time.Time) {
	queueEnd := end
	type fwd struct {
		start, end time.Time
		step       enginehost.Step
		logged     bool
		tokens     int
		first      bool
	}
	var fwds []fwd
	prevAt, prevTokens := p.submitted, 0
	for _, m := range marks {
		f := fwd{start: prevAt, end: m.at, tokens: max(m.tokens-prevTokens, 0), first: m.first}
		if step, ok := p.steps.LastPrefill(m.at); ok && !step.Start.Before(p.submitted) {
			f.start, f.end, f.step, f.logged = step.Start, step.End, step, true
		}
		if n := len(fwds); n > 0 && fwds[n-1].end.Equal(f.end) { // the same step
			fwds[n-1].tokens += f.tokens
			fwds[n-1].first = fwds[n-1].first || f.first
		} else {
			fwds = append(fwds, f)
		}
		prevAt, prevTokens = m.at, m.tokens
	}
	if len(fwds) > 0 {
		queueEnd = fwds[0].start
	}
	_, q := tracing.Start(p.ctx, tracing.SpanQueueWait, trace.WithTimestamp(p.submitted),
		trace.WithAttributes(tracing.AttrPromptTokens.Int(p.promptTokens)))
	q.End(trace.WithTimestamp(queueEnd))
	for _, f := range fwds {
		_, span := tracing.Start(p.ctx, tracing.SpanForward, trace.WithTimestamp(f.start),
			trace.WithAttributes(tracing.AttrTokens.Int(f.tokens)))
		if f.logged {
			span.SetAttributes(tracing.AttrBatchSeqs.Int(f.step.Seqs), tracing.AttrBatchTokens.Int(f.step.PrefillTokens+f.step.DecodeTokens))
		}
		if f.first {
			span.AddEvent(tracing.EventFirstToken, trace.WithTimestamp(f.end))
		}
		span.End(trace.WithTimestamp(f.end))
	}
}

// cachedTokens records on the TransferKV span how many prompt tokens the
// prefix cache supplied.
func (p *prefillTrace) cachedTokens(n int) {
	trace.SpanFromContext(p.ctx).SetAttributes(tracing.AttrPromptCachedTokens.Int(n))
}

package prefill

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/baton-serving/baton/engine/kvcache"
	"github.com/baton-serving/baton/engine/sched"
	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"github.com/baton-serving/baton/kvtransfer"
	"github.com/baton-serving/baton/svckit"
	"github.com/baton-serving/baton/svckit/apiconv"
	"github.com/baton-serving/baton/svckit/canarylabel"
	"github.com/baton-serving/baton/svckit/enginehost"
	"github.com/baton-serving/baton/tracing"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TransferKV serves one request from a decode worker: handshake, prefill in
// the batch, chunks as pages complete, PrefillDone; or AbortAck / Error. The
// request's pages are released when the handover ends, however it ends.
func (s *Service) TransferKV(stream batonv1.PrefillService_TransferKVServer) error {
	ctx, cancel := context.WithCancelCause(stream.Context())
	defer cancel(nil)

	// One goroutine receives for the whole stream, so every wait here can
	// have its own deadline; it ends when the stream does.
	msgs := make(chan *batonv1.TransferKVRequest, 4)
	go func() {
		defer close(msgs)
		for {
			m, err := stream.Recv()
			if err != nil {
				cancel(fmt.Errorf("decode closed the stream: %w", err))
				return
			}
			select {
			case msgs <- m:
			case <-ctx.Done():
				return
			}
		}
	}()

	var hs *batonv1.Handshake
	select {
	case m, ok := <-msgs:
		if !ok {
			return status.FromContextError(ctx.Err()).Err()
		}
		if hs = m.GetHandshake(); hs == nil {
			return status.Error(codes.InvalidArgument, "the first TransferKV message must be a handshake")
		}
	case <-time.After(s.handshakeTimeout):
		return status.Errorf(codes.DeadlineExceeded, "no handshake within %v", s.handshakeTimeout)
	case <-ctx.Done():
		return status.FromContextError(ctx.Err()).Err()
	}
	req, err := s.checkHandshake(hs)
	if err != nil {
		return err
	}
	if dl := hs.GetDeadline(); dl != nil {
		var c context.CancelFunc
		ctx, c = context.WithDeadline(ctx, dl.AsTime())
		defer c()
	}
	log := s.logger.With("request_id", req.ID)
	if _, canary := canarylabel.Label(ctx, req.ID); canary {
		log = log.With("canary", true)
	}
	trace.SpanFromContext(ctx).SetAttributes(tracing.AttrRequestID.String(req.ID), tracing.AttrPromptTokens.Int(len(req.Prompt)))
	defer s.host.TraceRequest(ctx, req.ID)()

	// The scheduler request's context ends only after the sender has
	// stopped reading its pages, so pages are never freed under a send.
	schedCtx, schedCancel := context.WithCancel(context.WithoutCancel(ctx))
	defer schedCancel()
	submitted := time.Now()
	st, err := s.host.Sched.Submit(schedCtx, req)
	if err != nil {
		return submitErr(err)
	}
	start := time.Now()
	pt := &prefillTrace{ctx: ctx, steps: s.host.Steps(), submitted: submitted,
		pageTokens: s.host.Layout.PageTokens, promptTokens: len(req.Prompt)}
	if err := stream.Send(&batonv1.TransferKVResponse{Msg: &batonv1.TransferKVResponse_Accepted{Accepted: &batonv1.Accepted{}}}); err != nil {
		return err
	}
	src := &pageSource{pool: s.host.Pool}
	snd := kvtransfer.NewSender(kvtransfer.SenderConfig{
		Layout: s.host.Layout, PromptTokens: len(req.Prompt), InitialCredits: int(hs.GetInitialCredits()),
		CreditTimeout: s.idleTimeout, Codec: s.codec,
		// Decode's idle deadline must not fire while this request waits
		// in the queue or its prompt computes: heartbeats as often as
		// decode asks, else every quarter of our own idle deadline.
		Heartbeat: heartbeat(hs, s.idleTimeout),
	}, src, stream)

	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // decode's credits and aborts
		defer wg.Done()
		for m := range msgs {
			switch {
			case m.GetCredit() != nil:
				snd.AddCredits(int(m.GetCredit().GetChunks()))
			case m.GetAbort() != nil:
				log.InfoContext(ctx, "transfer aborted by decode", "reason", m.GetAbort().GetReason())
				pt.abortedBy(m.GetAbort().GetReason())
				snd.Abort(m.GetAbort().GetReason())
			}
		}
	}()
	promptDone := make(chan struct{})
	wg.Add(1)
	go func() { // the scheduler's events
		defer wg.Done()
		s.follow(st, len(req.Prompt), src, snd, start, promptDone, pt)
	}()

	// Pages go as they complete, so kv_send may overlap forward.
	_, sendSpan := tracing.Start(ctx, tracing.SpanKVSend)
	runErr := snd.Run(ctx)
	sentChunks, sentBytes := snd.Stats()
	sendSpan.SetAttributes(tracing.AttrKVChunks.Int64(int64(sentChunks)), tracing.AttrKVBytes.Int64(int64(sentBytes)))
	pt.endSend(ctx, sendSpan, runErr) // before cancel(nil) hides why ctx ended
	// The sender no longer touches the pages: release them.
	select {
	case <-promptDone:
		_ = st.Handover()
	default:
		schedCancel()
	}
	cancel(nil)
	go wg.Wait() // both goroutines end with the stream and the request
	chunks, bytes := snd.Stats()
	s.host.Metrics.KVTransferBytes.Add(float64(bytes))
	switch {
	case runErr == nil:
		s.host.Metrics.TransferDone(req.ID, time.Since(start))
		log.DebugContext(ctx, "transfer done", "chunks", chunks, "bytes", bytes, "took", time.Since(start).String())
		return nil
	case errors.Is(runErr, kvtransfer.ErrAborted):
		return nil
	case errors.Is(runErr, kvtransfer.ErrStalled):
		log.WarnContext(ctx, "transfer stalled; releasing", "err", runErr, "chunks", chunks)
		return status.Errorf(codes.DeadlineExceeded, "%v", runErr)
	default:
		log.InfoContext(ctx, "transfer ended early", "err", runErr, "cause", context.Cause(ctx), "chunks", chunks)
		if c := context.Cause(ctx); c != nil && ctx.Err() != nil {
			return status.FromContextError(ctx.Err()).Err()
		}
		return svckit.Status(runErr)
	}
}

// follow feeds the scheduler's events to the sender until the request ends.
func (s *Service) follow(st *sched.Stream, promptTokens int, src *pageSource, snd *kvtransfer.Sender, start time.Time, promptDone chan<- struct{}, pt *prefillTrace) {
	var first *batonv1.TokenLogprob
	done := false
	for ev := range st.Events() {
		pt.note(ev)
		switch ev.Kind {
		case sched.EventPagesReady:
			src.setPages(ev.Pages)
			snd.PagesReady(ev.Ready)
		case sched.EventToken:
			first = &batonv1.TokenLogprob{TokenId: uint32(ev.Token.ID), Logprob: ev.Token.Logprob}
			for _, alt := range ev.Token.Top {
				first.TopLogprobs = append(first.TopLogprobs, &batonv1.TopLogprob{TokenId: uint32(alt.ID), Logprob: alt.Logprob})
			}
		case sched.EventDone:
			if ev.Finish != sched.FinishHandedOver && !done {
				snd.Fail(int32(svckit.Code(ev.Err)), fmt.Sprintf("prefill failed: %v", ev.Err))
			}
		}
		if !done && first != nil && src.ready() {
			done = true
			close(promptDone)
			snd.Finish(&batonv1.PrefillDone{
				FirstTokenId: first.GetTokenId(), FirstTokenLogprob: first,
				PromptTokens: uint32(promptTokens), PrefillSeconds: time.Since(start).Seconds(),
			})
		}
	}
}

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

// checkHandshake validates the handshake against this worker and returns the
// scheduler request. Mismatched model or layout is FAILED_PRECONDITION naming
// the difference.
func (s *Service) checkHandshake(hs *batonv1.Handshake) (sched.Request, error) {
	h := s.host
	if fp := hs.GetModelFingerprint(); fp != h.Fingerprint {
		return sched.Request{}, status.Errorf(codes.FailedPrecondition,
			"model_fingerprint: this prefill worker serves %s (%s), decode sent %q", h.ModelInfo.GetId(), h.Fingerprint, fp)
	}
	peer, err := kvtransfer.LayoutFromProto(hs.GetKvLayout())
	if err != nil {
		return sched.Request{}, status.Errorf(codes.FailedPrecondition, "%v", err)
	}
	if msg := h.Layout.Mismatch(peer); msg != "" {
		return sched.Request{}, status.Error(codes.FailedPrecondition, msg)
	}
	if err := apiconv.ValidRequestID(hs.GetRequestId()); err != nil {
		return sched.Request{}, status.Errorf(codes.InvalidArgument, "%v", err)
	}
	n := len(hs.GetPromptTokenIds())
	if n == 0 || n >= h.Config.ContextLength {
		return sched.Request{}, status.Errorf(codes.InvalidArgument, "prompt_token_ids: %d tokens, want 1-%d", n, h.Config.ContextLength-1)
	}
	prompt, err := apiconv.TokenIDs("prompt_token_ids", hs.GetPromptTokenIds(), h.Config.Vocab)
	if err != nil {
		return sched.Request{}, status.Errorf(codes.InvalidArgument, "%v", err)
	}
	if pages := h.Layout.PagesFor(n); int(hs.GetPagesReserved()) < pages {
		return sched.Request{}, status.Errorf(codes.InvalidArgument, "pages_reserved: %d, a prompt of %d tokens needs %d", hs.GetPagesReserved(), n, pages)
	}
	params, err := apiconv.Sampling(hs.GetSampling())
	if err != nil {
		return sched.Request{}, status.Errorf(codes.InvalidArgument, "%v", err)
	}
	stopIDs, err := apiconv.StopTokenIDs(hs.GetSampling(), h.Config.Vocab)
	if err != nil {
		return sched.Request{}, status.Errorf(codes.InvalidArgument, "%v", err)
	}
	return sched.Request{ID: hs.GetRequestId(), Mode: sched.ModePrefillOnly, Prompt: prompt, Params: params,
		Stop: hs.GetSampling().GetStop(), StopIDs: stopIDs}, nil
}

// submitErr maps the scheduler's refusals to status codes.
func submitErr(err error) error {
	switch {
	case errors.Is(err, sched.ErrDuplicateID):
		return status.Errorf(codes.AlreadyExists, "%v", err)
	case errors.Is(err, sched.ErrQueueFull), errors.Is(err, sched.ErrClosed):
		return status.Errorf(codes.ResourceExhausted, "%v", err)
	}
	return svckit.Status(err)
}

// pageSource reads a request's pages for the sender. The scheduler sets the
// block table once the pages are allocated; the sender reads only pages the
// scheduler has announced complete.
type pageSource struct {
	pool  *kvcache.Pool
	mu    sync.Mutex
	pages []kvcache.PageID
}

func (p *pageSource) setPages(pages []kvcache.PageID) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.pages = pages
}

// ready reports whether the block table is known (the prompt's pages exist).
func (p *pageSource) ready() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.pages != nil
}

// CopyPage implements kvtransfer.PageSource.
func (p *pageSource) CopyPage(page, lo, hi, tokens int, k, v []byte) error {
	p.mu.Lock()
	if page >= len(p.pages) {
		p.mu.Unlock()
		return fmt.Errorf("page %d of %d", page, len(p.pages))
	}
	id := p.pages[page]
	p.mu.Unlock()
	row := p.pool.Layout().RowBytes()
	n := tokens * row
	for l := lo; l < hi; l++ {
		pk, pv := p.pool.PageBytes(id, l)
		off := (l - lo) * n
		copy(k[off:off+n], pk[:n])
		copy(v[off:off+n], pv[:n])
	}
	return nil
}

// heartbeat is the Progress interval for a transfer: decode's request, or a
// quarter of prefill's own idle deadline when decode names none.
func heartbeat(hs *batonv1.Handshake, idle time.Duration) time.Duration {
	if ms := hs.GetHeartbeatMs(); ms > 0 {
		return time.Duration(ms) * time.Millisecond
	}
	return idle / 4
}

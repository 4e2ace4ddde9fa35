package router

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"time"

	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"github.com/baton-serving/baton/router-svc/internal/openai"
	"github.com/baton-serving/baton/router-svc/internal/workers"
	"github.com/baton-serving/baton/svckit"
	"github.com/baton-serving/baton/svckit/canarylabel"
	"github.com/baton-serving/baton/tracing"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// localPrefill is the prefill endpoint that asks decode to compute the
// prompt itself (colocated mode).
const localPrefill = workers.LocalPrefill

// releaseGrace bounds how long a retry waits for the decode worker of the
// failed attempt to release the request's id (workers release within 2 s).
const releaseGrace = 2 * time.Second

// errAborted is the cancel cause of a request ended by the Abort RPC.
var errAborted = errors.New("aborted by an Abort call")

// Generate streams a completion.
// Events reach the client through a streamSender, so that a client that
// stops reading cannot hold the request (and its workers) beyond
// --client-write-timeout.
func (s *Service) Generate(in *batonv1.GenerateRequest, stream batonv1.RouterService_GenerateServer) error {
	ctx := stream.Context()
	if t := s.limits.requestTimeout; t > 0 {
		// run sets the same deadline; the sender must see it too.
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, t)
		defer cancel()
	}
	out := newStreamSender(stream, s.limits.clientWriteTimeout)
	ctx = out.bind(ctx) // the request's end (an Abort) frees a send blocked on the client
	err := s.run(ctx, in, func(ev *batonv1.GenerateEvent) error { return out.send(ctx, ev) })
	return out.finish(ctx, err)
}

// Complete returns a whole completion: with sampling.n > 1, every choice in
// choices (by index) and choice 0 in the top-level fields.
func (s *Service) Complete(ctx context.Context, in *batonv1.CompleteRequest) (*batonv1.CompleteResponse, error) {
	out := &batonv1.CompleteResponse{}
	n := max(int(in.GetRequest().GetSampling().GetN()), 1)
	// prepare refuses an n beyond --max-n before the first event; until
	// then no choice is made.
	var choices []*batonv1.CompleteChoice
	var text []strings.Builder
	err := s.run(ctx, in.GetRequest(), func(ev *batonv1.GenerateEvent) error {
		if choices == nil {
			choices, text = make([]*batonv1.CompleteChoice, n), make([]strings.Builder, n)
			for k := range choices {
				choices[k] = &batonv1.CompleteChoice{Index: uint32(k)}
			}
		}
		if out.RequestId == "" {
			out.RequestId = ev.GetRequestId()
		}
		if len(ev.GetPromptTokenIds()) > 0 {
			out.PromptTokenIds = ev.GetPromptTokenIds()
		}
		k := int(ev.GetIndex())
		if k >= n {
			return &workerFault{status.Errorf(codes.Internal, "an event of choice %d of a request for %d", k, n)}
		}
		c := choices[k]
		c.TokenIds = append(c.TokenIds, ev.GetTokenIds()...)
		text[k].WriteString(ev.GetText())
		c.Logprobs = append(c.Logprobs, ev.GetLogprobs()...)
		if ev.GetFinishReason() != batonv1.FinishReason_FINISH_REASON_UNSPECIFIED {
			c.FinishReason, c.StopReason = ev.GetFinishReason(), ev.GetStopReason()
		}
		if ev.GetUsage() != nil {
			out.Usage, out.Timing = ev.GetUsage(), ev.GetTiming()
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	for k, c := range choices {
		c.Text = text[k].String()
	}
	if len(choices) > 0 {
		c := choices[0]
		out.TokenIds, out.Text, out.Logprobs, out.FinishReason, out.StopReason = c.TokenIds, c.Text, c.Logprobs, c.FinishReason, c.StopReason
	}
	if n > 1 {
		out.Choices = choices
	}
	return out, nil
}

// run validates, registers and routes one request, passing its events to
// send. The request's resources at the router (its in-flight entry and its
// workers' counts) are released when run returns, whatever happens.
func (s *Service) run(ctx context.Context, in *batonv1.GenerateRequest, send func(*batonv1.GenerateEvent) error) (err error) {
	start := time.Now()
	probe := s.selfProbe.lookup(ctx, in) // nil unless this is the router's own self-probe (selfprobe.go)
	probe.setStage(stageAdmission)
	defer func() { probe.end(err) }()
	defer func() {
		if probe == nil { // a self-probe is no user traffic
			s.metrics.observeEnd(err, time.Since(start))
		}
	}()
	if s.Draining() {
		return status.Error(codes.Unavailable, "router is shutting down")
	}
	release, err := s.admit(ctx) // --max-concurrent-requests and --max-inflight-per-client (clientcap.go)
	if err != nil {
		return err
	}
	defer func() { release(); s.path.done() }()
	if t := s.limits.requestTimeout; t > 0 {
		var stop context.CancelFunc
		ctx, stop = context.WithTimeout(ctx, t)
		defer stop()
	}
	if err := s.wedge.hold(ctx, stageAdmission); err != nil { // the --debug-hooks wedge (wedge.go)
		return err
	}
	probe.setStage(stagePrepare)
	// The OpenAI API renders and tokenizes its prompt only now, admitted
	// (openai/admit.go), as prepare tokenizes a native prompt.
	if err := openai.Admitted(ctx); err != nil {
		return err
	}
	req, err := s.prepareRun(in, probe)
	if err != nil {
		return err
	}
	send = s.withTokenText(req, send) // token text beside token_id (tokentext.go)
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	r := &request{id: req.GetRequestId(), start: start, cancel: cancel, promptTokens: len(req.GetPromptTokenIds())}
	if p, ok := peer.FromContext(ctx); ok {
		r.peer = p.Addr.String()
	}
	r.owner, r.keyed = openai.CallerKey(ctx)
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		r.traceID = sc.TraceID().String()
	}
	r.setState(batonv1.RequestState_REQUEST_STATE_ROUTING)
	remove, err := s.inflight.add(r)
	if err != nil {
		return err
	}
	defer remove()
	log := s.logger.With("request_id", r.id)
	defer func() { s.logEnd(ctx, log, r, err) }()
	if s.Draining() { // the drain (drain.go) may have listed the in-flight requests before this one
		cancel(errDrainRefused)
		return svckit.Status(errDrainRefused)
	}
	probe.attach(r)
	ctx, _ = canarylabel.Label(ctx, r.id) // only a self-probe has a canary id
	if err := s.wedge.hold(ctx, stageRouting); err != nil {
		return err
	}
	trace.SpanFromContext(ctx).SetAttributes(tracing.AttrRequestID.String(r.id))

	var tried []string
	var failed error // the first attempt's error, when retrying
	// Prompt logprobs need every prompt position computed: such a request
	// reuses nothing, wherever it goes.
	query := &workers.Query{Tokens: promptIDs(req.GetPromptTokenIds()), NoReuse: req.GetSampling().GetPromptLogprobs()}
	for attempt := 0; ; attempt++ {
		actx, route := tracing.Start(ctx, tracing.SpanRoute, trace.WithAttributes(
			tracing.AttrAttempt.Int(attempt), tracing.AttrRetry.Bool(attempt > 0),
			tracing.AttrPolicy.String(s.prefillPolicyName+"/"+s.decPolicy)))
		pair, err := s.pairer.Pick(query, tried)
		if err != nil {
			err = pickStatus(err)
			if failed != nil {
				// The failure that made this a retry says more.
				err = status.Errorf(codes.Unavailable, "%s (no other pair to retry on: %s)",
					status.Convert(failed).Message(), status.Convert(err).Message())
			}
			tracing.EndAborted(ctx, route, tracing.SpanRoute, err)
			return err
		}
		pf, dc := pair.PrefillAddr(), pair.Decode.Addr
		route.SetAttributes(tracing.AttrPrefill.String(pf), tracing.AttrDecode.String(dc))
		s.countPrefix(route, query, pair)
		r.setRoute(pf, dc, attempt)
		log.InfoContext(actx, "routed", "prefill", pf, "decode", dc, "attempt", attempt)
		started, err := s.relay(actx, r, req, pair, start, send)
		// A retry on the decode worker of the failed attempt can reach it
		// before it has let go of that attempt (the router ends its side
		// of a stream at once; the worker's release follows): the id is
		// still taken there for a moment.
		for wait := time.Now(); attempt > 0 && !started && status.Code(err) == codes.AlreadyExists &&
			slices.Contains(tried, dc) && time.Since(wait) < releaseGrace; {
			select {
			case <-ctx.Done():
			case <-time.After(20 * time.Millisecond):
				log.InfoContext(actx, "decode still holds the failed attempt; trying again", "decode", dc)
				started, err = s.relay(actx, r, req, pair, start, send)
				continue
			}
			break
		}
		if err == nil {
			// The workers offer the prompt's pages to their caches as the
			// request ends: the keys count from now until their reports
			// carry them (a generation may outlast the first note).
			pair.Decode.NoteRouted(query)
			if pair.Prefill != nil {
				pair.Prefill.NoteRouted(query)
			}
		}
		pair.Release()
		retry := retryable(started, attempt, err) && !tooLateToRetry(ctx, start, err)
		endRoute(ctx, route, err, retry)
		if err == nil {
			return nil
		}
		if cause := context.Cause(ctx); errors.Is(cause, errAborted) {
			return status.Errorf(codes.Aborted, "request %s: %v", r.id, cause)
		} else if errors.Is(cause, svckit.ErrDraining) {
			return drainStatus(cause, r) // UNAVAILABLE, retryable
		}
		if ctx.Err() != nil {
			return status.FromContextError(ctx.Err()).Err()
		}
		if dl, ok := ctx.Deadline(); ok && !time.Now().Before(dl) {
			return status.FromContextError(context.DeadlineExceeded).Err() // the client's own deadline
		}
		log.WarnContext(actx, "worker pair failed", "prefill", pf, "decode", dc, "err", err, "retry", retry)
		if !retry {
			return err
		}
		tried, failed = append(tried, dc, pf), err
	}
}

// promptIDs converts the prompt's wire ids (checked by prepare) for the
// page keys of the cache index.
func promptIDs(ids []uint32) []int32 {
	out := make([]int32, len(ids))
	for i, id := range ids {
		out[i] = int32(id)
	}
	return out
}

// countPrefix records how much of the prompt the pair's workers held by the
// router's cache index (metrics by role, and span attributes), and notes
// the prompt in their indexes until their reports confirm it.
func (s *Service) countPrefix(span trace.Span, q *workers.Query, pair *workers.Pair) {
	p := pair.Decode.CachedPrefix(q)
	pair.Decode.NoteRouted(q)
	s.metrics.routed("decode", p)
	span.SetAttributes(tracing.AttrRoutePrefixPages.Int(p.Total), tracing.AttrRouteDecodeHeld.Int(p.Held))
	if pair.Prefill != nil {
		p := pair.Prefill.CachedPrefix(q)
		pair.Prefill.NoteRouted(q)
		s.metrics.routed("prefill", p)
		span.SetAttributes(tracing.AttrRoutePrefillHeld.Int(p.Held))
	}
}

// retryable says whether a failed attempt is tried again on another pair:
// only the first, only before anything reached the client, and only when a
// worker was unavailable (down, lost, draining, NOT_SERVING, or its peer
// was) or a worker's own deadline expired (a half-open peer answers
// nothing: DEADLINE_EXCEEDED). The client's own deadline never gets here:
// run returns when the request's context has ended.
func retryable(started bool, attempt int, err error) bool {
	if started || attempt != 0 {
		return false
	}
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded:
		return true
	}
	return false
}

// Retry margin: a worker's DEADLINE_EXCEEDED with less than
// max(minRetryMargin, retryMarginShare of the request's time) left is not
// retried: the second pair would only time out too.
const (
	minRetryMargin   = time.Second
	retryMarginShare = 10 // percent
)

// tooLateToRetry reports whether err, a worker's DEADLINE_EXCEEDED, came
// too close to the request's own deadline for a retry to finish: a worker
// timer firing a moment before the client's, or a silent peer that used
// up most of the time.
func tooLateToRetry(ctx context.Context, start time.Time, err error) bool {
	dl, ok := ctx.Deadline()
	if !ok || status.Code(err) != codes.DeadlineExceeded {
		return false
	}
	margin := max(minRetryMargin, dl.Sub(start)*retryMarginShare/100)
	return time.Until(dl) < margin
}

// pickStatus is the status of a request for which no pair could be picked:
// RESOURCE_EXHAUSTED (HTTP 429) when the workers are only full, UNAVAILABLE
// (503) when none can serve.
func pickStatus(err error) error {
	var pe *workers.PickError
	if errors.As(err, &pe) && pe.Full {
		return status.Errorf(codes.ResourceExhausted, "%v (--max-inflight-per-worker); retry shortly", err)
	}
	return status.Error(codes.Unavailable, err.Error())
}

// endRoute ends an attempt's route span. A failed attempt that is retried on
// another pair (retry: run's test) is an error; one that ends the request
// (cancelled, aborted, failed for good) is an abort in stage stream, where
// relay runs.
func endRoute(ctx context.Context, span trace.Span, err error, retry bool) {
	if err != nil && ctx.Err() == nil && retry {
		tracing.RecordError(span, err)
		span.End()
		return
	}
	tracing.EndAborted(ctx, span, tracing.SpanStream, err)
}

// logEnd logs the end of a request that failed after it was registered,
// naming who ended it (endedBy), so that a drained, timed-out or
// worker-cut stream is never mistaken for one its client left.
func (s *Service) logEnd(ctx context.Context, log *slog.Logger, r *request, err error) {
	if err == nil {
		return
	}
	by := endedBy(ctx, r)
	level := slog.LevelWarn // the router's own end of it, or a worker's
	if by == "client" || by == "abort" || by == "router" {
		level = slog.LevelInfo // the client's doing, or a refusal (no pair)
	}
	st := status.Convert(err)
	log.Log(ctx, level, "request ended early", "ended_by", by, "code", st.Code().String(), "err", st.Message(),
		"generated_tokens", r.generated.Load())
}

// endedBy names who ended a failed request: "drain" (the router's
// shutdown), "abort" (an Abort call), "client" (it left, or could not take
// its events), "deadline" (--request-timeout or the client's deadline),
// "worker ADDR" (a worker failed or was lost), or "router" (no pair could
// take it).
func endedBy(ctx context.Context, r *request) string {
	cause := context.Cause(ctx)
	switch {
	case errors.Is(cause, svckit.ErrDraining):
		return "drain"
	case errors.Is(cause, errAborted):
		return "abort"
	case r.sendFailed.Load():
		return "client"
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		return "deadline"
	case ctx.Err() != nil:
		return "client"
	}
	if dl, ok := ctx.Deadline(); ok && !time.Now().Before(dl) {
		return "deadline"
	}
	if w := r.endedBy.Load(); w != nil {
		return "worker " + *w
	}
	return "router"
}

package decode

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/baton-serving/baton/engine/sched"
	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"github.com/baton-serving/baton/svckit"
	"github.com/baton-serving/baton/svckit/apiconv"
	"github.com/baton-serving/baton/svckit/canarylabel"
	"github.com/baton-serving/baton/svckit/enginehost"
	"github.com/baton-serving/baton/tracing"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/status"
)

const localPrefill = "local"

// Generate runs one request: reserve pages, pull the KV cache, decode.
func (s *Service) Generate(in *batonv1.DecodeServiceGenerateRequest, stream batonv1.DecodeService_GenerateServer) (err error) {
	// The gRPC boundary: what no sentinel gives a code (a bug) is INTERNAL.
	defer func() { err = svckit.Status(err) }()
	ctx := stream.Context()
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, s.requestTimeout)
		defer cancel()
	}
	req, err := s.checkRequest(in)
	if err != nil {
		return err
	}
	log := s.Logger.With("request_id", req.ID, "prefill", in.GetPrefillEndpoint())
	ctx, canary := canarylabel.Label(ctx, req.ID)
	if canary {
		log = log.With("canary", true)
	}
	start := time.Now()
	trace.SpanFromContext(ctx).SetAttributes(tracing.AttrRequestID.String(req.ID))
	defer s.Host.TraceRequest(ctx, req.ID)()

	// Cancelled only once no transfer writes the request's pages.
	schedCtx, schedCancel := enginehost.Detach(ctx)
	defer schedCancel(nil)
	st, err := s.Host.Sched.Submit(schedCtx, req)
	if err != nil {
		return submitErr(err)
	}
	timing := &batonv1.Timing{}
	if err := stream.Send(&batonv1.DecodeServiceGenerateResponse{Event: &batonv1.GenerateEvent{
		RequestId: req.ID, PromptTokenIds: apiconv.WireIDs(req.Prompt)}}); err != nil {
		schedCancel(err)
		return err
	}
	// Until the first token, one more deadline covers the prealloc wait,
	// the transfer and the prompt's computation.
	errNoFirst := fmt.Errorf("no first token within --first-token-timeout %v", s.firstTokenTimeout)
	ftCtx, ftCancel := context.WithTimeoutCause(ctx, s.firstTokenTimeout, errNoFirst)
	defer ftCancel()
	// The prompt's log-probabilities (SamplingParams.prompt_logprobs) go
	// on the first event after the prompt computed: the first token's, or
	// the last event when the request ends without a token. PD, prefill
	// computed them; colocated, the scheduler's first token carries them.
	var promptLogprobs []*batonv1.TokenLogprob
	// cached_tokens: PD, the prompt tokens prefill reused (what saved
	// compute; decode's own pages all arrive by transfer); colocated, the
	// scheduler's count.
	pdCached := -1
	if req.Mode == sched.ModeDecodeImported {
		lps, cached, err := s.pull(ftCtx, log, in, st, timing, start)
		if err != nil {
			if context.Cause(ftCtx) == errNoFirst {
				err = svckit.Errorf(context.DeadlineExceeded, "%w", errNoFirst)
			}
			schedCancel(err)
			// The router may retry this request on this worker at once
			// (a failure before the first token is retryable): its id
			// must be free again by then, so wait for the release.
			awaitRelease(st, releaseWait)
			return err
		}
		promptLogprobs, pdCached = lps, cached
	}
	// Relay tokens until the request ends; a client that goes away (or the
	// first-token deadline) cancels the scheduler request — nothing else
	// writes its pages now.
	stop := context.AfterFunc(ftCtx, func() { schedCancel(context.Cause(ftCtx)) })
	defer func() { stop() }()
	dctx, dspan := tracing.Start(ctx, tracing.SpanDecode, trace.WithAttributes(
		tracing.AttrMode.String(modeName(req.Mode)), tracing.AttrPromptTokens.Int(len(req.Prompt))))
	tokens := 0
	first := true
	decodeStart := time.Now()
	// n > 1: the choices' events interleave on st, each ending with its
	// own EventDone; the request ends with the last, which carries the
	// whole request's usage (the prompt once, every choice's tokens).
	choices := max(req.N, 1)
	ended, completion, cached0 := 0, 0, 0
	defer func() {
		dspan.SetAttributes(tracing.AttrTokens.Int(tokens))
		why := ctx // the first-token deadline no longer applies after the first token
		if first {
			why = ftCtx
		}
		tracing.EndAborted(why, dspan, tracing.SpanDecode, err)
	}()
	for {
		// A forward step that hangs sends nothing: the request's own
		// deadline and cancellation (and until the first token the
		// first-token deadline) end the RPC anyway. The cancel above has
		// reached the scheduler, which releases the request, its pages
		// included, once the step returns; until then it stays in the
		// load report and /debug/requests.
		wait := ctx
		if first {
			wait = ftCtx
		}
		var ev sched.Event
		select {
		case e, ok := <-st.Events():
			if !ok {
				return errors.New("the scheduler closed the request's events without a final event")
			}
			ev = e
		case <-wait.Done():
			if first {
				// Retryable: free the id first if the scheduler can (a
				// router may retry on this worker at once); a hung step
				// holds this only for releaseWait.
				awaitRelease(st, releaseWait)
			} else {
				drain(st)
			}
			if ctx.Err() != nil {
				return status.FromContextError(ctx.Err()).Err()
			}
			return svckit.Errorf(context.DeadlineExceeded, "%w", errNoFirst)
		}
		switch ev.Kind {
		case sched.EventToken:
			if tokens++; tokens%tracing.TokenEventEvery == 0 {
				dspan.AddEvent(tracing.EventTokens, trace.WithAttributes(tracing.AttrTokens.Int(tokens)))
			}
			if first {
				dspan.AddEvent(tracing.EventFirstToken)
				// Only the request's own deadline and cancellation remain.
				first = false
				stop()
				stop = context.AfterFunc(ctx, func() { schedCancel(context.Cause(ctx)) })
			}
			out := &batonv1.GenerateEvent{RequestId: req.ID, Index: uint32(ev.Choice), TokenIds: []uint32{uint32(ev.Token.ID)}, Text: ev.Text}
			if promptLogprobs == nil {
				promptLogprobs = apiconv.WirePromptLogprobs(ev.PromptLogprobs)
			}
			out.PromptLogprobs, promptLogprobs = promptLogprobs, nil
			if req.Params.Logprobs {
				out.Logprobs = []*batonv1.TokenLogprob{apiconv.WireLogprob(ev.Token)}
			}
			if err := stream.Send(&batonv1.DecodeServiceGenerateResponse{Event: out}); err != nil {
				schedCancel(err)
				drain(st)
				return err
			}
		case sched.EventDone:
			if ctx.Err() != nil {
				return status.FromContextError(ctx.Err()).Err()
			}
			if context.Cause(ftCtx) == errNoFirst && ev.Finish == sched.FinishCancelled {
				return svckit.Errorf(context.DeadlineExceeded, "%w", errNoFirst)
			}
			fr, err := finish(ev)
			if err != nil {
				log.WarnContext(dctx, "request failed", "finish", ev.Finish.String(), "err", ev.Err, "choice", ev.Choice)
				if choices > 1 {
					// One choice failing fails the request: the others are
					// cancelled, and released before the RPC ends (a
					// retry may reuse the ids at once).
					schedCancel(err)
					awaitRelease(st, releaseWait)
				}
				return err
			}
			if ev.Choice == 0 {
				// The request's reuse is its first choice's (the others
				// fork from its prompt).
				cached0 = ev.Usage.CachedTokens
			}
			if ended++; ended < choices {
				completion += ev.Usage.CompletionTokens
				// The first choice may end before any token (a stop
				// first): its end carries the prompt's log-probabilities,
				// the first event with a finish or a token must.
				if promptLogprobs == nil {
					promptLogprobs = apiconv.WirePromptLogprobs(ev.PromptLogprobs)
				}
				out := &batonv1.GenerateEvent{RequestId: req.ID, Index: uint32(ev.Choice), Text: ev.Text, FinishReason: fr}
				out.PromptLogprobs, promptLogprobs = promptLogprobs, nil
				if err := stream.Send(&batonv1.DecodeServiceGenerateResponse{Event: out}); err != nil {
					schedCancel(err)
					drain(st)
					return err
				}
				continue
			}
			timing.DecodeSeconds = time.Since(decodeStart).Seconds()
			dspan.SetAttributes(tracing.AttrFinish.String(fr.String()))
			u := ev.Usage
			u.CompletionTokens += completion
			if choices > 1 {
				u.CachedTokens = cached0
			}
			if pdCached >= 0 {
				u.CachedTokens = pdCached
			}
			dspan.SetAttributes(tracing.AttrPromptCachedTokens.Int(u.CachedTokens))
			if promptLogprobs == nil && first {
				promptLogprobs = apiconv.WirePromptLogprobs(ev.PromptLogprobs)
			}
			return stream.Send(&batonv1.DecodeServiceGenerateResponse{Event: &batonv1.GenerateEvent{
				RequestId: req.ID, Index: uint32(ev.Choice), Text: ev.Text, FinishReason: fr, Timing: timing,
				Usage: &batonv1.Usage{PromptTokens: uint32(u.PromptTokens), CompletionTokens: uint32(u.CompletionTokens),
					TotalTokens: uint32(u.PromptTokens + u.CompletionTokens), CachedTokens: uint32(u.CachedTokens)},
				PromptLogprobs: promptLogprobs, // nil once the first token carried them
			}})
		}
	}
}

// modeName names a request's mode in traces.
func modeName(m sched.Mode) string {
	if m == sched.ModeGenerate {
		return "colocated"
	}
	return "pd"
}

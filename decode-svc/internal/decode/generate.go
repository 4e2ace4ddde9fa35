package decode

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/baton-serving/baton/engine/sample"
	"github.com/baton-serving/baton/engine/sched"
	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"github.com/baton-serving/baton/svckit"
	"github.com/baton-serving/baton/svckit/apiconv"
	"github.com/baton-serving/baton/svckit/canarylabel"
	"github.com/baton-serving/baton/tracing"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

const localPrefill = "local"

// Generate runs one request: reserve pages, pull the KV cache, decode.
func (s *Service) Generate(in *batonv1.DecodeServiceGenerateRequest, stream batonv1.DecodeService_GenerateServer) (err error) {
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
	log := s.logger.With("request_id", req.ID, "prefill", in.GetPrefillEndpoint())
	ctx, canary := canarylabel.Label(ctx, req.ID)
	if canary {
		log = log.With("canary", true)
	}
	start := time.Now()
	trace.SpanFromContext(ctx).SetAttributes(tracing.AttrRequestID.String(req.ID))
	defer s.host.TraceRequest(ctx, req.ID)()

	// The scheduler request outlives the RPC's context until any transfer
	// into its pages has stopped: only then may its pages be released.
	schedCtx, schedCancel := context.WithCancelCause(context.WithoutCancel(ctx))
	defer schedCancel(nil)
	st, err := s.host.Sched.Submit(schedCtx, req)
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
	errNoFirst := fmt.Errorf("no first token within --first-token-timeout %v", s.firstTokenTimout)
	ftCtx, ftCancel := context.WithTimeoutCause(ctx, s.firstTokenTimout, errNoFirst)
	defer ftCancel()
	if req.Mode == sched.ModeDecodeImported {
		if err := s.pull(ftCtx, log, in, st, timing, start); err != nil {
			if context.Cause(ftCtx) == errNoFirst {
				err = status.Error(codes.DeadlineExceeded, errNoFirst.Error())
			}
			schedCancel(err)
			// The router may retry this request on this worker at once
			// (a failure before the first token is retryable): its id
			// must be free again by then, so wait for the release.
			awaitRelease(st, releaseWait)
			return err
		}
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
	defer func() {
		dspan.SetAttributes(tracing.AttrTokens.Int(tokens))
		why := ctx // the first-token deadline no longer applies after the first token
		if first {
			why = ftCtx
		}
		tracing.EndAborted(why, dspan, tracing.SpanDecode, err)
	}()
	for ev := range st.Events() {
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
			out := &batonv1.GenerateEvent{RequestId: req.ID, TokenIds: []uint32{uint32(ev.Token.ID)}, Text: ev.Text}
			if req.Params.Logprobs {
				out.Logprobs = []*batonv1.TokenLogprob{wireLogprob(ev.Token)}
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
				return status.Error(codes.DeadlineExceeded, errNoFirst.Error())
			}
			fr, err := finish(ev)
			if err != nil {
				log.WarnContext(dctx, "request failed", "finish", ev.Finish.String(), "err", ev.Err)
				return err
			}
			timing.DecodeSeconds = time.Since(decodeStart).Seconds()
			dspan.SetAttributes(tracing.AttrFinish.String(fr.String()))
			u := ev.Usage
			return stream.Send(&batonv1.DecodeServiceGenerateResponse{Event: &batonv1.GenerateEvent{
				RequestId: req.ID, Text: ev.Text, FinishReason: fr, Timing: timing,
				Usage: &batonv1.Usage{PromptTokens: uint32(u.PromptTokens), CompletionTokens: uint32(u.CompletionTokens),
					TotalTokens: uint32(u.PromptTokens + u.CompletionTokens)},
			}})
		}
	}
	return status.Error(codes.Internal, "the scheduler closed the request's events without a final event")
}

// modeName names a request's mode in traces.
func modeName(m sched.Mode) string {
	if m == sched.ModeGenerate {
		return "colocated"
	}
	return "pd"
}

// drain consumes a request's remaining events so that its release is
// observed; the scheduler never blocks on them, this only keeps the order of
// logs and metrics tidy.
// releaseWait bounds how long a failed request waits for the scheduler to
// release it before the RPC ends (the release happens at the next step
// boundary; the bound only matters for a stalled scheduler).
const releaseWait = 2 * time.Second

// awaitRelease drains st until the scheduler has released the request, or
// for at most d; what is left is drained in the background.
func awaitRelease(st *sched.Stream, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		select {
		case _, ok := <-st.Events():
			if !ok {
				return
			}
		case <-t.C:
			drain(st)
			return
		}
	}
}

func drain(st *sched.Stream) {
	go func() {
		for range st.Events() {
		}
	}()
}

func wireLogprob(t sample.Token) *batonv1.TokenLogprob {
	lp := &batonv1.TokenLogprob{TokenId: uint32(t.ID), Logprob: t.Logprob}
	for _, alt := range t.Top {
		lp.TopLogprobs = append(lp.TopLogprobs, &batonv1.TopLogprob{TokenId: uint32(alt.ID), Logprob: alt.Logprob})
	}
	return lp
}

// finish maps the scheduler's end of a request to the API's finish reason or
// a status error.
func finish(ev sched.Event) (batonv1.FinishReason, error) {
	switch ev.Finish {
	case sched.FinishStop:
		return batonv1.FinishReason_FINISH_REASON_STOP, nil
	case sched.FinishLength, sched.FinishContext:
		return batonv1.FinishReason_FINISH_REASON_LENGTH, nil
	case sched.FinishCancelled:
		return 0, status.Errorf(codes.Canceled, "request cancelled: %v", ev.Err)
	case sched.FinishAborted:
		if errors.Is(ev.Err, sched.ErrClosed) {
			return 0, status.Errorf(codes.Unavailable, "decode worker shutting down: %v", ev.Err)
		}
		return 0, status.Errorf(codes.Aborted, "%v", ev.Err)
	}
	return 0, svckit.Status(fmt.Errorf("request failed: %w", ev.Err))
}

// checkRequest validates a routed request and returns the scheduler request.
func (s *Service) checkRequest(in *batonv1.DecodeServiceGenerateRequest) (sched.Request, error) {
	bad := func(err error) error { return status.Errorf(codes.InvalidArgument, "%v", err) }
	r := in.GetRequest()
	if err := apiconv.ValidRequestID(r.GetRequestId()); err != nil {
		return sched.Request{}, bad(err)
	}
	cfg := s.host.Config
	prompt, err := apiconv.TokenIDs("request.prompt_token_ids", r.GetPromptTokenIds(), cfg.Vocab)
	if err != nil {
		return sched.Request{}, bad(err)
	}
	if len(prompt) == 0 {
		return sched.Request{}, bad(errors.New("request.prompt_token_ids: empty (the router tokenizes prompts)"))
	}
	maxNew := int(r.GetSampling().GetMaxNewTokens())
	if maxNew < 1 || len(prompt)+maxNew > cfg.ContextLength {
		return sched.Request{}, bad(fmt.Errorf("request.sampling.max_new_tokens: %d with a %d-token prompt, want 1-%d (context window %d)",
			maxNew, len(prompt), cfg.ContextLength-len(prompt), cfg.ContextLength))
	}
	params, err := apiconv.Sampling(r.GetSampling())
	if err != nil {
		return sched.Request{}, bad(err)
	}
	stopIDs, err := apiconv.StopTokenIDs(r.GetSampling(), cfg.Vocab)
	if err != nil {
		return sched.Request{}, bad(err)
	}
	mode := sched.ModeDecodeImported
	switch ep := in.GetPrefillEndpoint(); {
	case ep == localPrefill:
		mode = sched.ModeGenerate
	case svckit.ValidateAddr(ep) != nil:
		return sched.Request{}, bad(fmt.Errorf("prefill_endpoint: %q, want host:port or %q", ep, localPrefill))
	}
	return sched.Request{ID: r.GetRequestId(), Mode: mode, Prompt: prompt, MaxTokens: maxNew, Params: params,
		Stop: r.GetSampling().GetStop(), StopIDs: stopIDs, IgnoreEOS: r.GetSampling().GetIgnoreEos()}, nil
}

// submitErr maps the scheduler's refusals to status codes.
func submitErr(err error) error {
	switch {
	case errors.Is(err, sched.ErrDuplicateID):
		return status.Errorf(codes.AlreadyExists, "%v", err)
	case errors.Is(err, sched.ErrQueueFull):
		return status.Errorf(codes.ResourceExhausted, "%v", err)
	case errors.Is(err, sched.ErrClosed):
		return status.Errorf(codes.Unavailable, "%v", err)
	}
	return svckit.Status(err)
}

package decode

import (
	"context"
	"log/slog"
	"time"

	"github.com/baton-serving/baton/engine/sched"
	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"github.com/baton-serving/baton/tracing"
	"go.opentelemetry.io/otel/trace"
)

// pull brings a PD request from admission to running: it waits for the
// request's pages (reserve), opens the transfer and sends the handshake
// (handshake), streams the prompt's KV cache into the pages and activates
// the request with prefill's first token (receive), asking prefill to stop
// when anything goes wrong on the way (abort). When pull returns, no
// transfer writes the pages any more, whatever happened. It returns the
// prompt's log-probabilities from prefill's PrefillDone when the request
// asked for them (SamplingParams.prompt_logprobs), and the prompt tokens
// prefill reused from its prefix cache.
func (s *Service) pull(ctx context.Context, log *slog.Logger, in *batonv1.DecodeServiceGenerateRequest, st *sched.Stream, timing *batonv1.Timing, start time.Time) (_ []*batonv1.TokenLogprob, cached int, err error) {
	res, err := reserve(ctx, st, timing, start)
	if err != nil {
		return nil, 0, err
	}
	// The transfer, the TransferKV call included, is the kv_receive span.
	ctx, span := tracing.Start(ctx, tracing.SpanKVReceive, trace.WithAttributes(tracing.AttrPrefill.String(in.GetPrefillEndpoint()),
		tracing.AttrKVPages.Int(len(res.pages)), tracing.AttrKVPagesHeld.Int(res.held),
		tracing.AttrPromptTokens.Int(len(in.GetRequest().GetPromptTokenIds()))))
	var t *transfer
	defer func() {
		if t != nil {
			t.close()
			if t.rcv != nil {
				span.SetAttributes(tracing.AttrKVBytes.Int64(int64(t.rcv.Bytes())), tracing.AttrKVChunks.Int64(int64(t.rcv.Chunks())))
			}
		}
		tracing.EndAborted(ctx, span, tracing.SpanKVReceive, err)
	}()
	if t, err = s.handshake(ctx, log, in, res); err != nil {
		return nil, 0, err
	}
	if err = s.receive(ctx, t, span, st, timing); err != nil {
		return nil, 0, err
	}
	span.SetAttributes(tracing.AttrPromptCachedTokens.Int(t.cachedTokens))
	return t.promptLogprobs, t.cachedTokens, nil
}

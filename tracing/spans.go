package tracing

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/status"
)

// Names of the spans that tell a request's story, below the gRPC and HTTP
// spans that otelgrpc and otelhttp create. They are part of Baton's
// operational interface (dashboards, the e2e suite and docs/observability.md
// name them): change them only with the docs.
const (
	// SpanRoute (router) is one attempt on one (prefill, decode) pair:
	// choosing the pair and running the request on it.
	SpanRoute = "route"
	// SpanStream (router, child of route) relays decode's events to the
	// client.
	SpanStream = "stream"
	// SpanPreallocWait (decode) waits for the prompt's KV pages to be
	// reserved.
	SpanPreallocWait = "prealloc_wait"
	// SpanKVReceive (decode) pulls the prompt's KV cache from prefill; the
	// TransferKV call is its child.
	SpanKVReceive = "kv_receive"
	// SpanDecode (decode) generates the tokens.
	SpanDecode = "decode"
	// SpanQueueWait (prefill) waits for pages and a place in a batch.
	SpanQueueWait = "queue_wait"
	// SpanForward (prefill) is one forward step that computed part of the
	// prompt.
	SpanForward = "forward"
	// SpanKVSend (prefill) streams the KV cache to decode.
	SpanKVSend = "kv_send"
)

// Names of span events.
const (
	// EventAbort marks a request that ended early, with AttrStage and
	// AttrReason.
	EventAbort = "abort"
	// EventFirstToken marks a request's first generated token.
	EventFirstToken = "first_token"
	// EventTokens marks every TokenEventEvery tokens, with AttrTokens.
	EventTokens = "tokens"
	// EventAccepted marks prefill's acceptance of a transfer.
	EventAccepted = "accepted"
)

// TokenEventEvery is how many generated tokens separate two EventTokens
// events on a decode span: often enough to see a stall, rarely enough that a
// long generation does not bloat its trace.
const TokenEventEvery = 32

// Attribute keys of Baton's spans and events.
const (
	AttrRequestID    = attribute.Key("baton.request_id")
	AttrPrefill      = attribute.Key("baton.prefill")       // prefill endpoint ("local": colocated)
	AttrDecode       = attribute.Key("baton.decode")        // decode endpoint
	AttrPolicy       = attribute.Key("baton.policy")        // routing policies, "prefill/decode"
	AttrAttempt      = attribute.Key("baton.attempt")       // 0 for the first try
	AttrRetry        = attribute.Key("baton.retry")         // true for every attempt after the first
	AttrMode         = attribute.Key("baton.mode")          // "pd" or "colocated"
	AttrPromptTokens = attribute.Key("baton.prompt_tokens") // tokens in the prompt
	// AttrPromptCachedTokens: prompt tokens whose KV pages came from the
	// prefix cache (computed by no one this time).
	AttrPromptCachedTokens = attribute.Key("baton.prompt_cached_tokens")
	AttrTokens             = attribute.Key("baton.tokens")        // tokens generated or computed
	AttrFinish             = attribute.Key("baton.finish_reason") // how a generation ended
	AttrKVBytes            = attribute.Key("baton.kv.bytes")      // KV cache bytes moved (K and V)
	AttrKVChunks           = attribute.Key("baton.kv.chunks")     // KVChunk messages moved
	AttrKVPages            = attribute.Key("baton.kv.pages")      // KV pages reserved or completed
	// AttrKVPagesHeld: leading prompt pages decode's prefix cache already
	// held, so that prefill did not send them.
	AttrKVPagesHeld = attribute.Key("baton.kv.pages_held")
	// AttrRoutePrefixPages: the prompt's full leading pages a worker's
	// prefix cache could supply; AttrRouteDecodeHeld and
	// AttrRoutePrefillHeld: those the chosen decode and prefill workers
	// held by the router's index of their caches.
	AttrRoutePrefixPages = attribute.Key("baton.route.prefix_pages")
	AttrRouteDecodeHeld  = attribute.Key("baton.route.decode_pages_held")
	AttrRoutePrefillHeld = attribute.Key("baton.route.prefill_pages_held")
	AttrBatchSeqs        = attribute.Key("baton.batch.seqs")   // sequences in a forward step
	AttrBatchTokens      = attribute.Key("baton.batch.tokens") // tokens in a forward step, all sequences
	// AttrStage and AttrReason describe an EventAbort: the span name of
	// the stage the request was in, and why it ended.
	AttrStage  = attribute.Key("stage")
	AttrReason = attribute.Key("reason")
)

// instrumentationName names Baton's tracer.
const instrumentationName = "github.com/baton-serving/baton"

// Start starts a span named name as a child of ctx's span, from the same
// provider as ctx's span. A context without a span gets a span that records
// nothing, so code paths that run outside a traced RPC need no checks and no
// global provider.
func Start(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	return trace.SpanFromContext(ctx).TracerProvider().Tracer(instrumentationName).Start(ctx, name, opts...)
}

// RecordError marks span as failed by err, with its gRPC status code when it
// carries one. A nil err changes nothing.
func RecordError(span trace.Span, err error) {
	if err == nil {
		return
	}
	span.RecordError(err)
	if st, ok := status.FromError(err); ok {
		span.SetAttributes(semconv.RPCResponseStatusCode(st.Code().String()))
		span.SetStatus(codes.Error, st.Message())
		return
	}
	span.SetStatus(codes.Error, err.Error())
}

// Abort records that a request ended early while in stage (a span name):
// an EventAbort event with the stage and reason on span, and an error status.
func Abort(span trace.Span, stage, reason string) {
	span.AddEvent(EventAbort, trace.WithAttributes(AttrStage.String(stage), AttrReason.String(reason)))
	span.SetStatus(codes.Error, stage+": "+reason)
}

// AbortReason is the best short account of why a request stopped: the cause
// of ctx's end when ctx has ended (a client cancel, a deadline, an Abort
// call), otherwise err's message.
func AbortReason(ctx context.Context, err error) string {
	if cause := context.Cause(ctx); cause != nil {
		return cause.Error()
	}
	if st, ok := status.FromError(err); ok && err != nil {
		return st.Code().String() + ": " + st.Message()
	}
	if err != nil {
		return err.Error()
	}
	return "unknown"
}

// EndAborted ends span: when err is not nil the request ended early in
// stage, so the span gets the error and an EventAbort with the reason.
func EndAborted(ctx context.Context, span trace.Span, stage string, err error) {
	if err != nil {
		RecordError(span, err)
		Abort(span, stage, AbortReason(ctx, err))
	}
	span.End()
}

// TraceID returns the trace id of ctx's span in hex, the form Jaeger and the
// logs use, or "" when ctx holds no span.
func TraceID(ctx context.Context) string {
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		return sc.TraceID().String()
	}
	return ""
}

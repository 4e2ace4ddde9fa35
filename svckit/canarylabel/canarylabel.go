// Package canarylabel is the contract between the router's canary
// (router-svc/internal/canary) and the workers that serve it: how a canary
// request is recognised and labelled on every hop. It is a leaf package, so
// the router can name the contract without importing the engine.
//
// Canary requests are the router's probes of a (prefill, decode) pair: one
// tiny real request through a real KV transfer. They carry two labels: a
// request id starting with IDPrefix, which is what the scheduler — and so
// the workers' metrics — know a request by, and the gRPC metadata
// MetadataKey: "1" on every call made for them. Workers leave canaries out
// of the statistics of user traffic (latency histograms, finished and
// aborted counts) and count them in baton_canary_requests_total instead.
// Gauges of live state (queues, pages, the oldest request's age) and request
// listings include them: they hold real resources while they run. The
// router refuses client request ids with the canary prefix, so no user
// request is mistaken for one.
package canarylabel

import (
	"context"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/metadata"
)

const (
	// IDPrefix starts every canary request id.
	IDPrefix = "canary-"
	// MetadataKey is the gRPC metadata key, with value "1", on every call
	// made for a canary.
	MetadataKey = "baton-canary"
	// Attr (true) marks the spans of a canary request.
	Attr = attribute.Key("baton.canary")
)

// Is reports whether the request with this id is a router canary.
func Is(id string) bool { return strings.HasPrefix(id, IDPrefix) }

// Label labels a canary request's work: it marks ctx's span with Attr and
// adds the canary metadata to ctx for the calls the worker makes for the
// request (decode's TransferKV to prefill), so that every hop carries the
// label. For any other request it returns ctx unchanged.
func Label(ctx context.Context, id string) (context.Context, bool) {
	if !Is(id) {
		return ctx, false
	}
	trace.SpanFromContext(ctx).SetAttributes(Attr.Bool(true))
	return metadata.AppendToOutgoingContext(ctx, MetadataKey, "1"), true
}

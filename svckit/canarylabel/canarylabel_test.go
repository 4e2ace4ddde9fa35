package canarylabel

import (
	"context"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"google.golang.org/grpc/metadata"
)

// TestLabel: a canary's span gets baton.canary=true and its outgoing
// calls the canary metadata; any other request is left alone.
func TestLabel(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer tp.Shutdown(context.Background())
	for _, c := range []struct {
		id     string
		canary bool
	}{{"canary-5f2c", true}, {"req-5f2c", false}, {"", false}} {
		ctx, span := tp.Tracer("t").Start(context.Background(), "rpc-"+c.id)
		out, canary := Label(ctx, c.id)
		span.End()
		if canary != c.canary || Is(c.id) != c.canary {
			t.Errorf("%q: canary %v, want %v", c.id, canary, c.canary)
		}
		md, _ := metadata.FromOutgoingContext(out)
		if got := md.Get(MetadataKey); c.canary != (len(got) == 1 && got[0] == "1") {
			t.Errorf("%q: outgoing %s = %v", c.id, MetadataKey, got)
		}
		ended := rec.Ended()
		labelled := false
		for _, kv := range ended[len(ended)-1].Attributes() {
			if kv.Key == Attr && kv.Value.AsBool() {
				labelled = true
			}
		}
		if labelled != c.canary {
			t.Errorf("%q: span labelled %v, want %v", c.id, labelled, c.canary)
		}
	}
}

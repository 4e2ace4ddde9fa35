package tracing

import (
	"context"
	"errors"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// recorder returns a provider that keeps ended spans in memory.
func recorder(t *testing.T) (*sdktrace.TracerProvider, *tracetest.SpanRecorder) {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return tp, rec
}

func attrs(kvs []attribute.KeyValue) map[attribute.Key]string {
	m := map[attribute.Key]string{}
	for _, kv := range kvs {
		m[kv.Key] = kv.Value.Emit()
	}
	return m
}

func TestStartUsesTheParentsProvider(t *testing.T) {
	tp, rec := recorder(t)
	ctx, parent := tp.Tracer("t").Start(context.Background(), "rpc")
	_, child := Start(ctx, SpanRoute)
	child.End()
	parent.End()
	spans := rec.Ended()
	if len(spans) != 2 || spans[0].Name() != SpanRoute {
		t.Fatalf("recorded %d spans, first %q; want route then rpc", len(spans), spans[0].Name())
	}
	if spans[0].Parent().SpanID() != parent.SpanContext().SpanID() {
		t.Error("route is not a child of the RPC's span")
	}

	// Without a span in the context, nothing is recorded and nothing fails.
	_, orphan := Start(context.Background(), SpanRoute)
	orphan.End()
	if orphan.SpanContext().IsValid() || len(rec.Ended()) != 2 {
		t.Error("a span was recorded without a parent span to take the provider from")
	}
}

func TestEndAborted(t *testing.T) {
	cancelled, cancel := context.WithCancelCause(context.Background())
	cancel(errors.New("client went away"))
	tests := []struct {
		name       string
		ctx        context.Context
		err        error
		wantAbort  string // reason; "" for no abort event
		wantStatus otelcodes.Code
		wantCode   string
	}{
		{"success", context.Background(), nil, "", otelcodes.Unset, ""},
		{"worker error", context.Background(), status.Error(codes.Unavailable, "decode down"), "Unavailable: decode down", otelcodes.Error, "Unavailable"},
		{"plain error", context.Background(), errors.New("boom"), "boom", otelcodes.Error, ""},
		{"cancelled: the cause is the reason", cancelled, status.Error(codes.Canceled, "context canceled"), "client went away", otelcodes.Error, "Canceled"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tp, rec := recorder(t)
			ctx, parent := tp.Tracer("t").Start(context.Background(), "rpc")
			_, span := Start(ctx, SpanDecode)
			EndAborted(tt.ctx, span, SpanDecode, tt.err)
			parent.End()
			got := rec.Ended()[0]
			if got.Status().Code != tt.wantStatus {
				t.Errorf("status %v, want %v", got.Status().Code, tt.wantStatus)
			}
			if c := attrs(got.Attributes())["rpc.response.status_code"]; c != tt.wantCode {
				t.Errorf("status code attribute %q, want %q", c, tt.wantCode)
			}
			var aborts []map[attribute.Key]string
			for _, ev := range got.Events() {
				if ev.Name == EventAbort {
					aborts = append(aborts, attrs(ev.Attributes))
				}
			}
			switch {
			case tt.wantAbort == "" && len(aborts) != 0:
				t.Errorf("abort events %v on a success", aborts)
			case tt.wantAbort != "" && len(aborts) != 1:
				t.Errorf("%d abort events, want 1", len(aborts))
			case tt.wantAbort != "":
				if aborts[0][AttrStage] != SpanDecode || aborts[0][AttrReason] != tt.wantAbort {
					t.Errorf("abort event %v, want stage %q reason %q", aborts[0], SpanDecode, tt.wantAbort)
				}
			}
		})
	}
}

func TestTraceID(t *testing.T) {
	if id := TraceID(context.Background()); id != "" {
		t.Errorf("TraceID without a span = %q", id)
	}
	tp, _ := recorder(t)
	ctx, span := tp.Tracer("t").Start(context.Background(), "rpc")
	defer span.End()
	if got, want := TraceID(ctx), span.SpanContext().TraceID().String(); got != want || len(got) != 32 {
		t.Errorf("TraceID = %q, want %q", got, want)
	}
}

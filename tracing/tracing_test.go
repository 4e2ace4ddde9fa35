package tracing

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestInitWithoutEndpointExportsNothing(t *testing.T) {
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "")
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
	var logs strings.Builder
	p, err := Init(context.Background(), "test-svc", slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if p.Exporting() {
		t.Error("exporting with no endpoint configured")
	}
	_, span := p.Tracer("t").Start(context.Background(), "op")
	if !span.SpanContext().IsValid() {
		t.Error("spans should still carry ids for logs and request listings")
	}
	span.End()
	if err := p.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if logs.Len() != 0 {
		t.Errorf("no-endpoint tracing logged: %s", logs.String())
	}
}

func TestInitWithEndpointExports(t *testing.T) {
	// Nothing listens here; export errors must not fail Init or Shutdown's caller.
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
	p, err := Init(context.Background(), "test-svc", nil)
	if err != nil {
		t.Fatal(err)
	}
	if !p.Exporting() {
		t.Error("not exporting with an endpoint configured")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_ = p.Shutdown(ctx)
}

func TestTracesExporterNone(t *testing.T) {
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
	t.Setenv("OTEL_TRACES_EXPORTER", "none")
	p, err := Init(context.Background(), "test-svc", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Shutdown(context.Background())
	if p.Exporting() {
		t.Error("OTEL_TRACES_EXPORTER=none must disable export")
	}
}

func TestErrorHandlerIsRateLimited(t *testing.T) {
	var logs strings.Builder
	h := newRateLimitedErrorHandler(slog.New(slog.NewTextHandler(&logs, nil)), time.Hour)
	for range 100 {
		h.Handle(errors.New("collector unreachable"))
	}
	if n := strings.Count(logs.String(), "collector unreachable"); n != 1 {
		t.Errorf("logged %d times, want 1", n)
	}
	if h.suppressed != 99 {
		t.Errorf("suppressed = %d, want 99", h.suppressed)
	}
}

func TestRegistryHasBuildInfo(t *testing.T) {
	reg := NewRegistry("test-svc")
	n, err := testutil.GatherAndCount(reg, "baton_build_info")
	if err != nil || n != 1 {
		t.Fatalf("baton_build_info series = %d, %v", n, err)
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(""), "no_such_metric"); err != nil {
		t.Fatal(err)
	}
}

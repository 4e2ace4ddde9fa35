// Package tracing is the one place Baton sets up OpenTelemetry and Prometheus.
//
// Init configures tracing from the standard OTEL_* environment variables: with
// OTEL_EXPORTER_OTLP_ENDPOINT (or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) set, spans
// are batched and exported over OTLP/gRPC; without it, spans are still created
// (so trace ids appear in logs and request listings) but nothing is exported
// and nothing complains. W3C trace context and baggage are propagated.
package tracing

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
)

// Provider is a service's tracing setup.
type Provider struct {
	tp         *sdktrace.TracerProvider
	propagator propagation.TextMapPropagator
	exporting  bool
}

// Exporting reports whether spans are exported to a collector.
func (p *Provider) Exporting() bool { return p.exporting }

// Tracer returns a named tracer.
func (p *Provider) Tracer(name string) trace.Tracer { return p.tp.Tracer(name) }

// TracerProvider returns the underlying provider.
func (p *Provider) TracerProvider() trace.TracerProvider { return p.tp }

// Propagator returns the W3C trace-context + baggage propagator.
func (p *Provider) Propagator() propagation.TextMapPropagator { return p.propagator }

// ServerOption instruments a gRPC server: incoming trace context is honoured
// and every RPC gets a span.
func (p *Provider) ServerOption() grpc.ServerOption {
	return grpc.StatsHandler(otelgrpc.NewServerHandler(
		otelgrpc.WithTracerProvider(p.tp), otelgrpc.WithPropagators(p.propagator)))
}

// DialOption instruments a gRPC client connection: outgoing calls carry the
// caller's trace context.
func (p *Provider) DialOption() grpc.DialOption {
	return grpc.WithStatsHandler(otelgrpc.NewClientHandler(
		otelgrpc.WithTracerProvider(p.tp), otelgrpc.WithPropagators(p.propagator)))
}

// Shutdown flushes buffered spans and stops the exporter.
func (p *Provider) Shutdown(ctx context.Context) error { return p.tp.Shutdown(ctx) }

// Init sets up tracing for the named service. The returned Provider is also
// installed as OpenTelemetry's global provider and propagator, so libraries
// that use the globals join the same traces. Call Shutdown before exiting.
func Init(ctx context.Context, service string, logger *slog.Logger) (*Provider, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	res, err := resource.New(ctx,
		resource.WithAttributes(semconv.ServiceName(service)),
		resource.WithFromEnv(), // OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES
		resource.WithTelemetrySDK(),
		resource.WithHost(),
		resource.WithProcessPID(),
	)
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		return nil, fmt.Errorf("tracing: resource: %w", err)
	}
	opts := []sdktrace.TracerProviderOption{sdktrace.WithResource(res)}
	p := &Provider{propagator: propagation.NewCompositeTextMapPropagator(
		propagation.TraceContext{}, propagation.Baggage{})}
	if exporterConfigured() {
		exp, err := otlptracegrpc.New(ctx)
		if err != nil {
			return nil, fmt.Errorf("tracing: OTLP exporter: %w", err)
		}
		opts = append(opts, sdktrace.WithBatcher(exp))
		p.exporting = true
	}
	// The SDK reads OTEL_TRACES_SAMPLER and OTEL_TRACES_SAMPLER_ARG itself.
	p.tp = sdktrace.NewTracerProvider(opts...)
	otel.SetTracerProvider(p.tp)
	otel.SetTextMapPropagator(p.propagator)
	otel.SetErrorHandler(newRateLimitedErrorHandler(logger, 10*time.Second))
	return p, nil
}

func exporterConfigured() bool {
	if strings.EqualFold(os.Getenv("OTEL_TRACES_EXPORTER"), "none") {
		return false
	}
	return os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}

// rateLimitedErrorHandler logs OpenTelemetry errors (e.g. a collector that is
// down) at most once per interval, with a count of those suppressed, so an
// unreachable backend cannot flood the logs.
type rateLimitedErrorHandler struct {
	logger     *slog.Logger
	interval   time.Duration
	mu         sync.Mutex
	last       time.Time
	suppressed int
}

func newRateLimitedErrorHandler(l *slog.Logger, every time.Duration) *rateLimitedErrorHandler {
	return &rateLimitedErrorHandler{logger: l, interval: every}
}

func (h *rateLimitedErrorHandler) Handle(err error) {
	h.mu.Lock()
	now := time.Now()
	if !h.last.IsZero() && now.Sub(h.last) < h.interval {
		h.suppressed++
		h.mu.Unlock()
		return
	}
	n := h.suppressed
	h.suppressed = 0
	h.last = now
	h.mu.Unlock()
	h.logger.Warn("opentelemetry error", "err", err, "suppressed_since_last", n)
}

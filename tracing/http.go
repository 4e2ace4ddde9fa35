package tracing

import (
	"net/http"
	"strings"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
)

// HTTPHandler instruments an HTTP handler: an incoming W3C traceparent (and
// baggage) is honoured, and every request gets a server span named after the
// route it matched, so REST and OpenAI requests join their caller's trace
// and everything they call joins theirs. Probes and scrapes (/metrics,
// /health, /debug/) get no span: they would bury the requests' traces.
func (p *Provider) HTTPHandler(h http.Handler) http.Handler {
	return otelhttp.NewHandler(h, "http",
		otelhttp.WithTracerProvider(p.tp),
		otelhttp.WithPropagators(p.propagator),
		otelhttp.WithFilter(traced))
}

// traced reports whether an HTTP request gets a span.
func traced(r *http.Request) bool {
	p := r.URL.Path
	return p != "/metrics" && p != "/health" && !strings.HasPrefix(p, "/health/") && !strings.HasPrefix(p, "/debug/")
}

package tracing

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// TestHTTPHandlerHonoursTraceparent: an incoming traceparent makes the
// request's span (and what the handler starts under it) part of the
// caller's trace; probes and scrapes get no span.
func TestHTTPHandlerHonoursTraceparent(t *testing.T) {
	tp, rec := recorder(t)
	p := &Provider{tp: tp, propagator: propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})}
	mux := http.NewServeMux()
	var seen trace.SpanContext
	mux.HandleFunc("POST /v1/completions", func(w http.ResponseWriter, r *http.Request) {
		_, span := Start(r.Context(), SpanRoute)
		seen = span.SpanContext()
		span.End()
	})
	mux.HandleFunc("GET /metrics", func(http.ResponseWriter, *http.Request) {})
	srv := httptest.NewServer(p.HTTPHandler(mux))
	defer srv.Close()

	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	req, _ := http.NewRequestWithContext(context.Background(), "POST", srv.URL+"/v1/completions", nil)
	req.Header.Set("traceparent", "00-"+traceID+"-00f067aa0ba902b7-01")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got := seen.TraceID().String(); got != traceID {
		t.Errorf("the handler's span is in trace %s, want the caller's %s", got, traceID)
	}
	for _, path := range []string{"/metrics", "/health"} {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	var names []string
	for _, s := range rec.Ended() {
		names = append(names, s.Name())
		if s.SpanContext().TraceID().String() != traceID {
			t.Errorf("span %q in trace %s", s.Name(), s.SpanContext().TraceID())
		}
	}
	if len(names) != 2 || names[0] != SpanRoute || names[1] != "POST /v1/completions" {
		t.Errorf("spans %q, want [route, POST /v1/completions] (none for probes)", names)
	}
}

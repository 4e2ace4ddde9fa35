package openai_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestRouterCORS runs --cors-allowed-origins on the real router: a
// preflight without a key is answered even while the limiter is full, a
// streaming (SSE) answer and a REST gateway answer carry the CORS headers,
// and another origin gets none and its preflight 403.
func TestRouterCORS(t *testing.T) {
	const o = "https://app.example.com"
	tr := startRouter(t, "--cors-allowed-origins", o, "--max-concurrent-requests", "1")
	tr.gen.delay.Store(int64(30 * time.Millisecond))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	// A streaming chat completion from the allowed origin holds the only
	// slot; its SSE answer carries the CORS headers.
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, tr.http+"/v1/chat/completions",
		strings.NewReader(`{"messages":[{"role":"user","content":"Once upon a time"}],"max_tokens":100,"stream":true}`))
	req.Header.Set("Authorization", "Bearer "+testKey)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Origin", o)
	stream, err := http.DefaultClient.Do(req)
	if err != nil || stream.StatusCode != 200 {
		t.Fatalf("stream: %v %v", stream, err)
	}
	readEvent(t, stream)
	if h := stream.Header; h.Get("Access-Control-Allow-Origin") != o || !strings.Contains(h.Get("Content-Type"), "text/event-stream") ||
		!strings.Contains(h.Get("Access-Control-Expose-Headers"), "X-Request-Id") || !strings.Contains(h.Get("Vary"), "Origin") {
		t.Errorf("SSE answer headers %v", h)
	}

	preflight := func(origin, path string) *http.Response {
		t.Helper()
		r, _ := http.NewRequest(http.MethodOptions, tr.http+path, nil)
		r.Header.Set("Origin", origin)
		r.Header.Set("Access-Control-Request-Method", "POST")
		r.Header.Set("Access-Control-Request-Headers", "authorization,content-type,x-stainless-lang")
		resp, err := http.DefaultClient.Do(r)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		return resp
	}
	for _, p := range []string{"/v1/chat/completions", "/v1/completions", "/v1/complete"} {
		resp := preflight(o, p)
		if resp.StatusCode != http.StatusNoContent || resp.Header.Get("Access-Control-Allow-Origin") != o ||
			resp.Header.Get("Access-Control-Allow-Headers") != "authorization,content-type,x-stainless-lang" {
			t.Errorf("preflight %s: %d %v", p, resp.StatusCode, resp.Header)
		}
	}
	if resp := preflight("https://evil.example.com", "/v1/chat/completions"); resp.StatusCode != http.StatusForbidden ||
		resp.Header.Get("Access-Control-Allow-Origin") != "" {
		t.Errorf("preflight from another origin: %d %v", resp.StatusCode, resp.Header)
	}
	cancel()
	stream.Body.Close()
	tr.idle(t)

	// The REST gateway's answers carry them too; another origin's none.
	for origin, want := range map[string]string{o: o, "https://evil.example.com": ""} {
		r, _ := http.NewRequest(http.MethodGet, tr.http+"/v1/models", nil)
		r.Header.Set("Authorization", "Bearer "+testKey)
		r.Header.Set("Origin", origin)
		resp, err := http.DefaultClient.Do(r)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 || resp.Header.Get("Access-Control-Allow-Origin") != want {
			t.Errorf("GET /v1/models from %s: %d, Access-Control-Allow-Origin %q", origin, resp.StatusCode, resp.Header.Get("Access-Control-Allow-Origin"))
		}
	}
}

package openai_test

import (
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestRouterErrorShape: every answer under /v1 that is an error — an
// unknown path, a wrong method, a REST gateway (/v1/generate) error — is
// OpenAI's {"error":{"message","type","param","code"}}, with the status the
// OpenAI layer's mapping gives.
func TestRouterErrorShape(t *testing.T) {
	tr := startRouter(t, "--max-prompt-tokens", "8")
	auth := []string{"Authorization", "Bearer " + testKey}
	do := func(method, path, body string) (*http.Response, []byte) {
		t.Helper()
		req, _ := http.NewRequest(method, tr.http+path, strings.NewReader(body))
		req.Header.Set(auth[0], auth[1])
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, b
	}
	for _, c := range []struct {
		method, path, body string
		status             int
		typ                string
		param, code        any
		message            string
	}{
		{"POST", "/v1/foo", `{}`, 404, "invalid_request_error", nil, "unknown_url", "Invalid URL (POST /v1/foo)"},
		{"GET", "/v1/no/such/thing", "", 404, "invalid_request_error", nil, "unknown_url", "Invalid URL (GET /v1/no/such/thing)"},
		{"GET", "/v1/generate", "", 405, "invalid_request_error", nil, "method_not_allowed", ""},
		{"DELETE", "/v1/models", "", 405, "invalid_request_error", nil, "method_not_allowed", ""},
		{"GET", "/v1/completions", "", 405, "invalid_request_error", nil, "method_not_allowed", ""},
		// The REST gateway's own errors: the router's validation (400,
		// naming the wire field) and a body that is not JSON.
		{"POST", "/v1/generate", `{"prompt":"Once upon a time there was a little girl"}`, 400, "invalid_request_error", "prompt", nil, ""},
		{"POST", "/v1/complete", `{"prompt":"x","sampling":{"temperature":9}}`, 400, "invalid_request_error", "sampling.temperature", nil, ""},
		{"POST", "/v1/generate", `{not json`, 400, "invalid_request_error", nil, nil, ""},
	} {
		resp, b := do(c.method, c.path, c.body)
		obj := checkError(t, resp.StatusCode, object(t, b), c.status, c.typ, c.param)
		if obj["code"] != c.code {
			t.Errorf("%s %s: code %v, want %v", c.method, c.path, obj["code"], c.code)
		}
		if c.message != "" && obj["message"] != c.message {
			t.Errorf("%s %s: message %q, want %q", c.method, c.path, obj["message"], c.message)
		}
		if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
			t.Errorf("%s %s: Content-Type %q", c.method, c.path, ct)
		}
		if c.status == 405 && resp.Header.Get("Allow") == "" {
			t.Errorf("%s %s: 405 without Allow", c.method, c.path)
		}
	}
	tr.idle(t)
}

// TestRouterRefusalsCounted: refusals the OpenAI layer answers before a
// request reaches the router's run — a missing key (401), a body over
// --max-body-bytes (413), an unknown path (404) — are counted in
// baton_router_requests_total like every other finished request.
func TestRouterRefusalsCounted(t *testing.T) {
	tr := startRouter(t)
	auth := []string{"Authorization", "Bearer " + testKey}
	before := requestCounts(t, tr)
	post(t, tr.http+"/v1/completions", `{"prompt":"x","max_tokens":2}`)                        // 401
	post(t, tr.http+"/v1/completions", `{"prompt":"`+strings.Repeat("x", 70000)+`"}`, auth...) // 413
	post(t, tr.http+"/v1/generate", `{"prompt":"`+strings.Repeat("x", 70000)+`"}`, auth...)    // 413
	post(t, tr.http+"/v1/foo", `{}`, auth...)                                                  // 404
	after := requestCounts(t, tr)
	for code, want := range map[string]float64{"Unauthenticated": 1, "ResourceExhausted": 2, "NotFound": 1} {
		if got := after[code] - before[code]; got != want {
			t.Errorf("baton_router_requests_total{code=%q} rose by %v, want %v (before %v, after %v)", code, got, want, before, after)
		}
	}
	tr.idle(t)
}

var requestsLine = regexp.MustCompile(`(?m)^baton_router_requests_total\{code="([A-Za-z]+)"\} ([0-9.e+]+)$`)

// requestCounts is baton_router_requests_total by code, from /metrics.
func requestCounts(t *testing.T, tr *testRouter) map[string]float64 {
	t.Helper()
	resp, err := http.Get(tr.http + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	out := map[string]float64{}
	for _, m := range requestsLine.FindAllStringSubmatch(string(b), -1) {
		v, _ := strconv.ParseFloat(m[2], 64)
		out[m[1]] = v
	}
	return out
}

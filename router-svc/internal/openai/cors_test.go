package openai_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/baton-serving/baton/router-svc/internal/openai"
)

func TestParseCORSOrigins(t *testing.T) {
	for _, c := range []struct {
		in, err string // err "": valid
	}{
		{"", ""},
		{"*", ""},
		{"https://app.example.com", ""},
		{" https://app.example.com , http://localhost:3000 ", ""},
		{"HTTPS://App.Example.com:8443", ""},
		{"https://app.example.com/", `"https://app.example.com/": want scheme://host[:port] with no path`},
		{"https://app.example.com/ui", `"https://app.example.com/ui"`},
		{"app.example.com", `"app.example.com"`},
		{"https://", `"https://"`},
		{"https://a.example?x=1", `"https://a.example?x=1"`},
		{"https://user@a.example", `"https://user@a.example"`},
		{"https://a.example:port", `"https://a.example:port"`},
		{"https://a.example,", "empty entry"},
		{"*,https://a.example", `"*" must be the only origin`},
	} {
		_, err := openai.ParseCORSOrigins(c.in)
		if (c.err == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), c.err)) {
			t.Errorf("ParseCORSOrigins(%q) = %v, want error containing %q", c.in, err, c.err)
		}
	}
}

// reached is a handler that records being called and answers 200.
type reached struct{ n int }

func (h *reached) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	h.n++
	w.Header().Set("X-Request-Id", "r1")
	w.WriteHeader(http.StatusOK)
}

func corsDo(t *testing.T, origins string, method, origin string, hdr ...string) (*httptest.ResponseRecorder, int) {
	t.Helper()
	c, err := openai.ParseCORSOrigins(origins)
	if err != nil {
		t.Fatal(err)
	}
	next := &reached{}
	r := httptest.NewRequest(method, "/v1/chat/completions", nil)
	if origin != "" {
		r.Header.Set("Origin", origin)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		r.Header.Set(hdr[i], hdr[i+1])
	}
	w := httptest.NewRecorder()
	c.Middleware(next).ServeHTTP(w, r)
	return w, next.n
}

func TestCORSOff(t *testing.T) {
	// No --cors-allowed-origins: no CORS header at all, as before.
	w, n := corsDo(t, "", http.MethodPost, "https://app.example.com")
	if n != 1 || w.Header().Get("Access-Control-Allow-Origin") != "" || w.Header().Get("Vary") != "" {
		t.Errorf("off: reached %d, headers %v", n, w.Header())
	}
	w, n = corsDo(t, "", http.MethodOptions, "https://app.example.com", "Access-Control-Request-Method", "POST")
	if n != 1 || w.Header().Get("Access-Control-Allow-Origin") != "" {
		t.Errorf("off, preflight: reached %d, headers %v", n, w.Header())
	}
}

func TestCORSAllowedOrigin(t *testing.T) {
	const o = "https://app.example.com"
	w, n := corsDo(t, "http://localhost:3000,"+o, http.MethodPost, o)
	h := w.Header()
	if n != 1 || w.Code != 200 || h.Get("Access-Control-Allow-Origin") != o || !strings.Contains(h.Get("Vary"), "Origin") {
		t.Fatalf("allowed: reached %d, %d, headers %v", n, w.Code, h)
	}
	for _, e := range []string{"X-Request-Id", "Retry-After"} {
		if !strings.Contains(h.Get("Access-Control-Expose-Headers"), e) {
			t.Errorf("Access-Control-Expose-Headers %q lacks %s", h.Get("Access-Control-Expose-Headers"), e)
		}
	}
	// A configured origin with different case or a default port matches
	// the browser's serialization.
	w, _ = corsDo(t, "HTTPS://App.Example.com:443", http.MethodGet, o)
	if w.Header().Get("Access-Control-Allow-Origin") != o {
		t.Errorf("normalized origin: %v", w.Header())
	}
}

func TestCORSDisallowedOrigin(t *testing.T) {
	w, n := corsDo(t, "https://app.example.com", http.MethodPost, "https://evil.example.com")
	if n != 1 || w.Header().Get("Access-Control-Allow-Origin") != "" || w.Header().Get("Access-Control-Expose-Headers") != "" {
		t.Errorf("disallowed: reached %d, headers %v", n, w.Header())
	}
	if !strings.Contains(w.Header().Get("Vary"), "Origin") {
		t.Errorf("Vary = %q: the answer depends on Origin", w.Header().Get("Vary"))
	}
	w, n = corsDo(t, "https://app.example.com", http.MethodOptions, "https://evil.example.com",
		"Access-Control-Request-Method", "POST")
	if n != 0 || w.Code != http.StatusForbidden || w.Header().Get("Access-Control-Allow-Origin") != "" ||
		!strings.Contains(w.Body.String(), `"type":"invalid_request_error"`) || !strings.Contains(w.Body.String(), "https://evil.example.com") {
		t.Errorf("disallowed preflight: reached %d, %d %v %s", n, w.Code, w.Header(), w.Body)
	}
}

func TestCORSWildcard(t *testing.T) {
	w, n := corsDo(t, "*", http.MethodGet, "https://anything.example")
	if n != 1 || w.Header().Get("Access-Control-Allow-Origin") != "*" {
		t.Errorf("wildcard: reached %d, headers %v", n, w.Header())
	}
	// No Origin: not a CORS request; nothing added.
	w, n = corsDo(t, "*", http.MethodGet, "")
	if n != 1 || w.Header().Get("Access-Control-Allow-Origin") != "" {
		t.Errorf("no Origin: reached %d, headers %v", n, w.Header())
	}
}

func TestCORSPreflight(t *testing.T) {
	const o = "https://app.example.com"
	req := "authorization, content-type, x-stainless-os, x-stainless-retry-count, openai-organization"
	for _, origins := range []string{o, "*"} {
		// No Authorization: browsers send none with a preflight.
		w, n := corsDo(t, origins, http.MethodOptions, o,
			"Access-Control-Request-Method", "POST", "Access-Control-Request-Headers", req)
		h := w.Header()
		if n != 0 || w.Code != http.StatusNoContent {
			t.Fatalf("%s: preflight reached the API (%d) or answered %d", origins, n, w.Code)
		}
		if h.Get("Access-Control-Allow-Origin") != map[string]string{o: o, "*": "*"}[origins] ||
			!strings.Contains(h.Get("Access-Control-Allow-Methods"), "POST") || !strings.Contains(h.Get("Access-Control-Allow-Methods"), "GET") ||
			h.Get("Access-Control-Allow-Headers") != req || h.Get("Access-Control-Max-Age") != "600" {
			t.Errorf("%s: preflight headers %v", origins, h)
		}
	}
	// An OPTIONS without Access-Control-Request-Method is no preflight: it
	// goes to the API (which answers it as it always has).
	if _, n := corsDo(t, o, http.MethodOptions, o); n != 1 {
		t.Errorf("plain OPTIONS reached the API %d times", n)
	}
	// A malformed header list is not echoed.
	w, _ := corsDo(t, o, http.MethodOptions, o, "Access-Control-Request-Method", "POST",
		"Access-Control-Request-Headers", "x-a\r\nx-b: 1")
	if strings.ContainsAny(w.Header().Get("Access-Control-Allow-Headers"), "\r\n:") {
		t.Errorf("echoed %q", w.Header().Get("Access-Control-Allow-Headers"))
	}
}

package openai

// CORS for the router's public HTTP listener (--cors-allowed-origins), so
// that a web page on an allowed origin can call the API from a browser —
// the official openai JS SDK with dangerouslyAllowBrowser, or fetch. The
// admin listener never gets it.

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
)

// CORS is the set of origins allowed to call the API from a browser. A nil
// *CORS (the default) adds no CORS header and answers no preflight.
type CORS struct {
	any     bool                // "*": every origin
	origins map[string]struct{} // exact origins, as browsers serialize them
}

// corsMaxAge is how long, in seconds, a browser may cache a preflight's
// answer.
const corsMaxAge = 600

// Headers the answers set that a page's script may read (besides the
// CORS-safelisted ones): the request id, the back-off on 429/503, the
// authentication scheme on 401, the methods on 405.
const corsExposed = "X-Request-Id, Retry-After, WWW-Authenticate, Allow"

// Methods the API's routes use (the OpenAI API and the REST gateway).
const corsMethods = "GET, POST"

// ParseCORSOrigins parses --cors-allowed-origins: a comma-separated list of
// exact origins (scheme://host[:port], no path), or the single value "*".
// An empty value is nil: CORS off. Scheme and host are compared in lower
// case and a default port (http 80, https 443) is dropped, as a browser's
// Origin header has them.
func ParseCORSOrigins(v string) (*CORS, error) {
	if strings.TrimSpace(v) == "" {
		return nil, nil
	}
	parts := strings.Split(v, ",")
	c := &CORS{origins: make(map[string]struct{}, len(parts))}
	for _, p := range parts {
		p = strings.TrimSpace(p)
		switch {
		case p == "":
			return nil, errors.New("empty entry in the list")
		case p == "*":
			if len(parts) != 1 {
				return nil, errors.New(`"*" must be the only origin`)
			}
			c.any = true
			continue
		}
		o, err := normalizeOrigin(p)
		if err != nil {
			return nil, fmt.Errorf("%q: %w", p, err)
		}
		c.origins[o] = struct{}{}
	}
	return c, nil
}

var errOriginForm = errors.New("want scheme://host[:port] with no path, query or user (e.g. https://app.example.com), or *")

// normalizeOrigin checks that s is scheme://host[:port] and returns it as a
// browser serializes an origin.
func normalizeOrigin(s string) (string, error) {
	u, err := url.Parse(s)
	if err != nil || u.Scheme == "" || u.Host == "" || u.Opaque != "" || u.User != nil ||
		u.Path != "" || u.RawQuery != "" || u.ForceQuery || u.Fragment != "" || strings.Contains(s, "#") {
		return "", errOriginForm
	}
	host, port := strings.ToLower(u.Hostname()), u.Port()
	if host == "" || strings.HasSuffix(u.Host, ":") {
		return "", errOriginForm
	}
	if port != "" {
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return "", errOriginForm
		}
	}
	scheme := strings.ToLower(u.Scheme)
	if (scheme == "http" && port == "80") || (scheme == "https" && port == "443") {
		port = ""
	}
	if strings.Contains(host, ":") {
		host = "[" + host + "]" // IPv6
	}
	if port != "" {
		host += ":" + port
	}
	return scheme + "://" + host, nil
}

// allowed reports whether a request's Origin may call the API.
func (c *CORS) allowed(origin string) bool {
	if c.any {
		return true
	}
	_, ok := c.origins[origin]
	return ok
}

// Middleware adds the CORS headers to the answers of allowed origins and
// answers their preflights (OPTIONS with Access-Control-Request-Method)
// itself, 204, before next: a preflight carries no API key and takes no
// limiter slot. Another origin's requests go to next without CORS headers
// (the browser withholds the answer from the page) and its preflights get
// 403. Headers are set before next runs, so streaming answers (SSE,
// NDJSON) carry them too; w is passed on as it is (Flusher and
// ResponseController keep working). A nil *CORS returns next.
func (c *CORS) Middleware(next http.Handler) http.Handler {
	if c == nil {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		if !c.any {
			h.Add("Vary", "Origin") // the answer depends on it, even without one
		}
		origin := r.Header.Get("Origin")
		preflight := r.Method == http.MethodOptions && origin != "" && r.Header.Get("Access-Control-Request-Method") != ""
		if origin == "" {
			next.ServeHTTP(w, r)
			return
		}
		if !c.allowed(origin) {
			if preflight {
				e := &httpError{status: http.StatusForbidden, typ: typeInvalidRequest, code: "cors_origin_not_allowed",
					message: fmt.Sprintf("origin %q is not allowed (--cors-allowed-origins)", origin)}
				writeJSON(w, e.status, e.body())
				return
			}
			next.ServeHTTP(w, r)
			return
		}
		if c.any {
			h.Set("Access-Control-Allow-Origin", "*")
		} else {
			h.Set("Access-Control-Allow-Origin", origin)
		}
		if !preflight {
			h.Set("Access-Control-Expose-Headers", corsExposed)
			next.ServeHTTP(w, r)
			return
		}
		h.Add("Vary", "Access-Control-Request-Method")
		h.Add("Vary", "Access-Control-Request-Headers")
		h.Set("Access-Control-Allow-Methods", corsMethods)
		// Whatever headers the page asks for (Authorization,
		// Content-Type, X-Request-Id, OpenAI-*, the SDK's x-stainless-*):
		// the API ignores those it does not know.
		if req := r.Header.Get("Access-Control-Request-Headers"); req != "" && headerList(req) {
			h.Set("Access-Control-Allow-Headers", req)
		}
		h.Set("Access-Control-Max-Age", strconv.Itoa(corsMaxAge))
		w.WriteHeader(http.StatusNoContent)
	})
}

// headerList reports whether s is a comma-separated list of header names
// (tokens), safe to echo.
func headerList(s string) bool {
	for _, name := range strings.Split(s, ",") {
		name = strings.TrimSpace(name)
		if name == "" {
			return false
		}
		for _, ch := range name {
			if !(ch >= 'a' && ch <= 'z' || ch >= 'A' && ch <= 'Z' || ch >= '0' && ch <= '9' || strings.ContainsRune("!#$%&'*+-.^_`|~", ch)) {
				return false
			}
		}
	}
	return true
}

package diagnose

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
)

// discovered is a worker as the router describes it.
type discovered struct {
	role Role
	grpc string
	http string
	// quarantine is why the router's canary routes around the worker ("" if
	// it does not).
	quarantine string
}

// discover asks the router for its workers (GET /debug/workers).
func discover(ctx context.Context, client *http.Client, router string) ([]discovered, error) {
	r := &httpReader{base: router, client: client}
	code, b, err := r.get(ctx, "/debug/workers")
	if err != nil {
		return nil, fmt.Errorf("GET %s/debug/workers: %w", router, err)
	}
	if code != http.StatusOK {
		return nil, fmt.Errorf("GET %s/debug/workers: HTTP %d", router, code)
	}
	ws, err := parseWorkers(b)
	if err != nil {
		return nil, fmt.Errorf("GET %s/debug/workers: %w", router, err)
	}
	return ws, nil
}

// parseWorkers reads the router's worker view. It takes what it needs —
// each worker's role, gRPC address, HTTP address when the router knows it,
// and whether the canary quarantined it — from lists of worker objects,
// found at the top level, under "workers", or under "prefill" and "decode"
// (each a list or an object with a "workers" list), and ignores everything
// else, so that the view can grow without breaking diagnose.
func parseWorkers(b []byte) ([]discovered, error) {
	var top any
	if err := json.Unmarshal(b, &top); err != nil {
		return nil, fmt.Errorf("not JSON: %w", err)
	}
	var out []discovered
	add := func(v any, role Role) {
		items, ok := v.([]any)
		if obj, isObj := v.(map[string]any); isObj {
			items, ok = obj["workers"].([]any)
		}
		if !ok {
			return
		}
		for _, it := range items {
			obj, ok := it.(map[string]any)
			if !ok {
				continue
			}
			d := discovered{role: role}
			if r := strings.ToLower(str(obj, "role")); strings.Contains(r, "prefill") {
				d.role = RolePrefill
			} else if strings.Contains(r, "decode") {
				d.role = RoleDecode
			}
			d.grpc = str(obj, "address", "addr", "grpc_addr", "grpc_address", "endpoint", "grpc")
			d.http = str(obj, "http_addr", "http_address", "http_url", "http")
			if d.http != "" && !strings.Contains(d.http, "://") {
				d.http = "http://" + d.http
			}
			if q, _ := obj["quarantined"].(bool); q {
				d.quarantine = str(obj, "quarantine_reason")
				if d.quarantine == "" {
					d.quarantine = "no reason given"
				}
			}
			if d.role != "" && (d.grpc != "" || d.http != "") {
				out = append(out, d)
			}
		}
	}
	switch t := top.(type) {
	case []any:
		add(t, "")
	case map[string]any:
		add(t["workers"], "")
		add(t["prefill"], RolePrefill)
		add(t["decode"], RoleDecode)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no worker with a role and an address in %s", shorten(string(b), 200))
	}
	return out, nil
}

// str returns the first of keys that obj has as a non-empty string.
func str(obj map[string]any, keys ...string) string {
	for _, k := range keys {
		if s, ok := obj[k].(string); ok && s != "" {
			return s
		}
	}
	return ""
}

// parseEndpoints reads --prefill/--decode: comma-separated HTTP base URLs
// (a bare host:port is taken as HTTP), or grpc://host:port for a worker to
// read over gRPC.
func parseEndpoints(v string, role Role) ([]discovered, error) {
	var out []discovered
	for _, e := range strings.Split(v, ",") {
		e = strings.TrimSpace(e)
		switch {
		case e == "":
			continue
		case strings.HasPrefix(e, "grpc://"):
			out = append(out, discovered{role: role, grpc: strings.TrimPrefix(e, "grpc://")})
		case strings.HasPrefix(e, "http://"), strings.HasPrefix(e, "https://"):
			out = append(out, discovered{role: role, http: strings.TrimRight(e, "/")})
		case strings.Contains(e, "://"):
			return nil, fmt.Errorf("--%s %q: want http://host:port or grpc://host:port", role, e)
		default:
			out = append(out, discovered{role: role, http: "http://" + e})
		}
	}
	return out, nil
}

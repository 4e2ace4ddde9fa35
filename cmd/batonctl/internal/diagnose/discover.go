package diagnose

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
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
	// admin is its admin listener's base URL, where /debug/requests is
	// served ("" when unknown).
	admin string
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
			d.http = baseURL(d.http)
			d.admin = baseURL(str(obj, "admin_addr", "admin_address", "admin_url", "admin"))
			if isLoopback(d.admin) && !isLoopback(d.http) && !isLoopback("//"+d.grpc) {
				d.admin = "" // a remote worker's loopback admin: only its own host reaches it
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

// isLoopback reports whether the URL's host is a loopback address or
// localhost.
func isLoopback(rawURL string) bool {
	u, err := url.Parse(rawURL)
	if err != nil || u.Hostname() == "" {
		return false
	}
	if u.Hostname() == "localhost" {
		return true
	}
	ip := net.ParseIP(u.Hostname())
	return ip != nil && ip.IsLoopback()
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

// baseURL is addr as an HTTP base URL: a bare host:port gets http://, a
// trailing slash goes ("" stays "").
func baseURL(addr string) string {
	addr = strings.TrimRight(strings.TrimSpace(addr), "/")
	if addr != "" && !strings.Contains(addr, "://") {
		addr = "http://" + addr
	}
	return addr
}

// splitList is a comma-separated flag's non-empty entries.
func splitList(v string) []string {
	var out []string
	for _, e := range strings.Split(v, ",") {
		if e = strings.TrimSpace(e); e != "" {
			out = append(out, e)
		}
	}
	return out
}

// parseEndpoints reads --prefill/--decode: comma-separated HTTP base URLs
// (a bare host:port is taken as HTTP), or grpc://host:port for a worker to
// read over gRPC; admins (--prefill-admin/--decode-admin), when given, are
// their admin base URLs in the same order.
func parseEndpoints(v, admins string, role Role) ([]discovered, error) {
	out, err := parseWorkerURLs(v, role)
	if err != nil || admins == "" {
		return out, err
	}
	as := splitList(admins)
	if len(as) != len(out) {
		return nil, fmt.Errorf("--%s-admin: %d addresses for %d --%s workers", role, len(as), len(out), role)
	}
	for i, a := range as {
		if strings.Contains(a, "://") && !strings.HasPrefix(a, "http://") && !strings.HasPrefix(a, "https://") {
			return nil, fmt.Errorf("--%s-admin %q: want http://host:port", role, a)
		}
		out[i].admin = baseURL(a)
	}
	return out, nil
}

// adoptAdmins gives each worker without an admin URL the one the router
// reports for the worker with the same HTTP (or gRPC) address.
func adoptAdmins(workers, known []discovered) {
	for i, w := range workers {
		if w.admin != "" {
			continue
		}
		for _, k := range known {
			if k.admin != "" && k.role == w.role && ((w.http != "" && k.http == w.http) || (w.grpc != "" && k.grpc == w.grpc)) {
				workers[i].admin = k.admin
				break
			}
		}
	}
}

// unreadLists notes the services read over HTTP whose in-flight requests
// could not be read in any sample though the service answered: their
// admin listener was not found.
func unreadLists(services []ServiceObs) []string {
	var notes []string
	for _, s := range services {
		if s.Service.HTTP == "" {
			continue
		}
		answered, read := false, false
		for _, smp := range s.Samples {
			answered = answered || smp.Err == ""
			read = read || smp.RequestsRead
		}
		if !answered || read {
			continue
		}
		where := "its HTTP port"
		if s.Service.Admin != "" {
			where = s.Service.Admin
		}
		flagName := "--" + string(s.Service.Role) + "-admin"
		if s.Service.Role == RoleRouter {
			flagName = "--router-admin"
		}
		notes = append(notes, fmt.Sprintf("%s: in-flight requests not read at %s (/debug/requests is on the admin listener, --admin-addr: pass %s)",
			s.Service.Name, where, flagName))
	}
	return notes
}

// parseWorkerURLs parses one --prefill/--decode list.
func parseWorkerURLs(v string, role Role) ([]discovered, error) {
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

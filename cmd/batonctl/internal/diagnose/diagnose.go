// Package diagnose implements `batonctl diagnose`: it finds where requests
// are stuck in a running Baton deployment. It samples every service's gauges
// a few times, reads their in-flight request lists and readiness, sends one
// traced probe request with a deadline through the router and follows it,
// then prints a verdict that names the service, the stage and the stuck
// requests with their trace ids. The verdict is a pure function (Analyze)
// of what was collected.
package diagnose

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/baton-serving/baton/cmd/batonctl/internal/loopback"
	"github.com/baton-serving/baton/svckit/tlsconf"
)

// Summary is the one-line description of the command.
const Summary = "find where requests are stuck: sample every service, probe, name the stage"

// ExitUsage is the exit code for bad flags; 0, 1 and 2 are the verdicts.
const ExitUsage = 3

// defaultRouterAdminPort is router-svc's default --admin-addr port.
const defaultRouterAdminPort = "8086"

const help = `Usage: batonctl diagnose [--router URL] [flags]

Samples every service's metrics, readiness and in-flight requests several
times, sends one traced probe request with a deadline through the router,
and prints a verdict naming the service, the stage and the stuck requests
with their trace ids.

Workers are discovered from the router (GET /debug/workers) unless given
with --prefill/--decode: comma-separated HTTP base URLs of the workers
(http://host:port), or grpc://host:port for a worker whose HTTP port is not
reachable (then read through WorkerService and gRPC health, without metrics).
A worker serves /debug/requests on its admin listener (--admin-addr), not
its HTTP port: give those with --prefill-admin/--decode-admin (one per
worker, in the same order), or let diagnose find them in the router's
/debug/workers, which reports each worker's admin address.

Exit code: 0 healthy, 1 degraded (requests are served but something is
wrong), 2 wedged (a request sent now would not be served), 3 bad usage.

Flags:`

type options struct {
	router, prefill, decode string
	// prefillAdmin and decodeAdmin are the workers' admin base URLs, one
	// per --prefill/--decode entry.
	prefillAdmin, decodeAdmin string
	routerAdmin               string
	samples                   int
	interval, timeout         time.Duration
	stuckAfter                time.Duration
	probe                     bool
	probeTimeout              time.Duration
	probePrompt               string
	probeTokens               int
	apiKey                    string
	asJSON                    bool
	// tls are the certificate files for reading workers over gRPC when
	// they serve mutual TLS (--tls-cert, --tls-key, --tls-ca).
	tls tlsconf.Files
}

func (o *options) addFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.router, "router", "", "router HTTP base URL (default http://"+loopback.RouterHTTP+", batonctl up's router, unless --prefill or --decode is given)")
	fs.StringVar(&o.routerAdmin, "router-admin", "", "router admin base URL, where /debug/workers and /debug/requests are served (default: --router's host, port 8086, router-svc's default --admin-addr)")
	fs.StringVar(&o.prefill, "prefill", "", "prefill workers: comma-separated http://host:port (or grpc://host:port); default: ask the router")
	fs.StringVar(&o.decode, "decode", "", "decode workers: comma-separated http://host:port (or grpc://host:port); default: ask the router")
	fs.StringVar(&o.prefillAdmin, "prefill-admin", "", "the --prefill workers' admin base URLs (their --admin-addr, where /debug/requests is served), comma-separated in --prefill's order; default: as the router's /debug/workers reports them")
	fs.StringVar(&o.decodeAdmin, "decode-admin", "", "the --decode workers' admin base URLs (their --admin-addr, where /debug/requests is served), comma-separated in --decode's order; default: as the router's /debug/workers reports them")
	fs.IntVar(&o.samples, "samples", 5, "readings of every service")
	fs.DurationVar(&o.interval, "interval", time.Second, "time between readings")
	fs.DurationVar(&o.timeout, "timeout", 2*time.Second, "limit on one reading of one service")
	fs.DurationVar(&o.stuckAfter, "stuck-after", 5*time.Second, "a request without progress for this long is stuck")
	fs.BoolVar(&o.probe, "probe", true, "send a probe request through the router")
	fs.DurationVar(&o.probeTimeout, "probe-timeout", 10*time.Second, "the probe's deadline")
	fs.StringVar(&o.probePrompt, "probe-prompt", "Once upon a time", "the probe's prompt")
	fs.IntVar(&o.probeTokens, "probe-tokens", 8, "tokens the probe asks for")
	fs.StringVar(&o.apiKey, "api-key", os.Getenv("BATON_API_KEY"), "API key for the router, when it requires one (env BATON_API_KEY)")
	fs.BoolVar(&o.asJSON, "json", false, "print the verdict as one JSON object")
	fs.StringVar(&o.tls.Cert, "tls-cert", os.Getenv("BATON_TLS_CERT"), "certificate (PEM) for reading grpc:// workers that serve mutual TLS; a router-role certificate, as `batonctl certs` writes (env BATON_TLS_CERT)")
	fs.StringVar(&o.tls.Key, "tls-key", os.Getenv("BATON_TLS_KEY"), "the --tls-cert's private key (PEM) (env BATON_TLS_KEY)")
	fs.StringVar(&o.tls.CA, "tls-ca", os.Getenv("BATON_TLS_CA"), "CA certificate (PEM) the workers' certificates are checked against (env BATON_TLS_CA)")
}

func (o *options) validate() error {
	switch {
	case o.samples < 1:
		return fmt.Errorf("--samples: %d, want ≥ 1", o.samples)
	case o.interval <= 0 || o.timeout <= 0 || o.stuckAfter <= 0 || o.probeTimeout <= 0:
		return errors.New("--interval, --timeout, --stuck-after and --probe-timeout must be positive")
	case o.probeTokens < 1:
		return fmt.Errorf("--probe-tokens: %d, want ≥ 1", o.probeTokens)
	}
	if err := o.tls.Validate(); err != nil {
		return err
	}
	if o.router == "" && o.prefill == "" && o.decode == "" {
		o.router = loopback.RouterHTTP
	}
	if o.router != "" && !strings.Contains(o.router, "://") {
		o.router = "http://" + o.router
	}
	o.router = strings.TrimRight(o.router, "/")
	if o.routerAdmin == "" && o.router != "" {
		host := "127.0.0.1"
		if u, err := url.Parse(o.router); err == nil && u.Hostname() != "" {
			host = u.Hostname()
		}
		o.routerAdmin = "http://" + net.JoinHostPort(host, defaultRouterAdminPort)
	}
	if o.routerAdmin != "" && !strings.Contains(o.routerAdmin, "://") {
		o.routerAdmin = "http://" + o.routerAdmin
	}
	o.routerAdmin = strings.TrimRight(o.routerAdmin, "/")
	return nil
}

// Run is `batonctl diagnose`; it returns the exit code.
func Run(ctx context.Context, stdout, stderr io.Writer, args []string) int {
	fs := flag.NewFlagSet("batonctl diagnose", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, help)
		fs.PrintDefaults()
	}
	var o options
	o.addFlags(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return ExitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "batonctl diagnose: unexpected argument %q\n", fs.Arg(0))
		return ExitUsage
	}
	if err := o.validate(); err != nil {
		fmt.Fprintln(stderr, "batonctl diagnose:", err)
		return ExitUsage
	}
	obs, err := collect(ctx, o)
	if err != nil {
		fmt.Fprintln(stderr, "batonctl diagnose:", err)
		return ExitUsage
	}
	v := Analyze(obs, Options{StuckAfter: o.stuckAfter})
	if o.asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(v); err != nil {
			fmt.Fprintln(stderr, "batonctl diagnose:", err)
		}
	} else {
		writeText(stdout, v)
	}
	return v.ExitCode
}

// collect finds the services, then samples them while the probe runs.
func collect(ctx context.Context, o options) (Observation, error) {
	client := &http.Client{Timeout: max(o.timeout, o.probeTimeout+2*time.Second)}
	var obs Observation
	var workers []discovered
	for _, f := range []struct {
		v, admin string
		role     Role
	}{{o.prefill, o.prefillAdmin, RolePrefill}, {o.decode, o.decodeAdmin, RoleDecode}} {
		ws, err := parseEndpoints(f.v, f.admin, f.role)
		if err != nil {
			return obs, err
		}
		workers = append(workers, ws...)
	}
	var notes []string
	switch {
	case len(workers) == 0 && o.router != "":
		dctx, cancel := context.WithTimeout(ctx, o.timeout)
		ws, err := discover(dctx, client, o.routerAdmin)
		cancel()
		if err != nil {
			notes = append(notes, fmt.Sprintf("workers not examined: %v (pass --prefill/--decode)", err))
		}
		workers = ws
	case o.routerAdmin != "" && slices.ContainsFunc(workers, func(w discovered) bool { return w.http != "" && w.admin == "" }):
		// Workers named by HTTP URL alone: their admin addresses are
		// what the router reports for them.
		dctx, cancel := context.WithTimeout(ctx, o.timeout)
		known, err := discover(dctx, client, o.routerAdmin)
		cancel()
		if err == nil {
			adoptAdmins(workers, known)
		}
	}
	var services []Service
	if o.router != "" {
		services = append(services, Service{Name: "router", Role: RoleRouter, HTTP: o.router, Admin: o.routerAdmin})
	}
	n := map[Role]int{}
	for _, role := range []Role{RolePrefill, RoleDecode} {
		for _, w := range workers {
			if w.role == role {
				services = append(services, Service{Name: fmt.Sprintf("%s-%d", role, n[role]), Role: role, HTTP: w.http, GRPC: w.grpc,
					Admin: w.admin, Quarantine: w.quarantine})
				n[role]++
			}
		}
	}
	var targets []target
	defer func() {
		for _, t := range targets {
			t.r.close()
		}
	}()
	var id *tlsconf.Identity
	if o.tls.Enabled() {
		var err error
		if id, err = tlsconf.Load(o.tls, nil); err != nil {
			return obs, err
		}
	}
	for _, s := range services {
		t, err := newTarget(s, client, id)
		if err != nil {
			return obs, err
		}
		targets = append(targets, t)
	}

	probed := make(chan ProbeResult, 1)
	if o.probe && o.router != "" {
		go func() {
			probed <- runProbe(ctx, probeSpec{router: o.router, client: client, prompt: o.probePrompt,
				maxTokens: o.probeTokens, timeout: o.probeTimeout, apiKey: o.apiKey, pollEvery: 100 * time.Millisecond}, targets)
		}()
	} else {
		close(probed)
	}
	obs.Services = sample(ctx, targets, o.samples, o.interval, o.timeout)
	if p, ok := <-probed; ok {
		obs.Probe = &p
	}
	obs.Discovery = strings.Join(append(notes, unreadLists(obs.Services)...), "; ")
	return obs, nil
}

// writeText prints the verdict for people: the summary line, then what was
// found per service and the probe.
func writeText(w io.Writer, v Verdict) {
	fmt.Fprintf(w, "%s: %s\n", strings.ToUpper(string(v.Status)), v.Summary)
	for _, n := range v.Notes {
		fmt.Fprintf(w, "note: %s\n", n)
	}
	fmt.Fprintln(w)
	for _, s := range v.Services {
		where := s.HTTP
		if where == "" {
			where = "grpc://" + s.GRPC
		}
		state := "healthy"
		switch {
		case s.Down:
			state = "DOWN"
		case s.Stalled:
			state = "STALLED at " + s.Stage
		case !s.Healthy:
			state = "DEGRADED"
		}
		fmt.Fprintf(w, "%-10s %-28s %s\n", s.Name, where, state)
		for _, p := range s.Problems {
			fmt.Fprintf(w, "           %s\n", p)
		}
		for i, r := range s.Stuck {
			if i == 10 {
				fmt.Fprintf(w, "           ... and %d more stuck requests (--json lists all)\n", len(s.Stuck)-10)
				break
			}
			trace := r.TraceID
			if trace == "" {
				trace = "-"
			}
			fmt.Fprintf(w, "           stuck %s  %s (%s)  age %.1f s  no progress %.1f s  trace %s\n",
				r.ID, r.State, r.Stage, r.AgeSeconds, r.SinceProgress, trace)
		}
	}
	if p := v.Probe; p != nil {
		fmt.Fprintf(w, "%-10s %s trace %s: %s\n", "probe", p.RequestID, p.TraceID, probeClause(p))
	}
}

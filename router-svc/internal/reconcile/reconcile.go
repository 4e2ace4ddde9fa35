// Package reconcile compares the router's in-flight requests with the
// workers' own lists (WorkerService.ListRequests) and reports the
// disagreements: orphans. A request a worker holds that the router does not
// have in flight on that worker is an orphan on the worker (role prefill or
// decode) — a leak the router can no longer end. A request the router has in
// flight on a decode worker that does not hold it is an orphan at the router
// (role router) — a client waiting for a request nobody is computing. A
// disagreement becomes an orphan only after it has lasted the grace period,
// seen in one round after another: requests start and end on both sides a
// moment apart, and one round's lists are not taken at one instant.
//
// Each orphan is counted once in baton:router_orphans_total{role} and logged
// once with its id, worker, state and trace id when it is found, and once
// more when it is gone; baton_router_orphans{role} is the last round's count. Findings (the last round's view) feed the router's
// /debug output.
//
// Reconciliation never blocks routing: it reads the router's requests
// through the Router function (which must only copy a table under a short
// lock), calls each worker with its own deadline, and skips, for that
// round, a worker it cannot reach, keeping what it had found there.
//
// # Wiring (router)
//
//	rec, err := reconcile.New(reconcile.Options{
//		Router: func() []reconcile.Entry {
//			es := ... one Entry per in-flight client request: id, and its current attempt's prefill and decode addresses ...
//			for _, c := range prober.InFlight() { // the canaries are requests too
//				es = append(es, reconcile.Entry{ID: c.ID, Prefill: c.Pair.Prefill, Decode: c.Pair.Decode})
//			}
//			return es
//		},
//		Workers: func() []reconcile.Worker { ... Addr, Role and Conn of every configured worker ... },
//		Logger:   srv.Logger,
//		Registry: srv.Registry,
//	})
//	go rec.Run(ctx)
//	// /debug/workers: rec.Findings()
package reconcile

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
)

// Roles of orphans, the values of the role label.
const (
	RolePrefill = "prefill" // on a prefill worker, unknown to the router there
	RoleDecode  = "decode"  // on a decode worker, unknown to the router there
	RoleRouter  = "router"  // at the router, absent from its decode worker
)

// Entry is one request the router has in flight.
type Entry struct {
	ID string
	// Decode is the decode worker's address; "" while the request is not
	// routed yet (then any worker may hold it). Prefill is the prefill
	// worker's address, "" or "local" in colocated mode.
	Prefill, Decode string
}

// Worker is a worker to reconcile with.
type Worker struct {
	Addr string
	Role batonv1.WorkerRole
	Conn grpc.ClientConnInterface
}

// Options configure a Reconciler.
type Options struct {
	// Router lists the router's in-flight requests (required).
	Router func() []Entry
	// Workers lists the workers (required).
	Workers func() []Worker
	// Interval between rounds (default 10 s).
	Interval time.Duration
	// Grace is how long a disagreement must last to be an orphan (default
	// 10 s). Keep it above the release bound and the longest canary.
	Grace time.Duration
	// Timeout bounds each ListRequests call (default 2 s).
	Timeout time.Duration
	// Logger gets one line per orphan found and gone (default: none).
	Logger *slog.Logger
	// Registry gets the metrics (nil: none).
	Registry prometheus.Registerer
}

// Orphan is a request on one side only, for longer than the grace period.
type Orphan struct {
	Role    string `json:"role"`
	Worker  string `json:"worker"`
	ID      string `json:"request_id"`
	State   string `json:"state,omitempty"`    // the worker's state (worker roles)
	TraceID string `json:"trace_id,omitempty"` // the worker's (worker roles)
	// AgeSeconds is the request's age at the worker (worker roles).
	AgeSeconds float64 `json:"age_seconds,omitempty"`
	// UnmatchedSeconds is how long the disagreement has lasted.
	UnmatchedSeconds float64 `json:"unmatched_seconds"`
}

// WorkerFindings is one worker's part of a round.
type WorkerFindings struct {
	Addr     string `json:"addr"`
	Role     string `json:"role"`
	Requests int    `json:"requests"`        // the worker's in-flight requests
	Error    string `json:"error,omitempty"` // why it could not be listed
}

// Findings are the result of one round.
type Findings struct {
	At             time.Time        `json:"at,omitzero"`
	RouterRequests int              `json:"router_requests"`
	Workers        []WorkerFindings `json:"workers"`
	// Orphans are the disagreements older than the grace period, oldest
	// first; Suspects counts the younger ones.
	Orphans  []Orphan `json:"orphans"`
	Suspects int      `json:"suspects"`
}

// key names one disagreement: a request id on one worker, seen from one
// side.
type key struct {
	role, worker, id string
}

type suspect struct {
	first    time.Time
	reported bool
	orphan   Orphan
}

// Reconciler runs the rounds. Its methods are safe for concurrent use.
type Reconciler struct {
	o   Options
	log *slog.Logger

	round    sync.Mutex // one round at a time
	suspects map[key]*suspect

	mu   sync.Mutex
	last Findings

	orphans *prometheus.CounterVec
	current *prometheus.GaugeVec
}

// New checks o, fills in its defaults and registers the metrics.
func New(o Options) (*Reconciler, error) {
	if o.Router == nil || o.Workers == nil {
		return nil, errors.New("reconcile: Options.Router and Options.Workers are required")
	}
	if o.Interval == 0 {
		o.Interval = 10 * time.Second
	}
	if o.Grace == 0 {
		o.Grace = 10 * time.Second
	}
	if o.Timeout == 0 {
		o.Timeout = 2 * time.Second
	}
	if o.Interval < 0 || o.Grace < 0 || o.Timeout < 0 {
		return nil, fmt.Errorf("reconcile: Interval %v, Grace %v and Timeout %v must be positive", o.Interval, o.Grace, o.Timeout)
	}
	r := &Reconciler{o: o, log: o.Logger, suspects: map[key]*suspect{}}
	if r.log == nil {
		r.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	r.orphans = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "baton:router_orphans_total",
		Help: "Requests found on one side only for longer than the grace period, by where they were: on a prefill or decode worker but not in flight there at the router, or at the router but not on its decode worker."},
		[]string{"role"})
	r.current = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "baton_router_orphans",
		Help: "Orphans present at the last reconciliation, by role."}, []string{"role"})
	for _, role := range []string{RolePrefill, RoleDecode, RoleRouter} {
		r.orphans.WithLabelValues(role)
		r.current.WithLabelValues(role)
	}
	if o.Registry != nil {
		for _, c := range []prometheus.Collector{r.orphans, r.current} {
			if err := o.Registry.Register(c); err != nil {
				return nil, fmt.Errorf("reconcile: metrics: %w", err)
			}
		}
	}
	return r, nil
}

// Run reconciles at once and then every Interval until ctx ends; it returns
// when ctx has ended and the round in progress has stopped.
func (r *Reconciler) Run(ctx context.Context) {
	t := time.NewTicker(r.o.Interval)
	defer t.Stop()
	for {
		r.Reconcile(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Findings returns the last round's findings.
func (r *Reconciler) Findings() Findings {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.last
}

// listing is one worker's ListRequests answer.
type listing struct {
	w    Worker
	reqs []*batonv1.RequestInfo
	err  error
}

// Reconcile runs one round and returns its findings. A round that ctx ends
// midway changes nothing.
func (r *Reconciler) Reconcile(ctx context.Context) Findings {
	r.round.Lock()
	defer r.round.Unlock()
	entries := r.o.Router()
	workers := r.o.Workers()
	lists := make([]listing, len(workers))
	var wg sync.WaitGroup
	for i, w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lctx, cancel := context.WithTimeout(ctx, r.o.Timeout)
			defer cancel()
			resp, err := batonv1.NewWorkerServiceClient(w.Conn).ListRequests(lctx, &batonv1.WorkerServiceListRequestsRequest{})
			lists[i] = listing{w: w, reqs: resp.GetRequests(), err: err}
		}()
	}
	wg.Wait()
	if ctx.Err() != nil {
		return r.Findings()
	}
	now := time.Now()

	byID := make(map[string]Entry, len(entries))
	for _, e := range entries {
		byID[e.ID] = e
	}
	// knownOn reports whether the router has request id in flight on the
	// worker at addr.
	knownOn := func(id, addr string) bool {
		e, ok := byID[id]
		return ok && (e.Decode == "" || e.Decode == addr || e.Prefill == addr)
	}
	f := Findings{At: now, RouterRequests: len(entries)}
	seen := map[key]bool{}       // disagreements this round
	reached := map[string]bool{} // workers listed this round
	configured := map[string]bool{}
	holds := map[string]map[string]bool{} // decode address -> ids it holds
	observe := func(k key, o Orphan) {
		seen[k] = true
		s := r.suspects[k]
		if s == nil {
			s = &suspect{first: now}
			r.suspects[k] = s
		}
		s.orphan = o
	}
	for _, l := range lists {
		role := roleName(l.w.Role)
		configured[l.w.Addr] = true
		wf := WorkerFindings{Addr: l.w.Addr, Role: role, Requests: len(l.reqs)}
		if l.err != nil {
			wf.Error = l.err.Error()
			f.Workers = append(f.Workers, wf)
			r.log.Debug("reconcile: worker not listed", "worker", l.w.Addr, "role", role, "err", l.err)
			continue
		}
		f.Workers = append(f.Workers, wf)
		reached[l.w.Addr] = true
		ids := make(map[string]bool, len(l.reqs))
		for _, q := range l.reqs {
			ids[q.GetRequestId()] = true
			if knownOn(q.GetRequestId(), l.w.Addr) {
				continue
			}
			observe(key{role, l.w.Addr, q.GetRequestId()}, Orphan{Role: role, Worker: l.w.Addr, ID: q.GetRequestId(),
				State: stateName(q.GetState()), TraceID: q.GetTraceId(), AgeSeconds: q.GetAgeSeconds()})
		}
		if l.w.Role == batonv1.WorkerRole_WORKER_ROLE_DECODE {
			holds[l.w.Addr] = ids
		}
	}
	for _, e := range entries {
		if ids, ok := holds[e.Decode]; ok && !ids[e.ID] {
			observe(key{RoleRouter, e.Decode, e.ID}, Orphan{Role: RoleRouter, Worker: e.Decode, ID: e.ID})
		}
	}

	// Disagreements not seen again are over — unless their worker could
	// not be listed this round, which says nothing about them.
	for k, s := range r.suspects {
		switch {
		case seen[k]:
			if now.Sub(s.first) < r.o.Grace {
				f.Suspects++
				continue
			}
			s.orphan.UnmatchedSeconds = now.Sub(s.first).Seconds()
			f.Orphans = append(f.Orphans, s.orphan)
			if !s.reported {
				s.reported = true
				r.orphans.WithLabelValues(k.role).Inc()
				r.log.Warn("reconcile: orphan request", "role", k.role, "worker", k.worker, "request_id", k.id,
					"state", s.orphan.State, "age", secs(s.orphan.AgeSeconds), "unmatched_for", secs(s.orphan.UnmatchedSeconds),
					"trace_id", s.orphan.TraceID, "why", why(k.role))
			}
		case configured[k.worker] && !reached[k.worker]:
			// Unreachable this round: keep it as it was.
		default:
			if s.reported {
				r.log.Info("reconcile: orphan request gone", "role", k.role, "worker", k.worker, "request_id", k.id,
					"unmatched_for", now.Sub(s.first).Round(time.Millisecond).String())
			}
			delete(r.suspects, k)
		}
	}
	slices.SortFunc(f.Orphans, func(a, b Orphan) int {
		return cmp.Or(cmp.Compare(b.UnmatchedSeconds, a.UnmatchedSeconds), cmp.Compare(a.Worker, b.Worker), cmp.Compare(a.ID, b.ID))
	})
	counts := map[string]int{}
	for _, o := range f.Orphans {
		counts[o.Role]++
	}
	for _, role := range []string{RolePrefill, RoleDecode, RoleRouter} {
		r.current.WithLabelValues(role).Set(float64(counts[role]))
	}
	r.mu.Lock()
	r.last = f
	r.mu.Unlock()
	return f
}

func why(role string) string {
	if role == RoleRouter {
		return "the router has the request in flight on this decode worker, which does not hold it"
	}
	return "the worker holds the request, which the router does not have in flight on it"
}

func secs(s float64) string {
	return (time.Duration(s * float64(time.Second))).Round(time.Millisecond).String()
}

func roleName(r batonv1.WorkerRole) string {
	switch r {
	case batonv1.WorkerRole_WORKER_ROLE_PREFILL:
		return RolePrefill
	case batonv1.WorkerRole_WORKER_ROLE_DECODE:
		return RoleDecode
	}
	return "unknown"
}

// stateName is a request state without the enum's prefix: "running".
func stateName(s batonv1.RequestState) string {
	return strings.ToLower(strings.TrimPrefix(s.String(), "REQUEST_STATE_"))
}

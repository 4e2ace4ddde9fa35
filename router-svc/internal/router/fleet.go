package router

// The router's fleet: discovery and watching of the workers (package
// workers), the canary through each (prefill, decode) pair (package
// canary), and their view at /debug/workers.

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/baton-serving/baton/engine/tokenizer"
	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"github.com/baton-serving/baton/router-svc/internal/canary"
	"github.com/baton-serving/baton/router-svc/internal/reconcile"
	"github.com/baton-serving/baton/router-svc/internal/workers"
	"github.com/baton-serving/baton/svckit"
	"github.com/baton-serving/baton/svckit/apiconv"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// fleetFlags are the router's discovery, routing-limit and canary flags.
type fleetFlags struct {
	resolveInterval time.Duration
	dnsServer       string
	maxInflight     int
	canaryInterval  time.Duration
	canaryTimeout   time.Duration
}

// canaryPrompt is the canary's prompt: a few tokens, so that at least one
// KV page moves from prefill to decode.
const canaryPrompt = "Once upon a time"

func (f *fleetFlags) addFlags(fs *flag.FlagSet) {
	fs.DurationVar(&f.resolveInterval, "resolve-interval", 5*time.Second, "how often dns:/// worker targets are resolved again; workers that appear are checked and watched, workers that vanish are drained")
	fs.StringVar(&f.dnsServer, "dns-server", "", "DNS server (host:port) for dns:/// worker targets (default: the system's resolver)")
	fs.IntVar(&f.maxInflight, "max-inflight-per-worker", 0, "requests the router runs at once on one worker; when every candidate worker is full a request is refused with RESOURCE_EXHAUSTED / HTTP 429 (0: no limit)")
	fs.DurationVar(&f.canaryInterval, "canary-interval", 15*time.Second, "how often a tiny real request (a real KV transfer) is sent through each passing (prefill, decode) pair; failing pairs are routed around and probed again sooner, and readiness needs one passing pair (0: no canary)")
	fs.DurationVar(&f.canaryTimeout, "canary-timeout", 5*time.Second, "deadline of one canary request; a pair slower than this is quarantined")
}

func (f *fleetFlags) validate() error {
	switch {
	case f.resolveInterval < 100*time.Millisecond:
		return fmt.Errorf("--resolve-interval: %v, want ≥ 100ms", f.resolveInterval)
	case f.maxInflight < 0:
		return fmt.Errorf("--max-inflight-per-worker: %d, want ≥ 0", f.maxInflight)
	case f.canaryInterval < 0:
		return fmt.Errorf("--canary-interval: %v, want ≥ 0 (0 turns the canary off)", f.canaryInterval)
	case f.canaryInterval > 0 && f.canaryInterval < 100*time.Millisecond:
		return fmt.Errorf("--canary-interval: %v, want 0 or ≥ 100ms", f.canaryInterval)
	case f.canaryTimeout <= 0:
		return fmt.Errorf("--canary-timeout: %v, want > 0", f.canaryTimeout)
	}
	if f.dnsServer != "" {
		if err := svckit.ValidateAddr(f.dnsServer); err != nil {
			return fmt.Errorf("--dns-server: %w", err)
		}
	}
	return nil
}

// startFleet creates the worker sets, the pairer and the canary, and starts
// their goroutines; Close stops them.
func (s *Service) startFleet(srv *svckit.Server) error {
	dial := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials()), srv.Tracing.DialOption()}
	expect := workers.Identity{Fingerprint: s.fingerprint, Layers: s.cfg.Layers, KVHeads: s.cfg.KVHeads, HeadDim: s.cfg.HeadDim}
	newSet := func(role batonv1.WorkerRole, src workers.Source) *workers.Set {
		return workers.NewSet(workers.Config{Role: role, Source: src, Expect: expect, LoadInterval: s.loadInterval,
			ResolveInterval: s.fleet.resolveInterval, Logger: s.logger, DialOptions: dial})
	}
	if s.prefillSrc != nil {
		s.prefills = newSet(batonv1.WorkerRole_WORKER_ROLE_PREFILL, s.prefillSrc)
	}
	s.decodes = newSet(batonv1.WorkerRole_WORKER_ROLE_DECODE, s.decodeSrc)
	s.pairer = &workers.Pairer{Prefill: s.prefills, Decode: s.decodes,
		PrefillPolicy: s.prefillPolicy, DecodePolicy: s.decodePolicy, MaxInflight: s.fleet.maxInflight}

	if s.fleet.canaryInterval > 0 {
		var err error
		if s.prober, err = canary.NewProber(canary.ProberOptions{
			Conn:   s.decodeConn,
			Prompt: apiconv.WireIDs(s.tok.Encode(canaryPrompt, tokenizer.EncodeOptions{AddSpecial: true})),
			Tracer: srv.Tracing.TracerProvider(),
		}); err != nil {
			return err
		}
		if s.canary, err = canary.New(canary.Options{Probe: s.prober.Probe, Interval: s.fleet.canaryInterval,
			Timeout: s.fleet.canaryTimeout, Steps: s.workerSteps, Logger: s.logger, Registry: srv.Registry}); err != nil {
			return err
		}
		s.pairer.Gate = canaryGate{s.canary}
	}
	rec, err := reconcile.New(reconcile.Options{Router: s.reconcileEntries, Workers: s.reconcileWorkers,
		Logger: s.logger, Registry: srv.Registry})
	if err != nil {
		return err
	}
	s.reconciler = rec

	ctx, stop := context.WithCancel(context.Background())
	s.stopWatch = stop
	for _, set := range []*workers.Set{s.prefills, s.decodes} {
		if set != nil {
			s.watching.Go(func() { set.Run(ctx) })
		}
	}
	if s.canary != nil {
		s.watching.Go(func() { s.canary.Run(ctx, s.canaryPairs) })
	}
	s.watching.Go(func() { s.reconciler.Run(ctx) })

	srv.AddReadinessCheck("workers", func(context.Context) error {
		if s.prefills != nil && len(s.prefills.Ready()) == 0 {
			return fmt.Errorf("no ready prefill worker (%s)", workers.Describe(s.prefills))
		}
		if len(s.decodes.Ready()) == 0 {
			return fmt.Errorf("no ready decode worker (%s)", workers.Describe(s.decodes))
		}
		return nil
	})
	if s.canary != nil {
		srv.AddReadinessCheck("canary", s.canary.Check)
	}
	return nil
}

// decodeConn is the connection to the decode worker at addr, for canaries.
func (s *Service) decodeConn(addr string) (grpc.ClientConnInterface, error) {
	for _, w := range s.decodes.Workers() {
		if w.Addr == addr {
			return w.Conn(), nil
		}
	}
	return nil, errors.New("no longer a decode worker of this router")
}

// canaryPairs is every pair the router could route to now: ready workers
// whose KV layouts agree. A pair whose probe fails stays in the list (and so
// quarantined) while its workers report ready.
func (s *Service) canaryPairs() []canary.Pair {
	decodes := s.decodes.Ready()
	if s.prefills == nil {
		out := make([]canary.Pair, len(decodes))
		for i, d := range decodes {
			out[i] = canary.Pair{Decode: d.Addr}
		}
		return out
	}
	prefills := s.prefills.Ready()
	out := make([]canary.Pair, 0, len(prefills)*len(decodes))
	for _, d := range decodes {
		for _, p := range prefills {
			if workers.LayoutCompatible(p.Info(), d.Info()) {
				out = append(out, canary.Pair{Prefill: p.Addr, Decode: d.Addr})
			}
		}
	}
	return out
}

// reconcileEntries lists the router's in-flight requests, canaries
// included, for reconciliation with the workers' lists.
func (s *Service) reconcileEntries() []reconcile.Entry {
	out := s.inflight.entries()
	if s.prober != nil {
		for _, c := range s.prober.InFlight() {
			out = append(out, reconcile.Entry{ID: c.ID, Prefill: c.Pair.Prefill, Decode: c.Pair.Decode})
		}
	}
	return out
}

// reconcileWorkers lists every worker, those draining included.
func (s *Service) reconcileWorkers() []reconcile.Worker {
	var out []reconcile.Worker
	for _, set := range []*workers.Set{s.prefills, s.decodes} {
		if set == nil {
			continue
		}
		for _, w := range append(slices.Clone(set.Workers()), set.Draining()...) {
			out = append(out, reconcile.Worker{Addr: w.Addr, Role: w.Role, Conn: w.Conn()})
		}
	}
	return out
}

// canaryGate lets the pairer ask the tracker about a pair.
type canaryGate struct{ t *canary.Tracker }

func (g canaryGate) Allowed(prefill, decode string) bool {
	return g.t.Allowed(canary.Pair{Prefill: prefill, Decode: decode})
}

// debugWorkers is the body of /debug/workers.
type debugWorkers struct {
	Mode           string       `json:"mode"` // "pd" or "colocated"
	PrefillPolicy  string       `json:"prefill_policy,omitempty"`
	DecodePolicy   string       `json:"decode_policy"`
	MaxInflight    int          `json:"max_inflight_per_worker"`
	Canary         *debugCanary `json:"canary,omitempty"`
	Prefill        *debugSet    `json:"prefill,omitempty"`
	Decode         *debugSet    `json:"decode"`
	RouterInflight int          `json:"router_inflight"`
	// Reconcile is the last comparison of the router's in-flight requests
	// with the workers' own lists.
	Reconcile *reconcile.Findings `json:"reconcile,omitempty"`
}

type debugCanary struct {
	IntervalSeconds float64             `json:"interval_seconds"`
	TimeoutSeconds  float64             `json:"timeout_seconds"`
	PassingPairs    int                 `json:"passing_pairs"`
	Pairs           []canary.PairStatus `json:"pairs"`
}

type debugSet struct {
	Source  string        `json:"source"`
	Workers []debugWorker `json:"workers"`
}

type debugWorker struct {
	Address  string `json:"address"`
	Role     string `json:"role"`
	Ready    bool   `json:"ready"`    // its last report, fresh, says ready
	Routable bool   `json:"routable"` // ready, in the set, and (canary on) in a passing pair
	// Quarantined: the canary on, no pair of this worker passes and one
	// has failed; QuarantineReason is that pair's last error.
	Quarantined      bool   `json:"quarantined"`
	QuarantineReason string `json:"quarantine_reason,omitempty"`
	// Excluded is why its Info was refused (role, model or KV layout).
	Excluded       string              `json:"excluded,omitempty"`
	Draining       bool                `json:"draining,omitempty"` // left the set; requests on it finishing
	Load           *debugLoad          `json:"load,omitempty"`
	LoadAgeSeconds float64             `json:"load_age_seconds"`
	Inflight       int64               `json:"inflight"`
	RoutedTotal    uint64              `json:"routed_total"`
	LastError      string              `json:"last_error,omitempty"`
	Fingerprint    string              `json:"model_fingerprint,omitempty"`
	KVLayout       string              `json:"kv_layout,omitempty"`
	Version        string              `json:"version,omitempty"`
	Canary         []canary.PairStatus `json:"canary,omitempty"` // its pairs' last results
}

type debugLoad struct {
	Ready                   bool    `json:"ready"`
	QueuedRequests          uint32  `json:"queued_requests"`
	RunningRequests         uint32  `json:"running_requests"`
	TransferringRequests    uint32  `json:"transferring_requests"`
	PagesUsed               uint32  `json:"pages_used"`
	PagesTotal              uint32  `json:"pages_total"`
	TokensPerSecond         float64 `json:"tokens_per_second"`
	OldestRequestAgeSeconds float64 `json:"oldest_request_age_seconds"`
}

func (s *Service) serveDebugWorkers(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(s.debugWorkers(time.Now()))
}

func (s *Service) debugWorkers(now time.Time) debugWorkers {
	out := debugWorkers{Mode: "colocated", DecodePolicy: s.decodePolicy.Name, MaxInflight: s.fleet.maxInflight,
		RouterInflight: s.inflight.len()}
	var pairs []canary.PairStatus
	if s.canary != nil {
		pairs = s.canary.Snapshot()
		out.Canary = &debugCanary{IntervalSeconds: s.fleet.canaryInterval.Seconds(),
			TimeoutSeconds: s.fleet.canaryTimeout.Seconds(), PassingPairs: s.canary.Passing(), Pairs: pairs}
	}
	if s.prefills != nil {
		out.Mode, out.PrefillPolicy = "pd", s.prefillPolicy.Name
		out.Prefill = s.debugSet(s.prefills, pairs, now)
	}
	out.Decode = s.debugSet(s.decodes, pairs, now)
	if s.reconciler != nil {
		f := s.reconciler.Findings()
		out.Reconcile = &f
	}
	return out
}

func (s *Service) debugSet(set *workers.Set, pairs []canary.PairStatus, now time.Time) *debugSet {
	ds := &debugSet{Source: set.Source().String(), Workers: []debugWorker{}}
	add := func(w *workers.Worker, draining bool) {
		dw := debugWorker{Address: w.Addr, Role: workers.RoleName(w.Role), Ready: set.Routable(w), Draining: draining,
			Excluded: w.Excluded(), LoadAgeSeconds: w.LoadAge(now).Seconds(), Inflight: w.Inflight(),
			RoutedTotal: w.Routed(), LastError: w.LastError()}
		if l := w.Load(); l != nil {
			dw.Load = &debugLoad{Ready: l.GetReady(), QueuedRequests: l.GetQueuedRequests(), RunningRequests: l.GetRunningRequests(),
				TransferringRequests: l.GetTransferringRequests(), PagesUsed: l.GetPagesUsed(), PagesTotal: l.GetPagesTotal(),
				TokensPerSecond: l.GetTokensPerSecond(), OldestRequestAgeSeconds: l.GetOldestRequestAgeSeconds()}
		}
		if info := w.Info(); info != nil {
			dw.Fingerprint, dw.Version = info.GetModel().GetFingerprint(), info.GetVersion()
			if l := info.GetKvLayout(); l != nil {
				dw.KVLayout = fmt.Sprintf("%v page=%d layers=%d kv_heads=%d head_dim=%d",
					l.GetDtype(), l.GetPageSizeTokens(), l.GetNumLayers(), l.GetNumKvHeads(), l.GetHeadDim())
			}
		}
		passing, failed := false, ""
		for _, p := range pairs {
			if p.Pair.Decode != w.Addr && p.Pair.Prefill != w.Addr {
				continue
			}
			dw.Canary = append(dw.Canary, p)
			switch p.State {
			case canary.StatePassing:
				passing = true
			case canary.StateQuarantined:
				if failed == "" {
					failed = p.Pair.String() + ": " + p.LastError
				}
			}
		}
		if s.canary != nil && !passing && failed != "" {
			dw.Quarantined, dw.QuarantineReason = true, failed
		}
		dw.Routable = dw.Ready && !draining && (s.canary == nil || passing)
		ds.Workers = append(ds.Workers, dw)
	}
	for _, w := range set.Workers() {
		add(w, false)
	}
	for _, w := range set.Draining() {
		add(w, true)
	}
	return ds
}

// workerSteps is the forward steps the worker at addr last reported, for
// the canary to tell an overloaded pair from a stuck one.
func (s *Service) workerSteps(addr string) (uint64, bool) {
	for _, set := range []*workers.Set{s.prefills, s.decodes} {
		if set == nil {
			continue
		}
		for _, w := range set.Workers() {
			if w.Addr == addr {
				l := w.Load()
				return l.GetSteps(), l != nil
			}
		}
	}
	return 0, false
}

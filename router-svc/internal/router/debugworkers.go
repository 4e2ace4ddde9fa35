package router

// The fleet's view at /debug/workers: the JSON body and how it is built from
// the worker sets, the canary and the reconciler.

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/baton-serving/baton/router-svc/internal/canary"
	"github.com/baton-serving/baton/router-svc/internal/reconcile"
	"github.com/baton-serving/baton/router-svc/internal/workers"
)

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
	Excluded       string     `json:"excluded,omitempty"`
	Draining       bool       `json:"draining,omitempty"` // left the set; requests on it finishing
	Load           *debugLoad `json:"load,omitempty"`
	LoadAgeSeconds float64    `json:"load_age_seconds"`
	Inflight       int64      `json:"inflight"`
	RoutedTotal    uint64     `json:"routed_total"`
	// CachePages is the size of the router's index of the worker's prefix
	// cache (0 while its load stream is down).
	CachePages  int    `json:"cache_pages"`
	LastError   string `json:"last_error,omitempty"`
	Fingerprint string `json:"model_fingerprint,omitempty"`
	KVLayout    string `json:"kv_layout,omitempty"`
	Version     string `json:"version,omitempty"`
	// Device is what the worker computes on, as its Info reports it
	// ("cpu (…)" or "cuda:N (…)"; --device).
	Device string              `json:"device,omitempty"`
	Canary []canary.PairStatus `json:"canary,omitempty"` // its pairs' last results

	// HTTPAddr and AdminAddr are the worker's HTTP listener (/metrics) and
	// admin listener (/debug/requests), as its Info reports them, so that
	// batonctl diagnose can read them.
	HTTPAddr  string `json:"http_addr,omitempty"`
	AdminAddr string `json:"admin_addr,omitempty"`
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

// reachable is a listener address a worker reported with an unspecified
// host (bound to all interfaces: "", 0.0.0.0, ::) given the host the router
// dials the worker at; other addresses are returned as they are.
func reachable(listener, workerAddr string) string {
	host, port, err := net.SplitHostPort(listener)
	if err != nil {
		return listener
	}
	if ip := net.ParseIP(host); host != "" && (ip == nil || !ip.IsUnspecified()) {
		return listener
	}
	whost, _, err := net.SplitHostPort(workerAddr)
	if err != nil || whost == "" {
		return listener
	}
	return net.JoinHostPort(whost, port)
}

func (s *Service) debugSet(set *workers.Set, pairs []canary.PairStatus, now time.Time) *debugSet {
	ds := &debugSet{Source: set.Source().String(), Workers: []debugWorker{}}
	add := func(w *workers.Worker, draining bool) {
		dw := debugWorker{Address: w.Addr, Role: workers.RoleName(w.Role), Ready: set.Routable(w), Draining: draining,
			Excluded: w.Excluded(), LoadAgeSeconds: w.LoadAge(now).Seconds(), Inflight: w.Inflight(),
			RoutedTotal: w.Routed(), CachePages: w.CachePages(), LastError: w.LastError()}
		if l := w.Load(); l != nil {
			dw.Load = &debugLoad{Ready: l.GetReady(), QueuedRequests: l.GetQueuedRequests(), RunningRequests: l.GetRunningRequests(),
				TransferringRequests: l.GetTransferringRequests(), PagesUsed: l.GetPagesUsed(), PagesTotal: l.GetPagesTotal(),
				TokensPerSecond: l.GetTokensPerSecond(), OldestRequestAgeSeconds: l.GetOldestRequestAgeSeconds()}
		}
		if info := w.Info(); info != nil {
			dw.Fingerprint, dw.Version, dw.Device = info.GetModel().GetFingerprint(), info.GetVersion(), info.GetDevice()
			dw.HTTPAddr, dw.AdminAddr = reachable(info.GetHttpAddr(), w.Addr), reachable(info.GetAdminAddr(), w.Addr)
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

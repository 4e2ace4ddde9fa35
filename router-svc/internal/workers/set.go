package workers

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"google.golang.org/grpc"
)

// Identity is what every worker of a set must report through Info. Zero
// fields accept anything.
type Identity struct {
	// Fingerprint is the model fingerprint the router serves.
	Fingerprint string
	// Layers, KVHeads and HeadDim are the model's KV shape; a worker's
	// KV layout must agree. Page size and element type are the workers'
	// own choice, checked between the two ends of each pair instead
	// (LayoutCompatible).
	Layers, KVHeads, HeadDim int
}

// check returns why info is refused, or "".
func (id Identity) check(role batonv1.WorkerRole, info *batonv1.InfoResponse) string {
	if info.GetRole() != role {
		return fmt.Sprintf("worker reports role %s, configured as %s", RoleName(info.GetRole()), RoleName(role))
	}
	if fp := info.GetModel().GetFingerprint(); id.Fingerprint != "" && fp != "" && fp != id.Fingerprint {
		return fmt.Sprintf("worker serves model fingerprint %s, the router %s", fp, id.Fingerprint)
	}
	l := info.GetKvLayout()
	if l == nil {
		return ""
	}
	for _, f := range []struct {
		name      string
		got, want int
	}{
		{"num_layers", int(l.GetNumLayers()), id.Layers},
		{"num_kv_heads", int(l.GetNumKvHeads()), id.KVHeads},
		{"head_dim", int(l.GetHeadDim()), id.HeadDim},
	} {
		if f.want != 0 && f.got != f.want {
			return fmt.Sprintf("worker's kv_layout.%s is %d, the router's model has %d", f.name, f.got, f.want)
		}
	}
	return ""
}

// RoleName is "prefill" or "decode".
func RoleName(r batonv1.WorkerRole) string {
	switch r {
	case batonv1.WorkerRole_WORKER_ROLE_PREFILL:
		return "prefill"
	case batonv1.WorkerRole_WORKER_ROLE_DECODE:
		return "decode"
	}
	return r.String()
}

// Config configures a Set.
type Config struct {
	Role   batonv1.WorkerRole
	Source Source
	Expect Identity
	// LoadInterval is how often workers report their load.
	LoadInterval time.Duration
	// CacheEvents asks each worker for its prefix cache's changes with
	// its load reports, for the cache-aware policy.
	CacheEvents bool
	// ResolveInterval is how often Source is asked again (5 s if 0).
	ResolveInterval time.Duration
	// LostAfter is how long a reached worker's load reports may stop, its
	// connection open, before the router gives it up as lost and fails
	// the requests on it (0: twice the staleness bound plus 2 s; a worker
	// is unready, and gets no new requests, after 3 LoadIntervals + 1 s).
	LostAfter   time.Duration
	Logger      *slog.Logger
	DialOptions []grpc.DialOption
}

// Set is the workers of one role. Run keeps it current; everything else
// reads a snapshot and is safe for concurrent use.
type Set struct {
	cfg        Config
	staleAfter time.Duration // a report older than this makes a worker unready
	lostAfter  time.Duration // no report for this long loses a reached worker

	snap atomic.Pointer[[]*Worker] // sorted by address; replaced, never modified

	mu      sync.Mutex // membership changes
	watches map[*Worker]context.CancelFunc
	wg      sync.WaitGroup

	retMu    sync.Mutex                     // retired workers whose connections are still open
	retiring map[*Worker]context.CancelFunc // each one's watch
}

// NewSet returns a set with no workers; Run finds them.
func NewSet(cfg Config) *Set {
	if cfg.ResolveInterval <= 0 {
		cfg.ResolveInterval = 5 * time.Second
	}
	if cfg.LoadInterval <= 0 {
		cfg.LoadInterval = time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	stale := 3*cfg.LoadInterval + time.Second
	if cfg.LostAfter <= 0 {
		cfg.LostAfter = 2*stale + 2*time.Second
	}
	return &Set{
		cfg: cfg, staleAfter: stale, lostAfter: cfg.LostAfter,
		watches: map[*Worker]context.CancelFunc{}, retiring: map[*Worker]context.CancelFunc{},
	}
}

// Role is the set's role.
func (s *Set) Role() batonv1.WorkerRole { return s.cfg.Role }

// Source is where the set finds its workers.
func (s *Set) Source() Source { return s.cfg.Source }

// Workers is the current membership, sorted by address. The slice is shared:
// do not modify it.
func (s *Set) Workers() []*Worker {
	if p := s.snap.Load(); p != nil {
		return *p
	}
	return nil
}

// Draining lists the workers that have left the set but still have
// requests on them, sorted by address.
func (s *Set) Draining() []*Worker {
	s.retMu.Lock()
	out := make([]*Worker, 0, len(s.retiring))
	for w := range s.retiring {
		out = append(out, w)
	}
	s.retMu.Unlock()
	slices.SortFunc(out, func(a, b *Worker) int { return strings.Compare(a.Addr, b.Addr) })
	return out
}

// Ready returns the workers that can take requests now.
func (s *Set) Ready() []*Worker {
	now, stale := time.Now().UnixNano(), int64(s.staleAfter)
	var out []*Worker
	for _, w := range s.Workers() {
		if w.routable(now, stale) {
			out = append(out, w)
		}
	}
	return out
}

// Routable reports whether w may take new requests now.
func (s *Set) Routable(w *Worker) bool {
	return w.routable(time.Now().UnixNano(), int64(s.staleAfter))
}

// Run keeps the set current until ctx ends: it resolves the source every
// ResolveInterval, connects to and watches workers that appear, and retires
// those that vanish. When it returns, every goroutine it started has
// stopped and every connection is closed.
func (s *Set) Run(ctx context.Context) {
	defer s.shutdown()
	t := time.NewTicker(s.cfg.ResolveInterval)
	defer t.Stop()
	failures := 0
	for {
		rctx, cancel := context.WithTimeout(ctx, max(s.cfg.ResolveInterval, 2*time.Second))
		addrs, err := s.cfg.Source.Resolve(rctx)
		cancel()
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			// Keep the workers we have: a resolver hiccup is not news
			// about them.
			failures++
			level := slog.LevelDebug
			if failures == 1 || failures%20 == 0 {
				level = slog.LevelWarn
			}
			s.cfg.Logger.Log(ctx, level, "resolving workers failed; keeping the current set",
				"role", RoleName(s.cfg.Role), "source", s.cfg.Source.String(), "err", err, "workers", len(s.Workers()))
		default:
			failures = 0
			s.update(ctx, addrs)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// update makes the membership addrs: new addresses get a connection and a
// watch, missing ones are retired.
func (s *Set) update(ctx context.Context, addrs []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	cur := s.Workers()
	want := make(map[string]bool, len(addrs))
	for _, a := range addrs {
		want[a] = true
	}
	next := make([]*Worker, 0, len(addrs))
	have := make(map[string]bool, len(cur))
	changed := false
	for _, w := range cur {
		if want[w.Addr] {
			next = append(next, w)
			have[w.Addr] = true
			continue
		}
		changed = true
		s.retire(w)
	}
	for _, a := range addrs {
		if have[a] {
			continue
		}
		conn, err := grpc.NewClient(a, s.cfg.DialOptions...)
		if err != nil {
			s.cfg.Logger.Warn("worker address unusable", "role", RoleName(s.cfg.Role), "worker", a, "err", err)
			continue
		}
		w := newWorker(a, s.cfg.Role, conn)
		w.onClose = func() { s.closed(w) }
		wctx, cancel := context.WithCancel(ctx)
		s.watches[w] = cancel
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.watch(wctx, w)
		}()
		next = append(next, w)
		changed = true
		s.cfg.Logger.Info("worker joined", "role", RoleName(s.cfg.Role), "worker", a)
	}
	if changed || cur == nil {
		slices.SortFunc(next, func(a, b *Worker) int { return strings.Compare(a.Addr, b.Addr) })
		s.snap.Store(&next)
	}
}

// retire removes w from service (s.mu held): no new requests go to it. Its
// watch goes on while requests run on it, so that they still fail fast if
// it dies; watch and connection end with its last request.
func (s *Set) retire(w *Worker) {
	cancel := s.watches[w]
	delete(s.watches, w)
	s.retMu.Lock()
	s.retiring[w] = cancel
	s.retMu.Unlock()
	s.cfg.Logger.Info("worker left; draining", "role", RoleName(s.cfg.Role), "worker", w.Addr, "inflight", w.Inflight())
	w.retire()
}

// closed is a retired worker's connection closing: its watch stops.
func (s *Set) closed(w *Worker) {
	s.retMu.Lock()
	cancel := s.retiring[w]
	delete(s.retiring, w)
	s.retMu.Unlock()
	if cancel != nil {
		cancel()
	}
}

// shutdown stops every watch and closes every connection, draining or not.
func (s *Set) shutdown() {
	s.mu.Lock()
	for w, cancel := range s.watches {
		cancel()
		delete(s.watches, w)
	}
	cur := s.Workers()
	s.snap.Store(nil)
	s.mu.Unlock()
	s.retMu.Lock()
	draining := make([]*Worker, 0, len(s.retiring))
	for w, cancel := range s.retiring {
		cancel()
		draining = append(draining, w)
	}
	s.retMu.Unlock()
	s.wg.Wait()
	for _, w := range append(cur, draining...) {
		w.retired.Store(true)
		w.closeConn()
	}
}

// watch keeps w's identity checked and its load current until ctx ends,
// reconnecting with backoff when its stream breaks.
func (s *Set) watch(ctx context.Context, w *Worker) {
	const maxBackoff = 5 * time.Second
	backoff := 100 * time.Millisecond
	for failures := 0; ctx.Err() == nil; failures++ {
		reached, err := s.follow(ctx, w)
		if ctx.Err() != nil {
			return
		}
		w.setErr(err)
		if reached {
			// It had been reachable: this is news, and requests on it
			// must not wait for a peer that is gone.
			failures, backoff = 0, 100*time.Millisecond
			w.markLost(fmt.Errorf("%w: %s %s: %w", ErrLost, RoleName(s.cfg.Role), w.Addr, err))
		}
		// Workers starting alongside the router are refused for a moment;
		// only a worker that stays unreachable, or one that was reachable,
		// is worth a warning.
		level := slog.LevelDebug
		var mismatch *identityError
		switch {
		case errors.As(err, &mismatch):
			level = slog.LevelDebug
			if mismatch.first {
				level = slog.LevelWarn
			}
		case reached || failures == 5 || failures%50 == 49:
			level = slog.LevelWarn
		}
		s.cfg.Logger.Log(ctx, level, "worker unavailable", "worker", w.Addr, "role", RoleName(s.cfg.Role),
			"err", err, "attempts", failures+1, "retry_in", backoff.String())
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, maxBackoff)
	}
}

// ErrLost is the cause of a worker's Lost context: the router had reached
// the worker and lost it.
var ErrLost = errors.New("worker lost")

// identityError is a worker whose Info the router refuses.
type identityError struct {
	reason string
	first  bool // a new reason for this worker: worth a warning
}

func (e *identityError) Error() string { return "excluded: " + e.reason }

// errNoReports ends a load stream that has gone quiet.
var errNoReports = errors.New("no load report")

// follow checks w's identity and records its load reports until the stream
// breaks or goes quiet for lostAfter. reached reports whether any report
// arrived.
func (s *Set) follow(ctx context.Context, w *Worker) (reached bool, err error) {
	client := batonv1.NewWorkerServiceClient(w.conn)
	ictx, cancel := context.WithTimeout(ctx, 5*time.Second)
	info, err := client.Info(ictx, &batonv1.InfoRequest{})
	cancel()
	if err != nil {
		return false, fmt.Errorf("info: %w", err)
	}
	if why := s.cfg.Expect.check(s.cfg.Role, info); why != "" {
		w.info.Store(nil)
		prev := w.excluded.Swap(&why)
		return false, &identityError{reason: why, first: prev == nil || *prev != why}
	}
	w.excluded.Store(nil)
	w.info.Store(info)

	sctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	stream, err := client.WatchLoad(sctx, &batonv1.WatchLoadRequest{
		IntervalMs: uint32(s.cfg.LoadInterval.Milliseconds()), CacheEvents: s.cfg.CacheEvents})
	if err != nil {
		return false, fmt.Errorf("watch load: %w", err)
	}
	// A peer that vanishes without closing its connection (a frozen
	// machine, a black-holed network) sends nothing; the timer notices.
	quiet := fmt.Errorf("%w for %v", errNoReports, s.lostAfter)
	timer := time.AfterFunc(s.lostAfter, func() { stop(quiet) })
	defer timer.Stop()
	for {
		resp, err := stream.Recv()
		if err != nil {
			if context.Cause(sctx) == quiet {
				err = quiet
			}
			return reached, fmt.Errorf("watch load: %w", err)
		}
		timer.Reset(s.lostAfter)
		w.cache.apply(resp.GetCache())
		w.observe(resp.GetLoad(), time.Now())
		reached = true
	}
}

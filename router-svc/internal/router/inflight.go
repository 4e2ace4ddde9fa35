package router

import (
	"context"
	"crypto/rand"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"github.com/baton-serving/baton/router-svc/internal/openai"
	"github.com/baton-serving/baton/router-svc/internal/reconcile"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// request is one in-flight request at the router. It is owned by the RPC
// handler that created it; others only read its atomics or cancel it.
type request struct {
	id           string
	start        time.Time
	peer         string
	traceID      string
	promptTokens int
	cancel       context.CancelCauseFunc
	// owner is the API key that made the request (keyed false with
	// authentication off): only it may abort the request.
	owner openai.KeyID
	keyed bool
	// origin names this request, and no other, to the workers: this router
	// process's instance and the request's serial in it, set by
	// inflight.add. Each attempt carries it and its number (attempts), so
	// that a prefill worker lets only this request's later attempt replace
	// a stale transfer of its id.
	origin   string
	attempts atomic.Uint32 // attempts made on workers so far

	state     atomic.Int32 // batonv1.RequestState
	generated atomic.Int64
	progress  atomic.Int64 // unix nanos of the last progress
	workers   atomic.Pointer[string]
	route     atomic.Pointer[route] // the current attempt's pair; nil before the first
	// sending is set while the router waits to hand an event to the
	// client. The request is then the router's alone: the workers may
	// have finished it already (a slow client reads the tail of a
	// finished generation), which is no orphan.
	sending atomic.Bool
	// sendFailed: handing an event to the client failed (it left, or
	// fell behind), so the client ended the request.
	sendFailed atomic.Bool
	// endedBy is the worker whose failure or loss ended the last attempt.
	endedBy atomic.Pointer[string]
}

// route is the pair an attempt runs on.
type route struct{ prefill, decode string }

// setRoute records the current attempt's pair; a retry's description
// names its attempt (/debug/requests shows it).
func (r *request) setRoute(prefill, decode string, attempt int) {
	desc := fmt.Sprintf("prefill=%s decode=%s", prefill, decode)
	if attempt > 0 {
		desc += fmt.Sprintf(" attempt=%d", attempt)
	}
	r.workers.Store(&desc)
	r.route.Store(&route{prefill, decode})
}

func (r *request) setState(s batonv1.RequestState) {
	r.state.Store(int32(s))
	r.progress.Store(time.Now().UnixNano())
}

func (r *request) info(now time.Time) *batonv1.RequestInfo {
	ri := &batonv1.RequestInfo{
		RequestId:            r.id,
		State:                batonv1.RequestState(r.state.Load()),
		AgeSeconds:           now.Sub(r.start).Seconds(),
		SinceProgressSeconds: now.Sub(time.Unix(0, r.progress.Load())).Seconds(),
		Peer:                 r.peer,
		TraceId:              r.traceID,
		PromptTokens:         uint32(r.promptTokens),
		GeneratedTokens:      uint32(r.generated.Load()),
	}
	if w := r.workers.Load(); w != nil {
		ri.Workers = *w
	}
	return ri
}

// inflight is the router's table of in-flight requests, keyed by id.
type inflight struct {
	mu       sync.Mutex
	reqs     map[string]*request
	instance string // random, made once per router process
	serial   uint64 // requests added so far
}

func newInflight() *inflight {
	return &inflight{reqs: map[string]*request{}, instance: rand.Text()[:16]}
}

// add registers r; a duplicate id is ALREADY_EXISTS. The returned func
// removes it and is the request's one release path at the router.
func (t *inflight) add(r *request) (remove func(), err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, dup := t.reqs[r.id]; dup {
		return nil, status.Errorf(codes.AlreadyExists, "request_id %q is already in flight", r.id)
	}
	t.reqs[r.id] = r
	t.serial++
	r.origin = fmt.Sprintf("%s-%d", t.instance, t.serial)
	var once sync.Once
	return func() {
		once.Do(func() {
			t.mu.Lock()
			delete(t.reqs, r.id)
			t.mu.Unlock()
		})
	}, nil
}

func (t *inflight) get(id string) *request {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.reqs[id]
}

func (t *inflight) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.reqs)
}

// entries lists the requests and their pairs for reconciliation.
func (t *inflight) entries() []reconcile.Entry {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]reconcile.Entry, 0, len(t.reqs))
	for _, r := range t.reqs {
		e := reconcile.Entry{ID: r.id}
		if rt := r.route.Load(); rt != nil && !r.sending.Load() {
			e.Prefill, e.Decode = rt.prefill, rt.decode
		}
		out = append(out, e)
	}
	return out
}

// list returns every request, oldest first.
func (t *inflight) list() []*batonv1.RequestInfo {
	return t.listWhere(func(*request) bool { return true })
}

// listWhere returns the requests keep accepts, oldest first.
func (t *inflight) listWhere(keep func(*request) bool) []*batonv1.RequestInfo {
	t.mu.Lock()
	rs := make([]*request, 0, len(t.reqs))
	for _, r := range t.reqs {
		if keep(r) {
			rs = append(rs, r)
		}
	}
	t.mu.Unlock()
	slices.SortFunc(rs, func(a, b *request) int { return a.start.Compare(b.start) })
	now := time.Now()
	out := make([]*batonv1.RequestInfo, len(rs))
	for i, r := range rs {
		out[i] = r.info(now)
	}
	return out
}

// snapshot returns the requests in flight, in no order, for the router's
// request-path readiness check (routerhealth.go).
func (t *inflight) snapshot() []*request {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]*request, 0, len(t.reqs))
	for _, r := range t.reqs {
		out = append(out, r)
	}
	return out
}

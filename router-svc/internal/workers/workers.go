// Package workers keeps the router's view of its prefill and decode workers
// and chooses among them.
//
// A Set holds the workers of one role. It finds them through a Source (a
// static list, or DNS re-resolved on an interval), opens one gRPC connection
// to each, checks each one's identity (role, model fingerprint, KV layout)
// with Info, and follows its WatchLoad stream. Routing reads an immutable
// snapshot of the set, swapped atomically when membership changes, so a pick
// takes no lock.
//
// Routing is a Policy made of small plug-ins: Filters rule workers out,
// Scorers rate the rest in [0, 1], and a Picker chooses one. A Pairer picks a
// (prefill, decode) pair with a policy per role, a per-worker in-flight limit
// and an optional PairGate (the canary's quarantine).
//
// Everything here is rebuilt from the workers themselves: a restarted router
// loses nothing it cannot learn again from Info and WatchLoad.
package workers

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"google.golang.org/grpc"
)

// Worker is one prefill or decode worker. Its fields change while the router
// runs; every method is safe for concurrent use.
type Worker struct {
	// Addr is the worker's gRPC address, host:port.
	Addr string
	// Role is what the router uses it for.
	Role batonv1.WorkerRole

	// What every pick reads, together and unpacked from the last report:
	// a pick looks at every worker and must not chase pointers for it.
	updated  atomic.Int64  // unix nanos of the last report
	ready    atomic.Bool   // the last report said ready
	retired  atomic.Bool   // left the set: no new requests
	inflight atomic.Int64  // requests the router has on it
	work     atomic.Int64  // queued + running + transferring, as reported
	kvUse    atomic.Uint64 // float64 bits: fraction of KV pages in use, as reported

	conn *grpc.ClientConn

	info     atomic.Pointer[batonv1.InfoResponse] // as accepted by the last identity check
	load     atomic.Pointer[batonv1.LoadReport]   // nil while not watched
	lastErr  atomic.Pointer[string]
	excluded atomic.Pointer[string] // why its identity was refused; nil when accepted
	routed   atomic.Uint64          // requests routed to it since it joined
	lost     atomic.Pointer[lostSignal]
	// notServing is cancelled while the worker reports NOT_SERVING.
	notServing atomic.Pointer[lostSignal]

	// cache is the router's index of the worker's prefix cache (cache.go).
	cache cacheIndex

	closeOnce sync.Once
	onClose   func() // the set's bookkeeping, run once when the connection closes
}

// lostSignal is a context cancelled when the router loses a worker it had
// reached; requests on the worker follow it.
type lostSignal struct {
	ctx    context.Context
	cancel context.CancelCauseFunc
}

// newWorker returns a worker that uses conn (nil in tests of routing alone).
func newWorker(addr string, role batonv1.WorkerRole, conn *grpc.ClientConn) *Worker {
	w := &Worker{Addr: addr, Role: role, conn: conn}
	w.lost.Store(newLostSignal())
	w.notServing.Store(newLostSignal())
	return w
}

func newLostSignal() *lostSignal {
	ctx, cancel := context.WithCancelCause(context.Background())
	return &lostSignal{ctx, cancel}
}

// Conn is the worker's gRPC connection.
func (w *Worker) Conn() *grpc.ClientConn { return w.conn }

// Info is the worker's identity as accepted by the router (nil before its
// first successful check).
func (w *Worker) Info() *batonv1.InfoResponse { return w.info.Load() }

// Load is the last load report (nil before the first, and while the worker
// is unreachable or refused).
func (w *Worker) Load() *batonv1.LoadReport { return w.load.Load() }

// LoadAge is the time since the last load report (0 before the first).
func (w *Worker) LoadAge(now time.Time) time.Duration {
	u := w.updated.Load()
	if u == 0 {
		return 0
	}
	return now.Sub(time.Unix(0, u))
}

// LastError is the last reason the worker was unusable ("" if none).
func (w *Worker) LastError() string {
	if p := w.lastErr.Load(); p != nil {
		return *p
	}
	return ""
}

// Excluded is why the worker's identity was refused ("" when accepted).
func (w *Worker) Excluded() string {
	if p := w.excluded.Load(); p != nil {
		return *p
	}
	return ""
}

// Retired reports whether the worker has left its set.
func (w *Worker) Retired() bool { return w.retired.Load() }

// Inflight is the number of router requests on the worker now.
func (w *Worker) Inflight() int64 { return w.inflight.Load() }

// Routed is the number of requests routed to the worker since it joined.
func (w *Worker) Routed() uint64 { return w.routed.Load() }

// Lost returns a context that is cancelled, with the reason as its cause,
// if the router loses the worker after having reached it: its connection
// breaks or its load reports stop. Requests on the worker end with it rather
// than wait for a peer that is gone. Each loss cancels one context; a later
// call returns a fresh one.
func (w *Worker) Lost() context.Context { return w.lost.Load().ctx }

// markLost cancels the current Lost context with cause.
func (w *Worker) markLost(cause error) {
	old := w.lost.Swap(newLostSignal())
	old.cancel(cause)
}

// ErrNotServing is the cause of a worker's NotServing context.
var ErrNotServing = errors.New("worker reports NOT_SERVING")

// NotServing returns a context that is cancelled, with an ErrNotServing
// cause, once the worker reports NOT_SERVING (its scheduler stalled, or it
// is draining); it is already cancelled while it does. Requests that have
// not begun on it (no first token) leave it and are retried elsewhere
// rather than wait on a worker that says it cannot serve them.
func (w *Worker) NotServing() context.Context { return w.notServing.Load().ctx }

// routable reports whether the worker may take new requests at time now
// (unix nanos): it is in its set, its identity was accepted, and its last
// report, received within staleAfter, said it was ready.
func (w *Worker) routable(now, staleAfter int64) bool {
	return w.ready.Load() && !w.retired.Load() && now-w.updated.Load() < staleAfter
}

// observe records a load report.
func (w *Worker) observe(l *batonv1.LoadReport, at time.Time) {
	w.load.Store(l)
	w.work.Store(int64(l.GetQueuedRequests()) + int64(l.GetRunningRequests()) + int64(l.GetTransferringRequests()))
	var kv float64
	if t := l.GetPagesTotal(); t > 0 {
		kv = min(float64(l.GetPagesUsed())/float64(t), 1)
	}
	w.kvUse.Store(math.Float64bits(kv))
	w.ready.Store(l.GetReady())
	w.setServing(l.GetReady())
	w.updated.Store(at.UnixNano())
	w.lastErr.Store(nil)
}

// setServing cancels the NotServing context when the worker reports
// NOT_SERVING, and arms a fresh one when it is ready again.
func (w *Worker) setServing(ready bool) {
	cur := w.notServing.Load()
	switch {
	case !ready && cur.ctx.Err() == nil:
		cur.cancel(fmt.Errorf("%w: %s %s", ErrNotServing, RoleName(w.Role), w.Addr))
	case ready && cur.ctx.Err() != nil:
		w.notServing.CompareAndSwap(cur, newLostSignal())
	}
}

// setErr records why the worker is unusable and forgets its load.
func (w *Worker) setErr(err error) {
	s := err.Error()
	w.lastErr.Store(&s)
	w.ready.Store(false)
	w.load.Store(nil)
	w.work.Store(0)
	w.kvUse.Store(0)
	w.cache.reset()
}

// errLimit is tryAcquire's answer for a worker at its in-flight limit.
var errLimit = errors.New("at its in-flight limit")

// errRetired is tryAcquire's answer for a worker that has left its set.
var errRetired = errors.New("left the worker set")

// tryAcquire counts a request on the worker unless it already has limit
// (> 0) requests or has left its set; release must follow, once.
func (w *Worker) tryAcquire(limit int64) error {
	for {
		n := w.inflight.Load()
		if limit > 0 && n >= limit {
			return errLimit
		}
		if w.inflight.CompareAndSwap(n, n+1) {
			break
		}
	}
	// Checked after counting, so that retire either sees this request or
	// this request sees the retirement: a retired worker's connection is
	// closed only once nothing counts on it.
	if w.retired.Load() {
		w.release()
		return errRetired
	}
	w.routed.Add(1)
	return nil
}

func (w *Worker) release() {
	if w.inflight.Add(-1) == 0 && w.retired.Load() {
		w.closeConn()
	}
}

// retire takes the worker out of service: no new requests; its connection
// closes once the requests on it have ended.
func (w *Worker) retire() {
	w.retired.Store(true)
	if w.inflight.Load() == 0 {
		w.closeConn()
	}
}

// closeConn closes the connection once.
func (w *Worker) closeConn() {
	w.closeOnce.Do(func() {
		if w.conn != nil {
			_ = w.conn.Close()
		}
		if w.onClose != nil {
			w.onClose()
		}
	})
}

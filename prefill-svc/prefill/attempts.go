package prefill

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/baton-serving/baton/engine/sched"
	"github.com/baton-serving/baton/svckit"
)

// A request's retry (the router tries a failed attempt again on another
// pair) can reach this prefill worker while the failed attempt's transfer
// still holds the request's id: its decode went away without closing the
// stream, or is partitioned, and the scheduler lets go of a request only at
// its next step boundary. A later attempt of the same request wins: the
// stale transfer is ended (ABORTED, superseded) and released, and the new
// one is submitted once the scheduler has freed the id. The request id
// itself never changes; the router's /debug/requests shows which attempt it
// is.
//
// Only the same request's later attempt may do so. The handshake names the
// request's origin (an opaque token the router makes for one request in one
// router process, the same for all its attempts) and the attempt's number.
// Any other handshake for an id a live transfer holds is refused
// ALREADY_EXISTS as before: another router's client that chose the same id,
// a tenant who learned another's id (it is echoed as cmpl-<id>), a stale
// attempt arriving after its retry, or a handshake naming no origin (a
// client of decode other than the router) must not end the live transfer.

// replaceGrace bounds how long a new transfer waits for a stale transfer of
// its id to be released (the release bound of every service).
const replaceGrace = 2 * time.Second

// live is one transfer holding a request id on this worker.
type live struct {
	origin  string // the request's, from the handshake; "" for none
	attempt uint32 // the attempt's number at its origin
	cancel  context.CancelCauseFunc
	done    chan struct{} // closed when its TransferKV has returned
}

// supersedes reports whether a transfer of attempt from origin is a later
// attempt of the request that l serves.
func (l *live) supersedes(origin string, attempt uint32) bool {
	return origin != "" && origin == l.origin && attempt > l.attempt
}

// liveTransfers are the transfers in progress, by request id.
type liveTransfers struct {
	mu sync.Mutex
	m  map[string]*live
}

// claim registers a transfer of id, attempt of the request from origin,
// ended by cancel. It returns the transfer it replaces (nil if none) and
// the func that drops the claim when the transfer's handler returns, or an
// error wrapping sched.ErrDuplicateID (ALREADY_EXISTS) when a transfer that
// this one does not supersede holds id.
func (l *liveTransfers) claim(id, origin string, attempt uint32, cancel context.CancelCauseFunc) (prev *live, drop func(), err error) {
	me := &live{origin: origin, attempt: attempt, cancel: cancel, done: make(chan struct{})}
	l.mu.Lock()
	if l.m == nil {
		l.m = map[string]*live{}
	}
	prev = l.m[id]
	if prev != nil && !prev.supersedes(origin, attempt) {
		l.mu.Unlock()
		return nil, nil, fmt.Errorf("%w: %q (a transfer of another request, or of a later attempt, holds it)", sched.ErrDuplicateID, id)
	}
	l.m[id] = me
	l.mu.Unlock()
	return prev, func() {
		l.mu.Lock()
		if l.m[id] == me {
			delete(l.m, id)
		}
		l.mu.Unlock()
		close(me.done)
	}, nil
}

// errSuperseded ends a stale transfer that a newer attempt replaced.
var errSuperseded = fmt.Errorf("transfer ended: %w", svckit.ErrSuperseded)

// submit submits req, first ending a stale transfer of the same id (prev)
// and, while the scheduler still holds the id, trying again until it is
// released, for at most replaceGrace. No live transfer holds the id then
// (claim refused those), only a step that has yet to reach its boundary:
// an id still held after the grace is UNAVAILABLE (the router may try
// another pair), never ALREADY_EXISTS, which would reach the client as 409
// for a request that is its own retry.
func (s *Service) submit(ctx context.Context, schedCtx context.Context, req sched.Request, prev *live) (*sched.Stream, error) {
	deadline := time.Now().Add(replaceGrace)
	if prev != nil {
		prev.cancel(errSuperseded)
		select {
		case <-prev.done:
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		case <-time.After(replaceGrace):
		}
	}
	for {
		st, err := s.Host.Sched.Submit(schedCtx, req)
		if !errors.Is(err, sched.ErrDuplicateID) {
			return st, err
		}
		if time.Now().After(deadline) {
			return nil, svckit.Errorf(svckit.ErrPeerUnavailable, "request id %q still held by a previous attempt's step after %v: %w", req.ID, replaceGrace, err)
		}
		select {
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

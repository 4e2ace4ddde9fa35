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
// its next step boundary. The newer handshake wins: the stale transfer is
// ended (ABORTED, superseded) and released, and the new one is submitted
// once the scheduler has freed the id. The request id itself never changes;
// the router's /debug/requests shows which attempt it is.

// replaceGrace bounds how long a new transfer waits for a stale transfer of
// its id to be released (the release bound of every service).
const replaceGrace = 2 * time.Second

// live is one transfer holding a request id on this worker.
type live struct {
	cancel context.CancelCauseFunc
	done   chan struct{} // closed when its TransferKV has returned
}

// liveTransfers are the transfers in progress, by request id.
type liveTransfers struct {
	mu sync.Mutex
	m  map[string]*live
}

// claim registers a transfer of id, ended by cancel, and returns the
// transfer it replaces (nil if none) and the func that drops the claim when
// the transfer's handler returns.
func (l *liveTransfers) claim(id string, cancel context.CancelCauseFunc) (prev *live, drop func()) {
	me := &live{cancel: cancel, done: make(chan struct{})}
	l.mu.Lock()
	if l.m == nil {
		l.m = map[string]*live{}
	}
	prev = l.m[id]
	l.m[id] = me
	l.mu.Unlock()
	return prev, func() {
		l.mu.Lock()
		if l.m[id] == me {
			delete(l.m, id)
		}
		l.mu.Unlock()
		close(me.done)
	}
}

// errSuperseded ends a stale transfer that a newer attempt replaced.
var errSuperseded = fmt.Errorf("transfer ended: %w", svckit.ErrSuperseded)

// submit submits req, first ending a stale transfer of the same id (prev)
// and, while the scheduler still holds the id, trying again until it is
// released, for at most replaceGrace.
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
		if !errors.Is(err, sched.ErrDuplicateID) || time.Now().After(deadline) {
			return st, err
		}
		select {
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

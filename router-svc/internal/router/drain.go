package router

// The router's part of a drain (SIGTERM). svckit refuses new requests and
// turns readiness NOT_SERVING; then this hook, before the servers stop:
// requests still waiting for their first token are refused at once (503 /
// UNAVAILABLE with a retryable message: nothing reached their clients, so
// they can be sent again, to another router), the others get the
// shutdown timeout to finish, and those still running shortly before it
// are ended by the router itself — with an error event and [DONE] on SSE,
// a terminal error line on NDJSON, UNAVAILABLE on gRPC — while their
// connections can still carry it. Left to the servers' stop they would be
// cut mid-answer, which reads as a finished one.

import (
	"context"
	"errors"
	"fmt"
	"time"

	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"github.com/baton-serving/baton/svckit"
)

// The cancel causes of requests the drain ends; both wrap
// svckit.ErrDraining (UNAVAILABLE).
var (
	errDrainRefused = fmt.Errorf("%w: the router refused the request before its first token; retry it", svckit.ErrDraining)
	errDrainCut     = fmt.Errorf("%w: the request was still running when the router's --shutdown-timeout was nearly spent; retry it", svckit.ErrDraining)
)

// drainTail bounds the time kept, at the end of the shutdown timeout, for
// the answers of the requests the drain ends (a quarter of the timeout if
// that is less): their error events are written within the stream
// writers' grace (sseEndGrace), usually at once.
const drainTail = time.Second

// drainPoll is how often the drain looks at the in-flight list.
const drainPoll = 10 * time.Millisecond

// drain is the router's OnDrain hook; ctx's deadline is the end of
// --shutdown-timeout.
func (s *Service) drain(ctx context.Context) {
	refused := 0
	for _, r := range s.inflight.snapshot() {
		if !r.begun() {
			r.cancel(errDrainRefused)
			refused++
		}
	}
	deadline, ok := ctx.Deadline()
	if !ok { // svckit always sets one; this is --shutdown-timeout's default
		deadline = time.Now().Add(10 * time.Second)
	}
	s.logger.Info("draining", "refused_before_first_token", refused, "in_flight", s.inflight.len(),
		"cut_in", time.Until(deadline).Round(time.Millisecond).String())
	cut := deadline.Add(-min(drainTail, time.Until(deadline)/4))
	if s.awaitIdle(ctx, cut) {
		return
	}
	left := s.inflight.snapshot()
	s.logger.Warn("drain: ending the requests still running at --shutdown-timeout", "requests", len(left))
	for _, r := range left {
		r.cancel(errDrainCut)
	}
	s.awaitIdle(ctx, deadline)
}

// awaitIdle waits until no request is in flight (true), until, or ctx's
// end.
func (s *Service) awaitIdle(ctx context.Context, until time.Time) bool {
	t := time.NewTicker(drainPoll)
	defer t.Stop()
	for s.inflight.len() > 0 {
		if !time.Now().Before(until) {
			return false
		}
		select {
		case <-ctx.Done():
			return s.inflight.len() == 0
		case <-t.C:
		}
	}
	return true
}

// begun says whether the request's output has started reaching its
// client (its first token came).
func (r *request) begun() bool {
	return batonv1.RequestState(r.state.Load()) == batonv1.RequestState_REQUEST_STATE_RUNNING || r.generated.Load() > 0
}

// drainStatus is the status of a request the drain ended (cause). One the
// drain refused as not yet begun whose first token was forwarded right
// after that check (a race with the relay) has output at its client: it is
// answered as a cut stream, not as a refusal to retry.
func drainStatus(cause error, r *request) error {
	if errors.Is(cause, errDrainRefused) && r.generated.Load() > 0 {
		cause = errDrainCut
	}
	return svckit.Status(cause)
}

package router

// The router's own readiness check, "request-path": NOT_SERVING when the
// path a client's request takes through the router is stuck, whatever the
// workers say. Three signs, each named with the stage it points at:
//
//   - the self-probe (selfprobe.go) got stuck or failed in a router stage;
//   - the limiter is full and nothing has finished or made progress for
//     stallBound, while some slot holder is not waiting on a worker or on
//     its client (every new request is refused, and none of the admitted
//     ones moves);
//   - the oldest in-flight request has outlived --request-timeout plus
//     overdueGrace: run should have ended it at the timeout, so something in
//     the router holds it.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
)

// stallBound is how long a full limiter may go without a request finishing
// or progressing before the router counts as wedged at admission.
const stallBound = 10 * time.Second

// clientGrace is how long past --client-write-timeout a request may wait
// on its client in stage "sending to client" before that counts as the
// router's: the sender fails the request at the timeout, and run then
// releases its slot.
const clientGrace = 5 * time.Second

// overdueGrace is how long past --request-timeout an in-flight request may
// linger (its release after the deadline) before the router counts as
// wedged in that request's stage.
const overdueGrace = 5 * time.Second

// pathHealth tracks what the request-path check needs beyond the limiter
// and the in-flight table.
type pathHealth struct {
	released atomic.Int64 // unix nanos of the last limiter slot given back; the router's start before any
}

func newPathHealth() *pathHealth {
	h := &pathHealth{}
	h.released.Store(time.Now().UnixNano())
	return h
}

// done records that a request gave its limiter slot back.
func (h *pathHealth) done() { h.released.Store(time.Now().UnixNano()) }

// stage is where an in-flight request is at the router, in the words of
// the self-probe's stages.
func (r *request) stage() string {
	if st, ok := r.knownStage(); ok {
		return st
	}
	return strings.ToLower(strings.TrimPrefix(batonv1.RequestState(r.state.Load()).String(), "REQUEST_STATE_"))
}

// knownStage is r's stage when its state names one of the self-probe's
// stages (sending to the client, routing, awaiting the first token,
// streaming).
func (r *request) knownStage() (string, bool) {
	if r.sending.Load() {
		return stageSending, true
	}
	switch batonv1.RequestState(r.state.Load()) {
	case batonv1.RequestState_REQUEST_STATE_ROUTING:
		return stageRouting, true
	case batonv1.RequestState_REQUEST_STATE_PREALLOC:
		return stageFirst, true
	case batonv1.RequestState_REQUEST_STATE_RUNNING:
		return stageStreaming, true
	}
	return "", false
}

// checkRequestPath is the "request-path" readiness check.
func (s *Service) checkRequestPath(context.Context) error {
	now := time.Now()
	var problems []string
	for _, p := range []string{s.selfProbe.problem(now), s.limiterProblem(now), s.overdueProblem(now)} {
		if p != "" {
			problems = append(problems, p)
		}
	}
	if len(problems) == 0 {
		return nil
	}
	return errors.New(strings.Join(problems, "; "))
}

// limiterProblem: the limiter full, nothing finished or progressed for
// stallBound, and not every slot holder waiting on its workers (that is
// overload or a worker's stall, which the canary and the workers' own
// readiness report) or on its client. A request handing an event to a
// client that stopped reading waits on the client until
// --client-write-timeout after the router had the event (its last
// progress), when the sender fails it: a flood of such clients is theirs,
// not a stuck router, until then plus clientGrace.
func (s *Service) limiterProblem(now time.Time) string {
	n, c := s.limit.usage()
	if c == 0 || n < c {
		return ""
	}
	idle := now.Sub(time.Unix(0, s.path.released.Load()))
	if idle < stallBound {
		return ""
	}
	waiting := 0 // on their workers or their clients
	stages := map[string]int{}
	for _, r := range s.inflight.snapshot() {
		since := now.Sub(time.Unix(0, r.progress.Load()))
		if since < stallBound {
			return "" // something moves: long requests, not a wedge
		}
		st := r.stage()
		if workerStage(st) || st == stageSending && s.clientBound(since) {
			waiting++
			continue
		}
		stages[st]++
	}
	if waiting >= n {
		return ""
	}
	// Slot holders missing from the table are still in admission or
	// prepare (before their in-flight entry).
	stage, most := stageAdmission, n-waiting
	for _, k := range stages {
		most -= k
	}
	for st, k := range stages {
		if k > most {
			stage, most = st, k
		}
	}
	return fmt.Sprintf("stuck at %s: the limiter is full (%d of %d slots, --max-concurrent-requests) and no request finished or progressed for %v",
		stage, n, c, idle.Round(time.Second))
}

// clientBound reports whether a request sending to its client for since
// (since the router had the event) waits on the client: within
// --client-write-timeout plus clientGrace. Without a write timeout only
// --request-timeout bounds the wait, which overdueProblem watches.
func (s *Service) clientBound(since time.Duration) bool {
	t := s.limits.clientWriteTimeout
	return t <= 0 || since < t+clientGrace
}

// overdueProblem: the oldest in-flight request past --request-timeout
// plus overdueGrace.
func (s *Service) overdueProblem(now time.Time) string {
	t := s.limits.requestTimeout
	if t <= 0 {
		return ""
	}
	var oldest *request
	for _, r := range s.inflight.snapshot() {
		if oldest == nil || r.start.Before(oldest.start) {
			oldest = r
		}
	}
	if oldest == nil {
		return ""
	}
	if age := now.Sub(oldest.start); age > t+overdueGrace {
		return fmt.Sprintf("stuck at %s: request %s in flight for %v, past --request-timeout %v plus %v",
			oldest.stage(), oldest.id, age.Round(time.Second), t, overdueGrace)
	}
	return ""
}

package svckit

// Readiness: the checks a service registers, how they are run, and the two
// surfaces that show their result (HTTP /health/ready and gRPC health).
//
// Every check runs in a goroutine of its own with its own timeout, and the
// caller waits for it at most that long: a check that blocks (a deadlock,
// a lock held by a stuck request, a call that ignores its context) turns
// readiness NOT_SERVING with "check NAME timed out" instead of freezing it.
// Before this, a blocked check froze gRPC health at its last status
// (SERVING) while /health/ready hung, so nothing ever took the service out
// of rotation. At most one run of a check is in flight: callers that come
// while it runs share it, so a blocked check costs one goroutine, not one
// per probe.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// ReadinessCheck reports whether one part of a service can take traffic; a
// non-nil error says why not. It should return by ctx's deadline (its
// timeout); one that does not is reported as timed out all the same.
type ReadinessCheck func(ctx context.Context) error

// DefaultCheckTimeout bounds one run of a readiness check added with
// AddReadinessCheck. Checks read in-memory state; one that takes a second
// is stuck.
const DefaultCheckTimeout = time.Second

// healthRefresh is how often the gRPC health status is recomputed from the
// readiness checks (/health/ready computes it on every request).
const healthRefresh = 250 * time.Millisecond

// readinessCheck is one registered check and its run in flight.
type readinessCheck struct {
	name    string
	fn      ReadinessCheck
	timeout time.Duration

	mu  sync.Mutex
	run *checkRun // the run in flight, or the last one; nil before the first
}

// checkRun is one run of a check.
type checkRun struct {
	start time.Time
	done  chan struct{} // closed when fn has returned
	err   error         // fn's result, set before done closes
}

// AddReadinessCheck adds a check that readiness (gRPC health and
// /health/ready) requires to pass, bounded by DefaultCheckTimeout.
func (s *Server) AddReadinessCheck(name string, fn ReadinessCheck) {
	s.AddReadinessCheckTimeout(name, DefaultCheckTimeout, fn)
}

// AddReadinessCheckTimeout adds a check with its own timeout: a run that
// has not answered within it fails readiness as timed out.
func (s *Server) AddReadinessCheckTimeout(name string, timeout time.Duration, fn ReadinessCheck) {
	if timeout <= 0 {
		timeout = DefaultCheckTimeout
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.checks = append(s.checks, &readinessCheck{name: name, fn: fn, timeout: timeout})
}

// current returns the run in flight, starting one if none is.
func (c *readinessCheck) current(ctx context.Context) *checkRun {
	c.mu.Lock()
	defer c.mu.Unlock()
	if r := c.run; r != nil {
		select {
		case <-r.done:
		default:
			return r // still running: share it
		}
	}
	r := &checkRun{start: time.Now(), done: make(chan struct{})}
	c.run = r
	// The run outlives the caller that started it (others may share it),
	// so it keeps ctx's values but not its cancellation.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.timeout)
	go func() {
		defer close(r.done)
		defer cancel()
		r.err = c.fn(rctx)
	}()
	return r
}

// result runs the check (or joins its run in flight) and returns "" when it
// passed, else why not. It returns by the run's timeout or ctx's end,
// whichever is first, whether or not the check has returned.
func (c *readinessCheck) result(ctx context.Context) string {
	r := c.current(ctx)
	t := time.NewTimer(time.Until(r.start.Add(c.timeout)))
	defer t.Stop()
	select {
	case <-r.done:
		switch {
		case r.err == nil:
			return ""
		case errors.Is(r.err, context.DeadlineExceeded):
			return fmt.Sprintf("check %s timed out after %v: %v", c.name, c.timeout, r.err)
		}
		return r.err.Error()
	case <-t.C:
		return fmt.Sprintf("check %s timed out after %v (running for %v)", c.name, c.timeout,
			time.Since(r.start).Round(time.Millisecond))
	case <-ctx.Done():
		return fmt.Sprintf("check %s gave no answer before the caller gave up: %v", c.name, context.Cause(ctx))
	}
}

// Ready runs the readiness checks, concurrently, and returns the failing
// ones, check name to error message ("shutdown" while the server drains).
// The map is never nil: it is empty when the service can take traffic. It
// returns within the longest check timeout, or sooner when ctx ends; a
// check that has not answered by then is failing.
func (s *Server) Ready(ctx context.Context) map[string]string {
	failed := map[string]string{}
	if s.draining.Load() {
		failed["shutdown"] = ErrDraining.Error()
	}
	s.mu.Lock()
	checks := append([]*readinessCheck(nil), s.checks...)
	s.mu.Unlock()
	msgs := make([]string, len(checks))
	var wg sync.WaitGroup
	for i, c := range checks {
		wg.Go(func() { msgs[i] = c.result(ctx) })
	}
	wg.Wait()
	for i, c := range checks {
		if msgs[i] != "" {
			failed[c.name] = msgs[i]
		}
	}
	return failed
}

// serveReady is GET /health/ready: 200 {"status":"SERVING"}, or 503 with
// the failing checks. It answers within the longest check timeout.
func (s *Server) serveReady(w http.ResponseWriter, r *http.Request) {
	failed := s.Ready(r.Context())
	body := map[string]any{"status": "SERVING"}
	code := http.StatusOK
	if len(failed) > 0 {
		body = map[string]any{"status": "NOT_SERVING", "failing": failed}
		code = http.StatusServiceUnavailable
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(body)
}

// refreshHealth mirrors the readiness checks into the gRPC health service.
func (s *Server) refreshHealth(ctx context.Context) {
	if s.draining.Load() {
		return
	}
	st := healthpb.HealthCheckResponse_SERVING
	if failed := s.Ready(ctx); len(failed) > 0 {
		st = healthpb.HealthCheckResponse_NOT_SERVING
	}
	if s.draining.Load() {
		return // shutdown has set NOT_SERVING for good meanwhile
	}
	for name := range s.GRPC.GetServiceInfo() {
		s.Health.SetServingStatus(name, st)
	}
	s.Health.SetServingStatus("", st)
}

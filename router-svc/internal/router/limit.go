package router

import (
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// limiter bounds the requests the router runs at once. It refuses rather
// than queues: a request over the limit gets RESOURCE_EXHAUSTED at once
// (HTTP 429 with Retry-After), so overload shows up at the client instead of
// as requests that hang. Every API (gRPC, REST, OpenAI) goes through run and
// so through the same limiter.
type limiter struct {
	slots chan struct{} // nil: unbounded
}

func newLimiter(n int) *limiter {
	if n <= 0 {
		return &limiter{}
	}
	return &limiter{slots: make(chan struct{}, n)}
}

// acquire takes a slot; release gives it back and must be called once. A
// nil limiter is unbounded.
func (l *limiter) acquire() (release func(), err error) {
	if l == nil || l.slots == nil {
		return func() {}, nil
	}
	select {
	case l.slots <- struct{}{}:
		return func() { <-l.slots }, nil
	default:
		return nil, status.Error(codes.ResourceExhausted,
			fmt.Sprintf("too many requests in flight (the limit is %d, --max-concurrent-requests); retry shortly", cap(l.slots)))
	}
}

// usage is how many slots are taken and how many there are (0: unbounded),
// for the router's request-path readiness check (routerhealth.go).
func (l *limiter) usage() (inUse, capacity int) {
	if l == nil || l.slots == nil {
		return 0, 0
	}
	return len(l.slots), cap(l.slots)
}

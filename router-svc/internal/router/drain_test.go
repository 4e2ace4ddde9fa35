package router

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestEndedBy: the log of a request that ended early names who ended it,
// from the request's context and what its attempt recorded.
func TestEndedBy(t *testing.T) {
	worker := "10.0.0.7:8084"
	cancelled := func(cause error) context.Context {
		ctx, cancel := context.WithCancelCause(context.Background())
		cancel(cause)
		return ctx
	}
	expired, stop := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer stop()
	for _, c := range []struct {
		name       string
		ctx        context.Context
		sendFailed bool
		worker     *string
		want       string
	}{
		{"drain refused", cancelled(errDrainRefused), false, nil, "drain"},
		{"drain cut", cancelled(errDrainCut), true, &worker, "drain"},
		{"abort", cancelled(fmt.Errorf("%w: test", errAborted)), false, nil, "abort"},
		{"client left", cancelled(context.Canceled), false, &worker, "client"},
		{"client fell behind", context.Background(), true, &worker, "client"},
		{"deadline", expired, false, &worker, "deadline"},
		{"worker", context.Background(), false, &worker, "worker " + worker},
		{"no pair", context.Background(), false, nil, "router"},
	} {
		r := &request{}
		r.sendFailed.Store(c.sendFailed)
		r.endedBy.Store(c.worker)
		if got := endedBy(c.ctx, r); got != c.want {
			t.Errorf("%s: endedBy %q, want %q", c.name, got, c.want)
		}
	}
}

// TestPrepareRefusesOversizedBytes: a native prompt longer than the
// context window times the vocabulary's longest token is refused for its
// bytes, before any tokenizing; one at the bound is judged by its tokens.
func TestPrepareRefusesOversizedBytes(t *testing.T) {
	s := testRouter(t)
	limit := (s.cfg.ContextLength - 1) * s.maxTokenBytes
	_, err := s.prepare(&batonv1.GenerateRequest{Prompt: strings.Repeat("a", limit+1)})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "bytes") || !strings.HasPrefix(status.Convert(err).Message(), "prompt: ") {
		t.Errorf("a prompt of %d bytes: %v; want INVALID_ARGUMENT naming prompt and its bytes", limit+1, err)
	}
	_, err = s.prepare(&batonv1.GenerateRequest{Prompt: strings.Repeat("a", limit)})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "tokens") || strings.Contains(err.Error(), "bytes") {
		t.Errorf("a prompt at the byte bound: %v; want it judged by its tokens", err)
	}
}

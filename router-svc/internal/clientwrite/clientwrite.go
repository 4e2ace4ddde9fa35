// Package clientwrite holds what the router's streaming write paths share —
// the gRPC stream sender, the OpenAI API's server-sent events and the REST
// gateway's NDJSON stream: the minimum-progress rule that bounds a slow
// client, its error, and the hook through which the end of a request (its
// deadline, an Abort) frees a write blocked on the client.
//
// The minimum-progress rule, with write timeout T (--client-write-timeout):
// every event of a stream must be taken by the client within T of the
// moment the router had it. An event counts as taken when the client's
// connection accepts all of its bytes (the kernel's send buffer, bounded,
// or HTTP/2 flow control); events wait in a bounded queue (64) meanwhile.
// When the oldest event not yet taken has waited T, the stream is aborted
// (DEADLINE_EXCEEDED) and the request releases everything it holds. So a
// client that takes nothing for T is aborted, and so is one that drips —
// takes a few bytes at a time, each write completing well within T — but
// falls behind: its backlog ages past T, however slowly it drips. A client
// that keeps up with a slow generation is never aborted, however long the
// stream. T = 0 turns the rule off; the request's own end (--request-timeout,
// an Abort, the client leaving) still frees a blocked write at once.
package clientwrite

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// ErrSlowClient is the cause of a stream aborted by the minimum-progress
// rule.
var ErrSlowClient = errors.New("the client did not keep up with its stream")

// SlowClient is ErrSlowClient for write timeout timeout: errors.Is finds
// the sentinel, and its gRPC status is DEADLINE_EXCEEDED.
func SlowClient(timeout time.Duration) error { return slowClientError{timeout} }

type slowClientError struct{ timeout time.Duration }

func (e slowClientError) Error() string {
	return fmt.Sprintf("%v: an event waited %v for the client to take it (--client-write-timeout)", ErrSlowClient, e.timeout)
}

func (slowClientError) Unwrap() error { return ErrSlowClient }

// GRPCStatus maps the error at the gRPC boundary.
func (e slowClientError) GRPCStatus() *status.Status {
	return status.New(codes.DeadlineExceeded, e.Error())
}

// Deadline is when an event the router had at queued must have been taken
// under write timeout timeout; the zero time when there is no timeout.
func Deadline(queued time.Time, timeout time.Duration) time.Time {
	if timeout <= 0 {
		return time.Time{}
	}
	return queued.Add(timeout)
}

type interruptKey struct{}

// WithInterrupt returns ctx carrying f, which frees the client writer that
// serves the request when the router ends it: f(cause) must make every
// pending and later send return an error wrapping cause, promptly. The
// request's caller (the gRPC handler, the OpenAI API) sets it; the router's
// relay calls it through InterruptOnDone.
func WithInterrupt(ctx context.Context, f func(cause error)) context.Context {
	return context.WithValue(ctx, interruptKey{}, f)
}

// InterruptOnDone arranges for the interrupt ctx carries, if any, to be
// called with ctx's cause when ctx ends; stop undoes it (true if it did).
// The router calls it with the request's context around each attempt, so
// that an Abort or the deadline frees a send blocked on the client, which
// the request's context alone cannot reach.
func InterruptOnDone(ctx context.Context) (stop func() bool) {
	f, _ := ctx.Value(interruptKey{}).(func(error))
	if f == nil {
		return func() bool { return false }
	}
	return context.AfterFunc(ctx, func() { f(context.Cause(ctx)) })
}

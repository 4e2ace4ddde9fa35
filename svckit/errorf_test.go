package svckit

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/baton-serving/baton/engine"
	"github.com/baton-serving/baton/engine/sched"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestErrorf checks what handlers rely on: the message is the handler's own
// (the sentinel's text is not added), the code is the sentinel's from
// codeTable, the error is the sentinel and what %w wrapped, and it stays a
// status error when wrapped further (traces record its code).
func TestErrorf(t *testing.T) {
	peerErr := status.Error(codes.Internal, "a peer's own status")
	for _, c := range []struct {
		err   error
		code  codes.Code
		msg   string
		is    []error
		isNot []error
	}{
		{Errorf(ErrPeerUnavailable, "prefill %s: stream ended", "p:1"), codes.Unavailable, "prefill p:1: stream ended",
			[]error{ErrPeerUnavailable}, []error{ErrPeerTimeout}},
		{Errorf(ErrPeerTimeout, "%w", errors.New("prefill p:1 did not accept")), codes.DeadlineExceeded, "prefill p:1 did not accept",
			[]error{ErrPeerTimeout}, nil},
		{Errorf(engine.ErrInvalidInput, "%w", fmt.Errorf("x: %w", sched.ErrClosed)), codes.InvalidArgument, "x: " + sched.ErrClosed.Error(),
			[]error{engine.ErrInvalidInput, sched.ErrClosed}, nil},
		// The kind's code wins over a status (or a sentinel) wrapped inside.
		{Errorf(ErrPeerUnavailable, "prefill p:1: %w", peerErr), codes.Unavailable, "prefill p:1: " + peerErr.Error(),
			[]error{ErrPeerUnavailable}, nil},
		{Errorf(context.Canceled, "request cancelled: %v", sched.ErrSlowConsumer), codes.Canceled, "request cancelled: " + sched.ErrSlowConsumer.Error(),
			[]error{context.Canceled}, []error{sched.ErrSlowConsumer}},
		{fmt.Errorf("pull: %w", Errorf(ErrCorrupt, "bad chunk")), codes.DataLoss, "pull: bad chunk", []error{ErrCorrupt}, nil},
		{PeerErrorf(codes.ResourceExhausted, "prefill %s: %s", "p:1", "queue full"), codes.ResourceExhausted, "prefill p:1: queue full", nil, nil},
	} {
		st, ok := status.FromError(c.err)
		if !ok || st.Code() != c.code || st.Message() != c.msg {
			t.Errorf("%v: status %v %q (a status: %v), want %v %q", c.err, st.Code(), st.Message(), ok, c.code, c.msg)
		}
		if got := status.Convert(Status(c.err)); got.Code() != c.code || got.Message() != c.msg {
			t.Errorf("Status(%v) = %v %q, want %v %q", c.err, got.Code(), got.Message(), c.code, c.msg)
		}
		if got := Code(c.err); got != c.code {
			t.Errorf("Code(%v) = %v, want %v", c.err, got, c.code)
		}
		for _, e := range c.is {
			if !errors.Is(c.err, e) {
				t.Errorf("%v is not %v", c.err, e)
			}
		}
		for _, e := range c.isNot {
			if errors.Is(c.err, e) {
				t.Errorf("%v is %v", c.err, e)
			}
		}
	}
}

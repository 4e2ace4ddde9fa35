package decode

import (
	"errors"
	"fmt"
	"testing"

	"github.com/baton-serving/baton/engine"
	"github.com/baton-serving/baton/engine/sched"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestFinishStatus pins the codes and messages clients see for each way the
// scheduler ends a request (svckit's table gives the codes now; the texts
// are decode's own), and that the error still is what ended the request.
func TestFinishStatus(t *testing.T) {
	cause := errors.New("client went away")
	for _, c := range []struct {
		ev   sched.Event
		code codes.Code
		msg  string
		is   error
	}{
		{sched.Event{Finish: sched.FinishCancelled, Err: cause}, codes.Canceled, "request cancelled: client went away", nil},
		{sched.Event{Finish: sched.FinishAborted, Err: sched.ErrClosed}, codes.Unavailable,
			"decode worker shutting down: " + sched.ErrClosed.Error(), sched.ErrClosed},
		{sched.Event{Finish: sched.FinishAborted, Err: sched.ErrSlowConsumer}, codes.Aborted, sched.ErrSlowConsumer.Error(), sched.ErrSlowConsumer},
		{sched.Event{Finish: sched.FinishError, Err: fmt.Errorf("step: %w", engine.ErrKVCacheFull)}, codes.ResourceExhausted,
			"request failed: step: " + engine.ErrKVCacheFull.Error(), engine.ErrKVCacheFull},
		{sched.Event{Finish: sched.FinishError, Err: errors.New("kernel fault")}, codes.Internal, "request failed: kernel fault", nil},
	} {
		_, err := finish(c.ev)
		st, ok := status.FromError(err)
		if !ok || st.Code() != c.code || st.Message() != c.msg {
			t.Errorf("finish(%v, %v) = %v %q (a status: %v), want %v %q", c.ev.Finish, c.ev.Err, st.Code(), st.Message(), ok, c.code, c.msg)
		}
		if c.is != nil && !errors.Is(err, c.is) {
			t.Errorf("finish(%v, %v) = %v, which is not %v", c.ev.Finish, c.ev.Err, err, c.is)
		}
	}
}

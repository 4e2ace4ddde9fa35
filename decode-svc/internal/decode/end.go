package decode

import (
	"context"
	"errors"
	"time"

	"github.com/baton-serving/baton/engine/sched"
	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"github.com/baton-serving/baton/svckit"
)

// How a request's end is observed and reported to the caller.

// finish maps the scheduler's end of a request to the API's finish reason or
// a status error.
func finish(ev sched.Event) (batonv1.FinishReason, error) {
	switch ev.Finish {
	case sched.FinishStop:
		return batonv1.FinishReason_FINISH_REASON_STOP, nil
	case sched.FinishLength, sched.FinishContext:
		return batonv1.FinishReason_FINISH_REASON_LENGTH, nil
	case sched.FinishCancelled:
		return 0, svckit.Errorf(context.Canceled, "request cancelled: %v", ev.Err)
	case sched.FinishAborted:
		if errors.Is(ev.Err, sched.ErrClosed) {
			return 0, svckit.Errorf(sched.ErrClosed, "decode worker shutting down: %w", ev.Err)
		}
		return 0, svckit.Errorf(sched.ErrSlowConsumer, "%w", ev.Err) // the scheduler's other abort: ABORTED
	}
	return 0, svckit.Errorf(ev.Err, "request failed: %w", ev.Err)
}

// releaseWait bounds how long a failed request waits for the scheduler to
// release it before the RPC ends (the release happens at the next step
// boundary; the bound only matters for a stalled scheduler).
const releaseWait = 2 * time.Second

// awaitRelease drains st until the scheduler has released the request, or
// for at most d; what is left is drained in the background.
func awaitRelease(st *sched.Stream, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		select {
		case _, ok := <-st.Events():
			if !ok {
				return
			}
		case <-t.C:
			drain(st)
			return
		}
	}
}

// drain consumes a request's remaining events so that its release is
// observed; the scheduler never blocks on them, this only keeps the order of
// logs and metrics tidy.
func drain(st *sched.Stream) {
	go func() {
		for range st.Events() {
		}
	}()
}

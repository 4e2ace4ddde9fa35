package decode

import (
	"context"
	"errors"
	"time"

	"github.com/baton-serving/baton/engine/kvcache"
	"github.com/baton-serving/baton/engine/sched"
	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"github.com/baton-serving/baton/tracing"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/status"
)

// reserve waits in the prealloc queue for the request's pages (the
// prealloc_wait span, from the request's arrival at start) and returns them.
func reserve(ctx context.Context, st *sched.Stream, timing *batonv1.Timing, start time.Time) ([]kvcache.PageID, error) {
	_, wait := tracing.Start(ctx, tracing.SpanPreallocWait, trace.WithTimestamp(start))
	pages, err := waitReserved(ctx, st)
	if err != nil {
		tracing.EndAborted(ctx, wait, tracing.SpanPreallocWait, err)
		return nil, err
	}
	wait.SetAttributes(tracing.AttrKVPages.Int(len(pages)))
	wait.End()
	timing.PreallocWaitSeconds = time.Since(start).Seconds()
	return pages, nil
}

// waitReserved waits for the scheduler's EventReserved.
func waitReserved(ctx context.Context, st *sched.Stream) ([]kvcache.PageID, error) {
	for {
		select {
		case ev, ok := <-st.Events():
			if !ok {
				return nil, errors.New("request ended before its pages were reserved") // a scheduler bug: INTERNAL
			}
			switch ev.Kind {
			case sched.EventReserved:
				return ev.Pages, nil
			case sched.EventDone:
				_, err := finish(ev)
				if err == nil {
					err = errors.New("request finished before its pages were reserved")
				}
				return nil, err
			}
		case <-ctx.Done():
			return nil, status.FromContextError(ctx.Err()).Err()
		}
	}
}

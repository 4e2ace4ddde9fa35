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

// reserved is a PD request's block table at decode: held leading pages
// already hold the prompt's keys and values (the prefix cache had them),
// the rest await the transfer.
type reserved struct {
	pages []kvcache.PageID
	held  int
}

// reserve waits in the prealloc queue for the request's pages (the
// prealloc_wait span, from the request's arrival at start) and returns them.
func reserve(ctx context.Context, st *sched.Stream, timing *batonv1.Timing, start time.Time) (reserved, error) {
	_, wait := tracing.Start(ctx, tracing.SpanPreallocWait, trace.WithTimestamp(start))
	res, err := waitReserved(ctx, st)
	if err != nil {
		tracing.EndAborted(ctx, wait, tracing.SpanPreallocWait, err)
		return reserved{}, err
	}
	wait.SetAttributes(tracing.AttrKVPages.Int(len(res.pages)), tracing.AttrKVPagesHeld.Int(res.held))
	wait.End()
	timing.PreallocWaitSeconds = time.Since(start).Seconds()
	return res, nil
}

// waitReserved waits for the scheduler's EventReserved.
func waitReserved(ctx context.Context, st *sched.Stream) (reserved, error) {
	for {
		select {
		case ev, ok := <-st.Events():
			if !ok {
				return reserved{}, errors.New("request ended before its pages were reserved") // a scheduler bug: INTERNAL
			}
			switch ev.Kind {
			case sched.EventReserved:
				return reserved{ev.Pages, ev.Held}, nil
			case sched.EventDone:
				_, err := finish(ev)
				if err == nil {
					err = errors.New("request finished before its pages were reserved")
				}
				return reserved{}, err
			}
		case <-ctx.Done():
			return reserved{}, status.FromContextError(ctx.Err()).Err()
		}
	}
}

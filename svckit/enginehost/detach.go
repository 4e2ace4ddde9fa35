package enginehost

import "context"

// Detach returns a context that keeps ctx's values (its trace span, its
// request labels) but neither its deadline nor its cancellation: it ends
// only when the returned function is called.
//
// A worker hands it to what must outlive the RPC that started it until the
// worker itself has stopped using what that thing guards. The scheduler
// request is the first such: its KV pages may be released only once no
// transfer reads or writes them any more, so it is cancelled after the
// transfer has stopped, not when the caller goes away. decode's TransferKV
// stream is the second: on a cancel decode still has to ask prefill to stop
// and hear its answer over it. The cause given to the cancel function says
// why it ended (context.Cause), as for context.WithCancelCause.
func Detach(ctx context.Context) (context.Context, context.CancelCauseFunc) {
	return context.WithCancelCause(context.WithoutCancel(ctx))
}

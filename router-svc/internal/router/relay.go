package router

// One attempt of a request on its (prefill, decode) pair: the decode
// worker's stream relayed to the client, the echoed prompt held back until
// the first token so that a failed attempt can be retried unseen.

import (
	"context"
	"errors"
	"io"
	"time"

	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"github.com/baton-serving/baton/router-svc/internal/clientwrite"
	"github.com/baton-serving/baton/router-svc/internal/workers"
	"github.com/baton-serving/baton/svckit/canarylabel"
	"github.com/baton-serving/baton/tracing"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// relay runs the request on the pair's decode worker (which pulls the KV
// cache from its prefill worker) and forwards its events. Events before the
// first token (the echoed prompt) are held back until it comes, so that an
// attempt that fails before then can be retried on another pair without the
// client seeing anything twice. started reports whether any event reached
// the client.
func (s *Service) relay(ctx context.Context, r *request, req *batonv1.GenerateRequest, pair *workers.Pair, start time.Time, sendClient func(*batonv1.GenerateEvent) error) (started bool, err error) {
	// The request's end (an Abort, its deadline) must free a send blocked
	// on a client that does not read, which the context cannot reach.
	defer clientwrite.InterruptOnDone(ctx)()
	r.endedBy.Store(nil) // this attempt's, if it fails
	ctx, span := tracing.Start(ctx, tracing.SpanStream)
	defer func() {
		span.SetAttributes(tracing.AttrTokens.Int64(r.generated.Load()))
		tracing.RecordError(span, err)
		span.End()
	}()
	// A worker the router loses (its connection broke, or its load
	// reports stopped) ends the attempt at once rather than leave it
	// waiting on a peer that is gone; the prefill worker matters only
	// until the first token, when its part is done.
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	//
	// Until the first token, a worker of the pair that reports NOT_SERVING
	// (stalled, draining) ends the attempt too, so that the request is
	// retried elsewhere; after it, the request stays and ends at its own
	// deadline if the worker never resumes.
	follow := func(sig context.Context, w *workers.Worker) (stop func() bool) {
		return context.AfterFunc(sig, func() {
			r.endedBy.CompareAndSwap(nil, &w.Addr)
			cancel(context.Cause(sig))
		})
	}
	defer follow(pair.Decode.Lost(), pair.Decode)()
	stopDecodeServing := follow(pair.Decode.NotServing(), pair.Decode)
	defer stopDecodeServing()
	stops := []func() bool{stopDecodeServing}
	if pair.Prefill != nil {
		stops = append(stops, follow(pair.Prefill.Lost(), pair.Prefill), follow(pair.Prefill.NotServing(), pair.Prefill))
	}
	stopPrefill := func() {
		for _, stop := range stops {
			stop()
		}
	}
	defer stopPrefill()
	dc := pair.Decode
	stream, err := batonv1.NewDecodeServiceClient(dc.Conn()).Generate(ctx, &batonv1.DecodeServiceGenerateRequest{
		Request: req, PrefillEndpoint: pair.PrefillAddr(), Attempt: r.attempts.Add(1), Origin: r.origin})
	if err != nil {
		r.endedBy.CompareAndSwap(nil, &dc.Addr)
		return false, attemptErr(ctx, dc, err)
	}
	r.setState(batonv1.RequestState_REQUEST_STATE_PREALLOC)
	var first time.Time
	var held []*batonv1.GenerateEvent
	send := r.clientSender(sendClient, dc.Addr)
	forward := func(ev *batonv1.GenerateEvent) error {
		for _, h := range held {
			if err := send(h); err != nil {
				return err
			}
			started = true
		}
		held = nil
		if ev == nil {
			return nil
		}
		if err := send(ev); err != nil {
			return err
		}
		started = true
		return nil
	}
	for {
		resp, err := stream.Recv()
		if err == io.EOF {
			// The held events go out now. A failed send ends the request
			// as the client's failure (a slow client's DEADLINE_EXCEEDED),
			// never as a retryable attempt: started, whatever reached the
			// client.
			if err := forward(nil); err != nil {
				return true, err
			}
			return started, nil
		}
		if err != nil {
			r.endedBy.CompareAndSwap(nil, &dc.Addr)
			return started, attemptErr(ctx, dc, err)
		}
		ev := resp.GetEvent()
		now := time.Now()
		done := ev.GetFinishReason() != batonv1.FinishReason_FINISH_REASON_UNSPECIFIED
		if len(ev.GetTokenIds()) > 0 {
			if first.IsZero() {
				first = now
				span.AddEvent(tracing.EventFirstToken)
				if !canarylabel.Is(r.id) { // a self-probe is no user traffic
					s.metrics.ttft.Observe(now.Sub(start).Seconds())
				}
				r.setState(batonv1.RequestState_REQUEST_STATE_RUNNING)
				stopPrefill()
				pair.ReleasePrefill()
			}
			r.generated.Add(int64(len(ev.GetTokenIds())))
			r.progress.Store(now.UnixNano())
		} else if first.IsZero() && !done {
			held = append(held, ev)
			continue
		}
		if done {
			if ev.Timing == nil {
				ev.Timing = &batonv1.Timing{}
			}
			if !first.IsZero() {
				ev.Timing.TimeToFirstTokenSeconds = first.Sub(start).Seconds()
			}
			ev.Timing.E2ESeconds = now.Sub(start).Seconds()
			if !req.GetStreamOptions().GetIncludeTiming() {
				ev.Timing = nil
			}
		}
		if err := forward(ev); err != nil {
			return true, err
		}
	}
}

// attemptErr is the status of a failed attempt on decode worker dc: the
// worker's own status, naming the worker; or UNAVAILABLE with the reason
// when the router lost one of the pair's workers or one reported
// NOT_SERVING before the first token (the cause of ctx).
func attemptErr(ctx context.Context, dc *workers.Worker, err error) error {
	if cause := context.Cause(ctx); errors.Is(cause, workers.ErrLost) || errors.Is(cause, workers.ErrNotServing) {
		return status.Error(codes.Unavailable, cause.Error())
	}
	st := status.Convert(err)
	return status.Errorf(st.Code(), "decode %s: %s", dc.Addr, st.Message())
}

// clientSender is how a relay hands r's events to its client (sendClient),
// noting who is to blame when that fails: the client (it left, or could not
// take them), or the decode worker at addr when what it sent could not be
// passed on (a workerFault, see withTokenText).
func (r *request) clientSender(sendClient func(*batonv1.GenerateEvent) error, addr string) func(*batonv1.GenerateEvent) error {
	return func(ev *batonv1.GenerateEvent) error {
		r.sending.Store(true)
		defer r.sending.Store(false)
		err := sendClient(ev)
		var wf *workerFault
		switch {
		case errors.As(err, &wf):
			r.endedBy.CompareAndSwap(nil, &addr)
		case err != nil:
			r.sendFailed.Store(true)
		}
		return err
	}
}

// workerFault is an event the router could not pass on because of what the
// worker sent (or failed to send) in it, not because of the client; its
// gRPC status is the wrapped error's.
type workerFault struct{ err error }

func (f *workerFault) Error() string              { return f.err.Error() }
func (f *workerFault) Unwrap() error              { return f.err }
func (f *workerFault) GRPCStatus() *status.Status { return status.Convert(f.err) }

package router

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"github.com/baton-serving/baton/router-svc/internal/workers"
	"github.com/baton-serving/baton/tracing"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// localPrefill is the prefill endpoint that asks decode to compute the
// prompt itself (colocated mode).
const localPrefill = "local"

// errAborted is the cancel cause of a request ended by the Abort RPC.
var errAborted = errors.New("aborted by an Abort call")

// Generate streams a completion.
func (s *Service) Generate(in *batonv1.GenerateRequest, stream batonv1.RouterService_GenerateServer) error {
	return s.run(stream.Context(), in, func(ev *batonv1.GenerateEvent) error {
		return stream.Send(&batonv1.GenerateResponse{Event: ev})
	})
}

// Complete returns a whole completion.
func (s *Service) Complete(ctx context.Context, in *batonv1.CompleteRequest) (*batonv1.CompleteResponse, error) {
	out := &batonv1.CompleteResponse{}
	var text strings.Builder
	err := s.run(ctx, in.GetRequest(), func(ev *batonv1.GenerateEvent) error {
		if out.RequestId == "" {
			out.RequestId = ev.GetRequestId()
		}
		if len(ev.GetPromptTokenIds()) > 0 {
			out.PromptTokenIds = ev.GetPromptTokenIds()
		}
		out.TokenIds = append(out.TokenIds, ev.GetTokenIds()...)
		text.WriteString(ev.GetText())
		out.Logprobs = append(out.Logprobs, ev.GetLogprobs()...)
		if ev.GetFinishReason() != batonv1.FinishReason_FINISH_REASON_UNSPECIFIED {
			out.FinishReason, out.StopReason, out.Usage, out.Timing = ev.GetFinishReason(), ev.GetStopReason(), ev.GetUsage(), ev.GetTiming()
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	out.Text = text.String()
	return out, nil
}

// run validates, registers and routes one request, passing its events to
// send. The request's resources at the router (its in-flight entry and its
// workers' counts) are released when run returns, whatever happens.
func (s *Service) run(ctx context.Context, in *batonv1.GenerateRequest, send func(*batonv1.GenerateEvent) error) (err error) {
	start := time.Now()
	defer func() { s.metrics.observeEnd(err, time.Since(start)) }()
	if s.Draining() {
		return status.Error(codes.Unavailable, "router is shutting down")
	}
	release, err := s.limit.acquire()
	if err != nil {
		return err
	}
	defer release()
	if t := s.limits.requestTimeout; t > 0 {
		var stop context.CancelFunc
		ctx, stop = context.WithTimeout(ctx, t)
		defer stop()
	}
	req, err := s.prepare(in)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	r := &request{id: req.GetRequestId(), start: start, cancel: cancel, promptTokens: len(req.GetPromptTokenIds())}
	if p, ok := peer.FromContext(ctx); ok {
		r.peer = p.Addr.String()
	}
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		r.traceID = sc.TraceID().String()
	}
	r.setState(batonv1.RequestState_REQUEST_STATE_ROUTING)
	remove, err := s.inflight.add(r)
	if err != nil {
		return err
	}
	defer remove()
	log := s.logger.With("request_id", r.id)
	trace.SpanFromContext(ctx).SetAttributes(tracing.AttrRequestID.String(r.id))

	var tried []string
	for attempt := 0; ; attempt++ {
		actx, route := tracing.Start(ctx, tracing.SpanRoute, trace.WithAttributes(
			tracing.AttrAttempt.Int(attempt), tracing.AttrRetry.Bool(attempt > 0),
			tracing.AttrPolicy.String(s.prefillPolicyName+"/"+s.decPolicy)))
		pf, dc, err := s.pick(tried)
		if err != nil {
			tracing.EndAborted(ctx, route, tracing.SpanRoute, err)
			return err
		}
		route.SetAttributes(tracing.AttrPrefill.String(endpoint(pf)), tracing.AttrDecode.String(dc.Addr))
		desc := fmt.Sprintf("prefill=%s decode=%s", endpoint(pf), dc.Addr)
		r.workers.Store(&desc)
		log.InfoContext(actx, "routed", "prefill", endpoint(pf), "decode", dc.Addr, "attempt", attempt)
		started, err := s.relay(actx, r, req, pf, dc, start, send)
		endRoute(ctx, route, started, err, attempt)
		if err == nil {
			return nil
		}
		if cause := context.Cause(ctx); errors.Is(cause, errAborted) {
			return status.Errorf(codes.Aborted, "request %s: %v", r.id, cause)
		}
		if ctx.Err() != nil {
			return status.FromContextError(ctx.Err()).Err()
		}
		retry := !started && attempt == 0 && status.Code(err) == codes.Unavailable
		log.WarnContext(actx, "worker pair failed", "prefill", endpoint(pf), "decode", dc.Addr, "err", err, "retry", retry)
		if !retry {
			return err
		}
		tried = append(tried, dc.Addr, endpoint(pf))
	}
}

func endpoint(w *workers.Worker) string {
	if w == nil {
		return localPrefill
	}
	return w.Addr
}

// pick chooses a ready (prefill, decode) pair by policy, avoiding workers in
// avoid when others are ready. A nil prefill means colocated mode.
func (s *Service) pick(avoid []string) (*workers.Worker, *workers.Worker, error) {
	choose := func(set *workers.Set, pol workers.Policy) (*workers.Worker, error) {
		ready := set.Ready()
		var fresh []*workers.Worker
		for _, w := range ready {
			if !contains(avoid, w.Addr) {
				fresh = append(fresh, w)
			}
		}
		if len(fresh) > 0 {
			ready = fresh
		}
		if w := pol.Pick(ready); w != nil {
			return w, nil
		}
		var why []string
		for _, w := range set.Workers {
			reason := w.LastError()
			if reason == "" {
				reason = "not ready"
			}
			why = append(why, w.Addr+": "+reason)
		}
		return nil, status.Errorf(codes.Unavailable, "no ready %s worker (%s)", roleName(set.Role), strings.Join(why, "; "))
	}
	var pf *workers.Worker
	if s.prefills != nil {
		var err error
		if pf, err = choose(s.prefills, s.prefillPolicy); err != nil {
			return nil, nil, err
		}
	}
	dc, err := choose(s.decodes, s.decodePolicy)
	return pf, dc, err
}

func roleName(r batonv1.WorkerRole) string {
	if r == batonv1.WorkerRole_WORKER_ROLE_PREFILL {
		return "prefill"
	}
	return "decode"
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

// relay runs the request on decode dc (pulling KV from pf) and forwards its
// events. started reports whether any event reached the client.
func (s *Service) relay(ctx context.Context, r *request, req *batonv1.GenerateRequest, pf, dc *workers.Worker, start time.Time, send func(*batonv1.GenerateEvent) error) (started bool, err error) {
	ctx, span := tracing.Start(ctx, tracing.SpanStream)
	defer func() {
		span.SetAttributes(tracing.AttrTokens.Int64(r.generated.Load()))
		tracing.RecordError(span, err)
		span.End()
	}()
	releaseD := dc.Acquire()
	defer releaseD()
	if pf != nil {
		releaseP := pf.Acquire()
		defer releaseP()
	}
	stream, err := batonv1.NewDecodeServiceClient(dc.Conn).Generate(ctx, &batonv1.DecodeServiceGenerateRequest{
		Request: req, PrefillEndpoint: endpoint(pf)})
	if err != nil {
		return false, workerErr(dc, err)
	}
	r.setState(batonv1.RequestState_REQUEST_STATE_PREALLOC)
	var first time.Time
	for {
		resp, err := stream.Recv()
		if err == io.EOF {
			return started, nil
		}
		if err != nil {
			return started, workerErr(dc, err)
		}
		ev := resp.GetEvent()
		now := time.Now()
		if len(ev.GetTokenIds()) > 0 {
			if first.IsZero() {
				first = now
				span.AddEvent(tracing.EventFirstToken)
				s.metrics.ttft.Observe(now.Sub(start).Seconds())
				r.setState(batonv1.RequestState_REQUEST_STATE_RUNNING)
			}
			r.generated.Add(int64(len(ev.GetTokenIds())))
			r.progress.Store(now.UnixNano())
		}
		if ev.GetFinishReason() != batonv1.FinishReason_FINISH_REASON_UNSPECIFIED {
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
		if err := send(ev); err != nil {
			return true, err
		}
		started = true
	}
}

// endRoute ends an attempt's route span. A failed attempt that is retried on
// another pair is an error; one that ends the request (cancelled, aborted,
// failed for good) is an abort in stage stream, where relay runs. The retry
// test is run's.
func endRoute(ctx context.Context, span trace.Span, started bool, err error, attempt int) {
	if err != nil && ctx.Err() == nil && !started && attempt == 0 && status.Code(err) == codes.Unavailable {
		tracing.RecordError(span, err)
		span.End()
		return
	}
	tracing.EndAborted(ctx, span, tracing.SpanStream, err)
}

// workerErr keeps a worker's status code and names the worker in the message.
func workerErr(w *workers.Worker, err error) error {
	st := status.Convert(err)
	return status.Errorf(st.Code(), "decode %s: %s", w.Addr, st.Message())
}

package prefill

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/baton-serving/baton/engine/sched"
	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"github.com/baton-serving/baton/kvtransfer"
	"github.com/baton-serving/baton/svckit"
	"github.com/baton-serving/baton/svckit/canarylabel"
	"github.com/baton-serving/baton/svckit/enginehost"
	"github.com/baton-serving/baton/tracing"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/status"
)

// TransferKV serves one request from a decode worker: handshake
// (awaitHandshake, checkHandshake), the prompt queued and computed in the
// batch (Submit; follow), chunks as pages complete and PrefillDone (the
// sender's Run), or AbortAck (followDecode) / Error; then the release. The
// request's pages are released when the handover ends, however it ends.
func (s *Service) TransferKV(stream batonv1.PrefillService_TransferKVServer) error {
	ctx, cancel := context.WithCancelCause(stream.Context())
	defer cancel(nil)

	// One goroutine receives for the whole stream, so every wait here can
	// have its own deadline. It ends when the stream does (Recv fails once
	// this handler has returned, at the latest), closing msgs.
	msgs := make(chan *batonv1.TransferKVRequest, 4)
	go func() {
		defer close(msgs)
		for {
			m, err := stream.Recv()
			if err != nil {
				cancel(fmt.Errorf("decode closed the stream: %w", err))
				return
			}
			select {
			case msgs <- m:
			case <-ctx.Done():
				return
			}
		}
	}()

	hs, err := s.awaitHandshake(ctx, msgs)
	if err != nil {
		return err
	}
	req, err := s.checkHandshake(hs)
	if err != nil {
		return err
	}
	if dl := hs.GetDeadline(); dl != nil {
		var c context.CancelFunc
		ctx, c = context.WithDeadline(ctx, dl.AsTime())
		defer c()
	}
	log := s.Logger.With("request_id", req.ID)
	if _, canary := canarylabel.Label(ctx, req.ID); canary {
		log = log.With("canary", true)
	}
	trace.SpanFromContext(ctx).SetAttributes(tracing.AttrRequestID.String(req.ID), tracing.AttrPromptTokens.Int(len(req.Prompt)))
	defer s.Host.TraceRequest(ctx, req.ID)()

	// Cancelled only once the sender has stopped reading the request's
	// pages, so that pages are never freed under a send.
	schedCtx, schedCancel := enginehost.Detach(ctx)
	defer schedCancel(nil)
	prev, drop, err := s.live.claim(req.ID, hs.GetOrigin(), hs.GetAttempt(), cancel)
	if err != nil {
		return svckit.Status(err)
	}
	defer drop()
	submitted := time.Now()
	st, err := s.submit(ctx, schedCtx, req, prev)
	if err != nil {
		return svckit.Status(err)
	}
	start := time.Now()
	pt := &prefillTrace{ctx: ctx, steps: s.Host.Steps(), submitted: submitted,
		pageTokens: s.Host.Layout.PageSize, promptTokens: len(req.Prompt)}
	if err := stream.Send(&batonv1.TransferKVResponse{Msg: &batonv1.TransferKVResponse_Accepted{Accepted: &batonv1.Accepted{
		// Decode holds these pages (checkHeldPages): only the rest goes.
		SkippedPages: uint32(len(hs.GetCachedPageHashes()))}}}); err != nil {
		return err
	}
	src := kvtransfer.NewPoolSource(s.Host.Pool)
	snd := kvtransfer.NewSender(kvtransfer.SenderConfig{
		Layout: s.Host.Layout, PromptTokens: len(req.Prompt), InitialCredits: int(hs.GetInitialCredits()),
		FirstPage:     len(hs.GetCachedPageHashes()),
		CreditTimeout: s.IdleTimeout, Codec: s.Codec,
		// A send stuck on gRPC flow control (decode stopped reading,
		// the network black-holed) gets the same deadline.
		SendTimeout: s.IdleTimeout,
		// Decode's idle deadline must not fire while this request waits
		// in the queue or its prompt computes: heartbeats as often as
		// decode asks, else every quarter of our own idle deadline.
		Heartbeat: heartbeat(hs, s.IdleTimeout),
	}, src, stream)

	// Neither goroutine is waited for: followDecode ends when msgs closes
	// (with the stream), follow when the scheduler releases the request
	// (after the release below, at its next step boundary). Neither touches
	// the stream, and the pages only as the sender's source, which the
	// release below comes after.
	go followDecode(ctx, log, msgs, snd, pt)
	promptDone := make(chan struct{})
	go follow(st, len(req.Prompt), src, snd, start, promptDone, pt)

	// Pages go as they complete, so kv_send may overlap forward.
	_, sendSpan := tracing.Start(ctx, tracing.SpanKVSend)
	runErr := snd.Run(ctx)
	sentChunks, sentBytes := snd.Stats()
	sendSpan.SetAttributes(tracing.AttrKVChunks.Int64(int64(sentChunks)), tracing.AttrKVBytes.Int64(int64(sentBytes)))
	pt.endSend(ctx, sendSpan, runErr) // before cancel(nil) hides why ctx ended
	// How the send ended, before release and cancel(nil) add their own
	// ends: ctx ended by then whatever ended the send.
	ended, failed := ctx.Err(), pt.failure()
	release(st, promptDone, runErr == nil, schedCancel)
	cancel(nil)
	return s.result(ctx, log, req.ID, snd, runErr, ended, failed, start)
}

// release ends the request at the scheduler once the sender no longer
// touches its pages: handed over when the prompt is done and the transfer
// delivered it (sent is the sender's success: decode holds its copy),
// cancelled otherwise — a decode that aborted, vanished or stalled after
// the last page was computed got no copy, and baton_requests_finished_total
// must not count it handed over.
func release(st *sched.Stream, promptDone <-chan struct{}, sent bool, schedCancel context.CancelCauseFunc) {
	select {
	case <-promptDone:
		if sent {
			_ = st.Handover()
			return
		}
	default:
	}
	schedCancel(nil)
}

// result records the transfer and maps how the sender ended to the RPC's
// status: a transfer decode aborted (and was told so) is no error here.
// ended is the transfer context's error when the sender returned (nil when
// it was still live), failed the scheduler's error for the request (nil if
// none): the status of a send that ended on its own is the failure's, not
// the CANCELED that the handler's own cancel would make of it.
func (s *Service) result(ctx context.Context, log *slog.Logger, id string, snd *kvtransfer.Sender, runErr, ended, failed error, start time.Time) error {
	chunks, bytes := snd.Stats()
	s.Host.Metrics.KVTransferBytes.Add(float64(bytes))
	switch {
	case runErr == nil:
		s.Host.Metrics.TransferDone(id, time.Since(start))
		log.DebugContext(ctx, "transfer done", "chunks", chunks, "bytes", bytes, "took", time.Since(start).String())
		return nil
	case errors.Is(runErr, kvtransfer.ErrAborted):
		return nil
	case errors.Is(context.Cause(ctx), svckit.ErrSuperseded):
		log.InfoContext(ctx, "transfer replaced by a newer attempt; releasing", "chunks", chunks)
		return svckit.Status(context.Cause(ctx))
	case errors.Is(runErr, kvtransfer.ErrStalled):
		log.WarnContext(ctx, "transfer stalled; releasing", "err", runErr, "chunks", chunks)
		return svckit.Status(runErr)
	default:
		log.InfoContext(ctx, "transfer ended early", "err", runErr, "cause", context.Cause(ctx), "chunks", chunks)
		if ended != nil {
			return status.FromContextError(ended).Err()
		}
		if failed != nil {
			// Decode got the failure's code in an Error message; the
			// stream's status says the same.
			return svckit.Status(svckit.Errorf(failed, "%v", runErr))
		}
		return svckit.Status(runErr)
	}
}

// heartbeat is the Progress interval for a transfer: decode's request, or a
// quarter of prefill's own idle deadline when decode names none.
func heartbeat(hs *batonv1.Handshake, idle time.Duration) time.Duration {
	if ms := hs.GetHeartbeatMs(); ms > 0 {
		return time.Duration(ms) * time.Millisecond
	}
	return idle / 4
}

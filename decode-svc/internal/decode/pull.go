package decode

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/baton-serving/baton/engine/kvcache"
	"github.com/baton-serving/baton/engine/sample"
	"github.com/baton-serving/baton/engine/sched"
	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"github.com/baton-serving/baton/kvtransfer"
	"github.com/baton-serving/baton/svckit/apiconv"
	"github.com/baton-serving/baton/tracing"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// pull waits for the request's pages to be reserved (the prealloc queue),
// then streams the prompt's KV cache into them from the prefill worker and
// activates the request with prefill's first token. When pull returns, no
// transfer writes the pages any more, whatever happened.
func (s *Service) pull(ctx context.Context, log *slog.Logger, in *batonv1.DecodeServiceGenerateRequest, st *sched.Stream, timing *batonv1.Timing, start time.Time) (err error) {
	endpoint := in.GetPrefillEndpoint()
	_, wait := tracing.Start(ctx, tracing.SpanPreallocWait, trace.WithTimestamp(start))
	pages, err := waitReserved(ctx, st)
	if err != nil {
		tracing.EndAborted(ctx, wait, tracing.SpanPreallocWait, err)
		return err
	}
	wait.SetAttributes(tracing.AttrKVPages.Int(len(pages)))
	wait.End()
	timing.PreallocWaitSeconds = time.Since(start).Seconds()
	// The transfer, the TransferKV call included, is the kv_receive span.
	ctx, recv := tracing.Start(ctx, tracing.SpanKVReceive, trace.WithAttributes(tracing.AttrPrefill.String(endpoint),
		tracing.AttrKVPages.Int(len(pages)), tracing.AttrPromptTokens.Int(len(in.GetRequest().GetPromptTokenIds()))))
	var rcv *kvtransfer.Receiver
	defer func() {
		if rcv != nil {
			recv.SetAttributes(tracing.AttrKVBytes.Int64(int64(rcv.Bytes())), tracing.AttrKVChunks.Int64(int64(rcv.Chunks())))
		}
		tracing.EndAborted(ctx, recv, tracing.SpanKVReceive, err)
	}()
	conn, err := s.peers.get(endpoint)
	if err != nil {
		return status.Errorf(codes.Unavailable, "prefill %s: %v", endpoint, err)
	}
	// The transfer stream is not tied to the caller's context: on a cancel,
	// decode first asks prefill to stop (Abort) and waits for its answer, so
	// that both sides know the request is over.
	tctx, tcancel := context.WithCancelCause(context.WithoutCancel(ctx))
	defer tcancel(nil)
	// Until prefill accepts, the handshake timeout covers everything,
	// connecting included: a prefill that accepts TCP but never answers
	// must not hold the request.
	errNoAccept := fmt.Errorf("prefill %s did not accept the transfer within %v", endpoint, s.handshakeTimeout)
	hsTimer := time.AfterFunc(s.handshakeTimeout, func() { tcancel(errNoAccept) })
	defer hsTimer.Stop()
	if dl, ok := ctx.Deadline(); ok {
		var c context.CancelFunc
		tctx, c = context.WithDeadline(tctx, dl.Add(s.abortTimeout))
		defer c()
	}
	stream, err := batonv1.NewPrefillServiceClient(conn).TransferKV(tctx, s.codec.CallOption())
	if err != nil {
		if context.Cause(tctx) == errNoAccept {
			return status.Error(codes.DeadlineExceeded, errNoAccept.Error())
		}
		return status.Errorf(codes.Unavailable, "prefill %s: %v", endpoint, err)
	}
	r := in.GetRequest()
	rcv = kvtransfer.NewReceiver(s.host.Layout, len(r.GetPromptTokenIds()), s.creditWindow, &pageSink{pool: s.host.Pool, pages: pages})
	hs := &batonv1.Handshake{
		RequestId: r.GetRequestId(), PromptTokenIds: r.GetPromptTokenIds(), Sampling: r.GetSampling(),
		ModelFingerprint: s.host.Fingerprint, KvLayout: s.host.Layout.Proto(),
		PagesReserved: uint32(len(pages)), InitialCredits: uint32(rcv.Window()),
		// Four heartbeats per idle deadline: a busy prefill never looks
		// silent, a lost one still does.
		HeartbeatMs: uint32(max(1, (s.idleTimeout / 4).Milliseconds())),
	}
	if dl, ok := ctx.Deadline(); ok {
		hs.Deadline = timestamppb.New(dl)
	}
	if err := stream.Send(&batonv1.TransferKVRequest{Msg: &batonv1.TransferKVRequest_Handshake{Handshake: hs}}); err != nil && !errors.Is(err, io.EOF) {
		return status.Errorf(codes.Unavailable, "prefill %s: handshake: %v", endpoint, err)
	}

	msgs := make(chan transferMsg, 8)
	go func() { // ends when the stream does (tcancel at the latest)
		defer close(msgs)
		for {
			m, err := stream.Recv()
			select {
			case msgs <- transferMsg{m, err}:
			case <-tctx.Done():
				return
			}
			if err != nil {
				return
			}
		}
	}()
	transferStart := time.Now()
	idle := time.NewTimer(s.handshakeTimeout)
	defer idle.Stop()
	waitingFor := "accept the transfer"
	for {
		select {
		case <-ctx.Done():
			s.abort(log, stream, msgs, context.Cause(ctx).Error())
			return status.FromContextError(ctx.Err()).Err()
		case <-idle.C:
			s.abort(log, stream, msgs, "transfer idle")
			return status.Errorf(codes.DeadlineExceeded, "prefill %s did not %s within %v", endpoint, waitingFor, s.idleTimeout)
		case rm, ok := <-msgs:
			if !ok {
				if context.Cause(tctx) == errNoAccept {
					return status.Error(codes.DeadlineExceeded, errNoAccept.Error())
				}
				return status.Errorf(codes.Unavailable, "prefill %s: stream ended", endpoint)
			}
			if rm.err != nil {
				if context.Cause(tctx) == errNoAccept {
					return status.Error(codes.DeadlineExceeded, errNoAccept.Error())
				}
				if rm.err == io.EOF {
					return status.Errorf(codes.Unavailable, "prefill %s ended the transfer without PrefillDone", endpoint)
				}
				st := status.Convert(rm.err)
				return status.Errorf(st.Code(), "prefill %s: %s", endpoint, st.Message())
			}
			hsTimer.Stop()
			idle.Reset(s.idleTimeout)
			waitingFor = "send the next KV chunk"
			switch m := rm.m.Msg.(type) {
			case *batonv1.TransferKVResponse_Accepted:
				recv.AddEvent(tracing.EventAccepted)
			case *batonv1.TransferKVResponse_Progress:
				// Prefill is busy with the request: the idle deadline
				// restarts (above); the first-token deadline still runs.
			case *batonv1.TransferKVResponse_KvChunk:
				grant, err := rcv.Chunk(m.KvChunk)
				s.codec.Release(m.KvChunk) // the bytes are in the pages now
				if err != nil {
					s.abort(log, stream, msgs, "bad chunk")
					return status.Errorf(codes.DataLoss, "prefill %s: %v", endpoint, err)
				}
				if grant > 0 {
					err := stream.Send(&batonv1.TransferKVRequest{Msg: &batonv1.TransferKVRequest_Credit{Credit: &batonv1.Credit{Chunks: uint32(grant)}}})
					if err != nil && !errors.Is(err, io.EOF) {
						return status.Errorf(codes.Unavailable, "prefill %s: %v", endpoint, err)
					}
				}
			case *batonv1.TransferKVResponse_PrefillDone:
				done := m.PrefillDone
				if err := rcv.Complete(done); err != nil {
					return status.Errorf(codes.DataLoss, "prefill %s: %v", endpoint, err)
				}
				_ = stream.CloseSend()
				s.host.Metrics.KVTransferBytes.Add(float64(rcv.Bytes()))
				s.host.Metrics.TransferDone(r.GetRequestId(), time.Since(transferStart))
				timing.PrefillSeconds, timing.KvTransferSeconds = done.GetPrefillSeconds(), time.Since(transferStart).Seconds()
				first := sample.Token{ID: int32(done.GetFirstTokenId()), Logprob: done.GetFirstTokenLogprob().GetLogprob()}
				for _, alt := range done.GetFirstTokenLogprob().GetTopLogprobs() {
					first.Top = append(first.Top, sample.TokenLogprob{ID: int32(alt.GetTokenId()), Logprob: alt.GetLogprob()})
				}
				if _, err := apiconv.TokenIDs("first_token_id", []uint32{done.GetFirstTokenId()}, s.host.Config.Vocab); err != nil {
					return status.Errorf(codes.DataLoss, "prefill %s: %v", endpoint, err)
				}
				log.DebugContext(ctx, "kv received", "chunks", rcv.Chunks(), "bytes", rcv.Bytes(), "took", time.Since(transferStart).String())
				if err := st.Activate(first); err != nil {
					return status.Errorf(codes.Internal, "activate: %v", err)
				}
				return nil
			case *batonv1.TransferKVResponse_Error:
				return status.Errorf(codes.Code(m.Error.GetCode()), "prefill %s: %s", endpoint, m.Error.GetMessage())
			default:
				return status.Errorf(codes.Internal, "prefill %s: unexpected %T", endpoint, m)
			}
		}
	}
}

// transferMsg is one Recv result of a TransferKV stream.
type transferMsg struct {
	m   *batonv1.TransferKVResponse
	err error
}

// abort asks prefill to stop and waits, up to the abort timeout, for its
// AbortAck or the end of the stream. Chunks still arriving are dropped: the
// caller writes no page after abort returns.
func (s *Service) abort(log *slog.Logger, stream batonv1.PrefillService_TransferKVClient, msgs <-chan transferMsg, reason string) {
	_ = stream.Send(&batonv1.TransferKVRequest{Msg: &batonv1.TransferKVRequest_Abort{Abort: &batonv1.Abort{Reason: reason}}})
	_ = stream.CloseSend()
	deadline := time.NewTimer(s.abortTimeout)
	defer deadline.Stop()
	for {
		select {
		case rm, ok := <-msgs:
			if !ok || rm.err != nil || rm.m.GetAbortAck() != nil {
				return
			}
		case <-deadline.C:
			log.WarnContext(stream.Context(), "prefill did not acknowledge an abort in time; closing the stream", "timeout", s.abortTimeout.String())
			return
		}
	}
}

// waitReserved waits in the prealloc queue for the request's pages.
func waitReserved(ctx context.Context, st *sched.Stream) ([]kvcache.PageID, error) {
	for {
		select {
		case ev, ok := <-st.Events():
			if !ok {
				return nil, status.Error(codes.Internal, "request ended before its pages were reserved")
			}
			switch ev.Kind {
			case sched.EventReserved:
				return ev.Pages, nil
			case sched.EventDone:
				_, err := finish(ev)
				if err == nil {
					err = status.Error(codes.Internal, "request finished before its pages were reserved")
				}
				return nil, err
			}
		case <-ctx.Done():
			return nil, status.FromContextError(ctx.Err()).Err()
		}
	}
}

// pageSink writes received chunks into the reserved pages.
type pageSink struct {
	pool  *kvcache.Pool
	pages []kvcache.PageID
}

// WritePage implements kvtransfer.PageSink.
func (p *pageSink) WritePage(page, lo, hi, tokens int, k, v []byte) error {
	if page >= len(p.pages) {
		return fmt.Errorf("page %d beyond the %d reserved", page, len(p.pages))
	}
	n := tokens * p.pool.Layout().RowBytes()
	for l := lo; l < hi; l++ {
		dk, dv := p.pool.PageBytes(p.pages[page], l)
		if dk == nil || n > len(dk) {
			return fmt.Errorf("page %d layer %d: %d bytes do not fit", page, l, n)
		}
		off := (l - lo) * n
		copy(dk[:n], k[off:off+n])
		copy(dv[:n], v[off:off+n])
	}
	return nil
}

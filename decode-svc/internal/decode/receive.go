package decode

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/baton-serving/baton/engine/sched"
	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"github.com/baton-serving/baton/svckit"
	"github.com/baton-serving/baton/svckit/apiconv"
	"github.com/baton-serving/baton/tracing"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// transferMsg is one Recv result of a TransferKV stream.
type transferMsg struct {
	m   *batonv1.TransferKVResponse
	err error
}

// receive follows the accepted transfer: chunks into the pages, credits
// back, until PrefillDone activates the request (complete). The request's
// context, --transfer-idle-timeout and a bad chunk end it early through
// abort; prefill's own end or error ends it as prefill said.
func (s *Service) receive(ctx context.Context, t *transfer, span trace.Span, st *sched.Stream, timing *batonv1.Timing) error {
	t.msgs = make(chan transferMsg, 8)
	go func() { // ends when the stream does (t.cancel at the latest)
		defer close(t.msgs)
		for {
			m, err := t.stream.Recv()
			select {
			case t.msgs <- transferMsg{m, err}:
			case <-t.ctx.Done():
				return
			}
			if err != nil {
				return
			}
		}
	}()
	transferStart := time.Now()
	idle := time.NewTimer(s.HandshakeTimeout)
	defer idle.Stop()
	waitingFor := "accept the transfer"
	for {
		select {
		case <-ctx.Done():
			s.abort(t, context.Cause(ctx).Error())
			return status.FromContextError(ctx.Err()).Err()
		case <-idle.C:
			s.abort(t, "transfer idle")
			return svckit.Errorf(svckit.ErrPeerTimeout, "prefill %s did not %s within %v", t.endpoint, waitingFor, s.IdleTimeout)
		case rm, ok := <-t.msgs:
			if !ok {
				if err := t.notAccepted(); err != nil {
					return err
				}
				return svckit.Errorf(svckit.ErrPeerUnavailable, "prefill %s: stream ended", t.endpoint)
			}
			if rm.err != nil {
				if err := t.notAccepted(); err != nil {
					return err
				}
				if rm.err == io.EOF {
					return svckit.Errorf(svckit.ErrPeerUnavailable, "prefill %s ended the transfer without PrefillDone", t.endpoint)
				}
				st := status.Convert(rm.err)
				return svckit.PeerErrorf(st.Code(), "prefill %s: %s", t.endpoint, st.Message())
			}
			t.hsTimer.Stop()
			idle.Reset(s.IdleTimeout)
			waitingFor = "send the next KV chunk"
			switch m := rm.m.Msg.(type) {
			case *batonv1.TransferKVResponse_Accepted:
				span.AddEvent(tracing.EventAccepted)
				if err := t.rcv.Skip(int(m.Accepted.GetSkippedPages())); err != nil {
					s.abort(t, "bad accept")
					return svckit.Errorf(svckit.ErrCorrupt, "prefill %s: %w", t.endpoint, err)
				}
			case *batonv1.TransferKVResponse_Progress:
				// Prefill is busy with the request: the idle deadline
				// restarts (above); the first-token deadline still runs.
			case *batonv1.TransferKVResponse_KvChunk:
				grant, err := t.rcv.Chunk(m.KvChunk)
				s.Codec.Release(m.KvChunk) // the bytes are in the pages now
				if err != nil {
					s.abort(t, "bad chunk")
					return svckit.Errorf(svckit.ErrCorrupt, "prefill %s: %w", t.endpoint, err)
				}
				if grant > 0 {
					err := t.stream.Send(&batonv1.TransferKVRequest{Msg: &batonv1.TransferKVRequest_Credit{Credit: &batonv1.Credit{Chunks: uint32(grant)}}})
					if err != nil && !errors.Is(err, io.EOF) {
						return svckit.Errorf(svckit.ErrPeerUnavailable, "prefill %s: %w", t.endpoint, err)
					}
				}
			case *batonv1.TransferKVResponse_PrefillDone:
				return s.complete(ctx, t, m.PrefillDone, st, timing, transferStart)
			case *batonv1.TransferKVResponse_Error:
				return svckit.PeerErrorf(codes.Code(m.Error.GetCode()), "prefill %s: %s", t.endpoint, m.Error.GetMessage())
			default:
				return fmt.Errorf("prefill %s: unexpected %T", t.endpoint, m) // a protocol bug: INTERNAL
			}
		}
	}
}

// complete checks prefill's PrefillDone against what arrived and activates
// the request with prefill's first token: the pages are decode's now.
func (s *Service) complete(ctx context.Context, t *transfer, done *batonv1.PrefillDone, st *sched.Stream, timing *batonv1.Timing, transferStart time.Time) error {
	if err := t.rcv.Complete(done); err != nil {
		return svckit.Errorf(svckit.ErrCorrupt, "prefill %s: %w", t.endpoint, err)
	}
	_ = t.stream.CloseSend()
	s.Host.Metrics.KVTransferBytes.Add(float64(t.rcv.Bytes()))
	s.Host.Metrics.TransferDone(st.ID(), time.Since(transferStart))
	timing.PrefillSeconds, timing.KvTransferSeconds = done.GetPrefillSeconds(), time.Since(transferStart).Seconds()
	timing.KvTransferBytes = t.rcv.Bytes()
	first := apiconv.TokenLogprob(done.GetFirstTokenLogprob())
	first.ID = int32(done.GetFirstTokenId())
	if _, err := apiconv.TokenIDs("first_token_id", []uint32{done.GetFirstTokenId()}, s.Host.Config.Vocab); err != nil {
		return svckit.Errorf(svckit.ErrCorrupt, "prefill %s: %w", t.endpoint, err)
	}
	if sp := t.request.GetSampling(); sp.GetPromptLogprobs() {
		lps := done.GetPromptLogprobs()
		if err := apiconv.CheckWirePromptLogprobs(lps, t.request.GetPromptTokenIds(), int(sp.GetTopLogprobs()), s.Host.Config.Vocab); err != nil {
			return svckit.Errorf(svckit.ErrCorrupt, "prefill %s: %w", t.endpoint, err)
		}
		t.promptLogprobs = lps
	}
	if c := done.GetCachedTokens(); c < uint32(len(t.request.GetPromptTokenIds())) {
		t.cachedTokens = int(c)
	} else {
		return svckit.Errorf(svckit.ErrCorrupt, "prefill %s: %d cached tokens of a %d-token prompt", t.endpoint, c, len(t.request.GetPromptTokenIds()))
	}
	t.log.DebugContext(ctx, "kv received", "chunks", t.rcv.Chunks(), "bytes", t.rcv.Bytes(), "took", time.Since(transferStart).String())
	if err := st.Activate(first); err != nil {
		return fmt.Errorf("activate: %v", err) // this worker's bug: INTERNAL (not the INVALID_ARGUMENT err wraps)
	}
	return nil
}

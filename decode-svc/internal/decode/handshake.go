package decode

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"github.com/baton-serving/baton/kvtransfer"
	"github.com/baton-serving/baton/svckit"
	"github.com/baton-serving/baton/svckit/enginehost"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// transfer is one KV transfer from a prefill worker into reserved pages,
// from the handshake to its end.
type transfer struct {
	endpoint string
	log      *slog.Logger
	// ctx is the stream's, detached from the request's: on a cancel decode
	// first asks prefill to stop (abort) and waits for its answer, so that
	// both sides know the request is over.
	ctx    context.Context
	cancel context.CancelCauseFunc
	// errNoAccept is ctx's cause when prefill did not accept within the
	// handshake timeout.
	errNoAccept error
	hsTimer     *time.Timer
	stops       []func()
	release     func() // the connection's use (peerPool.get)
	stream      batonv1.PrefillService_TransferKVClient
	rcv         *kvtransfer.Receiver // nil until the stream is open
	msgs        chan transferMsg     // the stream's messages (receive)
	// request is what the transfer computes; promptLogprobs are prefill's
	// for it, checked, when it asked (complete).
	request        *batonv1.GenerateRequest
	promptLogprobs []*batonv1.TokenLogprob
	// cachedTokens are the prompt tokens prefill reused from its prefix
	// cache (PrefillDone.cached_tokens): the request's cached tokens in PD.
	cachedTokens int
}

// close ends the stream and its timers.
func (t *transfer) close() {
	t.hsTimer.Stop()
	for _, stop := range t.stops {
		stop()
	}
	t.cancel(nil)
	t.release()
}

// notAccepted reports whether the transfer ended because prefill did not
// accept it within the handshake timeout, as DEADLINE_EXCEEDED.
func (t *transfer) notAccepted() error {
	if context.Cause(t.ctx) == t.errNoAccept {
		return svckit.Errorf(svckit.ErrPeerTimeout, "%w", t.errNoAccept)
	}
	return nil
}

// handshake opens the TransferKV stream to the request's prefill worker and
// sends the handshake offering pages. Until prefill accepts, decode's
// --handshake-timeout covers everything, connecting included: a prefill
// that accepts TCP but never answers must not hold the request. The
// returned transfer, also on an error, must be closed.
func (s *Service) handshake(ctx context.Context, log *slog.Logger, in *batonv1.DecodeServiceGenerateRequest, res reserved) (*transfer, error) {
	endpoint := in.GetPrefillEndpoint()
	conn, release, err := s.peers.get(endpoint)
	if err != nil {
		return nil, svckit.Errorf(svckit.ErrPeerUnavailable, "prefill %s: %w", endpoint, err)
	}
	t := &transfer{endpoint: endpoint, log: log, release: release, request: in.GetRequest(),
		errNoAccept: fmt.Errorf("prefill %s did not accept the transfer within %v", endpoint, s.HandshakeTimeout)}
	t.ctx, t.cancel = enginehost.Detach(ctx)
	t.hsTimer = time.AfterFunc(s.HandshakeTimeout, func() { t.cancel(t.errNoAccept) })
	if dl, ok := ctx.Deadline(); ok {
		var c context.CancelFunc
		t.ctx, c = context.WithDeadline(t.ctx, dl.Add(s.abortTimeout))
		t.stops = append(t.stops, c)
	}
	t.stream, err = batonv1.NewPrefillServiceClient(conn).TransferKV(t.ctx, s.Codec.CallOption())
	if err != nil {
		if err := t.notAccepted(); err != nil {
			return t, err
		}
		return t, svckit.Errorf(svckit.ErrPeerUnavailable, "prefill %s: %w", endpoint, err)
	}
	r := in.GetRequest()
	t.rcv = kvtransfer.NewReceiver(s.Host.Layout, len(r.GetPromptTokenIds()), s.creditWindow, &kvtransfer.PoolSink{Pool: s.Host.Pool, Pages: res.pages})
	if err := t.rcv.Hold(res.held); err != nil {
		return t, err // the scheduler held a page it must not have: INTERNAL
	}
	hs := &batonv1.Handshake{
		RequestId: r.GetRequestId(), PromptTokenIds: r.GetPromptTokenIds(), Sampling: r.GetSampling(),
		ModelFingerprint: s.Host.Fingerprint, KvLayout: kvtransfer.LayoutProto(s.Host.Layout),
		PagesReserved: uint32(len(res.pages)), InitialCredits: uint32(t.rcv.Window()),
		// The pages decode's prefix cache had: prefill sends the rest.
		CachedPageHashes: s.heldHashes(r.GetPromptTokenIds(), res.held),
		// Four heartbeats per idle deadline: a busy prefill never looks
		// silent, a lost one still does.
		HeartbeatMs: uint32(max(1, (s.IdleTimeout / 4).Milliseconds())),
		// Which attempt of which request at the router: prefill lets only
		// the same request's later attempt replace a stale transfer.
		Attempt: in.GetAttempt(), Origin: in.GetOrigin(),
	}
	if dl, ok := ctx.Deadline(); ok {
		hs.Deadline = timestamppb.New(dl)
	}
	if err := t.stream.Send(&batonv1.TransferKVRequest{Msg: &batonv1.TransferKVRequest_Handshake{Handshake: hs}}); err != nil && !errors.Is(err, io.EOF) {
		return t, svckit.Errorf(svckit.ErrPeerUnavailable, "prefill %s: handshake: %w", endpoint, err)
	}
	return t, nil
}

// heldHashes names the first held pages of the prompt by their prefix cache
// keys, for the handshake.
func (s *Service) heldHashes(prompt []uint32, held int) []uint64 {
	if held == 0 {
		return nil
	}
	ps := s.Host.Layout.PageSize
	tokens := make([]int32, held*ps)
	for i := range tokens {
		tokens[i] = int32(prompt[i])
	}
	hs := s.Host.Pool.PrefixHashes(tokens, held)
	out := make([]uint64, len(hs))
	for i, h := range hs {
		out[i] = uint64(h)
	}
	return out
}

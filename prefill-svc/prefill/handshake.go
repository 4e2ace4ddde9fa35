package prefill

import (
	"context"
	"time"

	"github.com/baton-serving/baton/engine"
	"github.com/baton-serving/baton/engine/kvcache"
	"github.com/baton-serving/baton/engine/sched"
	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"github.com/baton-serving/baton/kvtransfer"
	"github.com/baton-serving/baton/svckit"
	"github.com/baton-serving/baton/svckit/apiconv"
	"google.golang.org/grpc/status"
)

// awaitHandshake waits, up to prefill's --handshake-timeout, for the
// stream's first message, which must be the handshake.
func (s *Service) awaitHandshake(ctx context.Context, msgs <-chan *batonv1.TransferKVRequest) (*batonv1.Handshake, error) {
	t := time.NewTimer(s.HandshakeTimeout)
	defer t.Stop()
	select {
	case m, ok := <-msgs:
		if !ok {
			return nil, status.FromContextError(ctx.Err()).Err()
		}
		hs := m.GetHandshake()
		if hs == nil {
			return nil, svckit.Errorf(engine.ErrInvalidInput, "the first TransferKV message must be a handshake")
		}
		return hs, nil
	case <-t.C:
		return nil, svckit.Errorf(svckit.ErrPeerTimeout, "no handshake within %v", s.HandshakeTimeout)
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	}
}

// checkHandshake validates the handshake against this worker and returns the
// scheduler request. Mismatched model or layout is FAILED_PRECONDITION naming
// the difference.
func (s *Service) checkHandshake(hs *batonv1.Handshake) (sched.Request, error) {
	h := s.Host
	if fp := hs.GetModelFingerprint(); fp != h.Fingerprint {
		return sched.Request{}, svckit.Errorf(svckit.ErrMismatch,
			"model_fingerprint: this prefill worker serves %s (%s), decode sent %q", h.ModelInfo.GetId(), h.Fingerprint, fp)
	}
	peer, err := kvtransfer.LayoutFromProto(hs.GetKvLayout())
	if err != nil {
		return sched.Request{}, svckit.Errorf(svckit.ErrMismatch, "%w", err)
	}
	if msg := kvtransfer.Mismatch(h.Layout, peer); msg != "" {
		return sched.Request{}, svckit.Errorf(svckit.ErrMismatch, "%s", msg)
	}
	if err := apiconv.ValidRequestID(hs.GetRequestId()); err != nil {
		return sched.Request{}, svckit.Errorf(engine.ErrInvalidInput, "%w", err)
	}
	n := len(hs.GetPromptTokenIds())
	if n == 0 || n >= h.Config.ContextLength {
		return sched.Request{}, svckit.Errorf(engine.ErrInvalidInput, "prompt_token_ids: %d tokens, want 1-%d", n, h.Config.ContextLength-1)
	}
	prompt, err := apiconv.TokenIDs("prompt_token_ids", hs.GetPromptTokenIds(), h.Config.Vocab)
	if err != nil {
		return sched.Request{}, svckit.Errorf(engine.ErrInvalidInput, "%w", err)
	}
	if pages := h.Layout.PagesFor(n); int(hs.GetPagesReserved()) < pages {
		return sched.Request{}, svckit.Errorf(engine.ErrInvalidInput, "pages_reserved: %d, a prompt of %d tokens needs %d", hs.GetPagesReserved(), n, pages)
	}
	params, err := apiconv.SamplingVocab(hs.GetSampling(), h.Config.Vocab)
	if err != nil {
		return sched.Request{}, svckit.Errorf(engine.ErrInvalidInput, "%w", err)
	}
	stopIDs, err := apiconv.StopTokenIDs(hs.GetSampling(), h.Config.Vocab)
	if err != nil {
		return sched.Request{}, svckit.Errorf(engine.ErrInvalidInput, "%w", err)
	}
	if err := apiconv.CheckPromptLogprobs(hs.GetSampling(), n, s.maxTokenBytes); err != nil {
		return sched.Request{}, svckit.Errorf(engine.ErrInvalidInput, "%w", err)
	}
	if err := s.checkHeldPages(hs.GetCachedPageHashes(), prompt); err != nil {
		return sched.Request{}, err
	}
	// The first token is sampled here, under the request's grammar.
	constraint, err := s.grammars.Constraint(hs.GetSampling())
	if err != nil {
		return sched.Request{}, svckit.Errorf(engine.ErrInvalidInput, "%w", err)
	}
	return sched.Request{ID: hs.GetRequestId(), Mode: sched.ModePrefillOnly, Prompt: prompt, Params: params,
		Stop: hs.GetSampling().GetStop(), StopIDs: stopIDs, Constraint: constraint, PromptLogprobs: hs.GetSampling().GetPromptLogprobs(),
		// The first token's draw is the decode worker's too: under a
		// grammar, ignore_eos keeps the end-of-generation ids out of it
		// as it does there.
		IgnoreEOS: hs.GetSampling().GetIgnoreEos()}, nil
}

// checkHeldPages checks the pages decode says it holds: at most the full
// pages before the page of the prompt's last token (prefill writes that one
// and decode must own it), each named by the key this worker's prefix cache
// would give the prompt's own page, under the seed of the model and layout
// that the handshake has already been checked to share. A hash of another
// prefix would make decode attend to keys of other tokens: it is refused,
// naming the first page that differs.
func (s *Service) checkHeldPages(held []uint64, prompt []int32) error {
	if len(held) == 0 {
		return nil
	}
	ps := s.Host.Layout.PageSize
	if max := (len(prompt) - 1) / ps; len(held) > max {
		return svckit.Errorf(engine.ErrInvalidInput, "cached_page_hashes: %d pages of a %d-token prompt, at most %d (the full pages before its last token's)", len(held), len(prompt), max)
	}
	seed := kvcache.PrefixSeed(s.Host.Fingerprint, s.Host.Layout.String())
	for i, h := range kvcache.PageHashes(seed, prompt, ps, len(held)) {
		if uint64(h) != held[i] {
			return svckit.Errorf(engine.ErrInvalidInput, "cached_page_hashes[%d]: %016x is not the key of the prompt's page %d (%016x)", i, held[i], i, uint64(h))
		}
	}
	return nil
}

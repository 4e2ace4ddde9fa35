package decode

import (
	"errors"
	"fmt"

	"github.com/baton-serving/baton/engine"
	"github.com/baton-serving/baton/engine/sample"
	"github.com/baton-serving/baton/engine/sched"
	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"github.com/baton-serving/baton/svckit"
	"github.com/baton-serving/baton/svckit/apiconv"
)

// Admission: a routed request is checked and becomes a scheduler request;
// the scheduler's refusals become status codes.

// checkRequest validates a routed request and returns the scheduler request.
func (s *Service) checkRequest(in *batonv1.DecodeServiceGenerateRequest) (sched.Request, error) {
	bad := func(err error) error { return svckit.Errorf(engine.ErrInvalidInput, "%w", err) }
	r := in.GetRequest()
	if err := apiconv.ValidRequestID(r.GetRequestId()); err != nil {
		return sched.Request{}, bad(err)
	}
	cfg := s.Host.Config
	prompt, err := apiconv.TokenIDs("request.prompt_token_ids", r.GetPromptTokenIds(), cfg.Vocab)
	if err != nil {
		return sched.Request{}, bad(err)
	}
	if len(prompt) == 0 {
		return sched.Request{}, bad(errors.New("request.prompt_token_ids: empty (the router tokenizes prompts)"))
	}
	maxNew := int(r.GetSampling().GetMaxNewTokens())
	if maxNew < 1 || len(prompt)+maxNew > cfg.ContextLength {
		return sched.Request{}, bad(fmt.Errorf("request.sampling.max_new_tokens: %d with a %d-token prompt, want 1-%d (context window %d)",
			maxNew, len(prompt), cfg.ContextLength-len(prompt), cfg.ContextLength))
	}
	params, err := apiconv.SamplingVocab(r.GetSampling(), cfg.Vocab)
	if err != nil {
		return sched.Request{}, bad(err)
	}
	stopIDs, err := apiconv.StopTokenIDs(r.GetSampling(), cfg.Vocab)
	if err != nil {
		return sched.Request{}, bad(err)
	}
	if err := apiconv.CheckPromptLogprobs(r.GetSampling(), len(prompt), s.maxTokenBytes); err != nil {
		return sched.Request{}, bad(err)
	}
	// The grammar is compiled here, colocated or not: decode samples every
	// token after the first under it.
	constraint, err := s.grammars.Constraint(r.GetSampling())
	if err != nil {
		return sched.Request{}, bad(err)
	}
	n, err := apiconv.Choices(r.GetSampling(), s.maxN)
	if err != nil {
		return sched.Request{}, bad(err)
	}
	// A matcher has state: each choice after the first gets its own.
	var more []sample.Constraint
	for range n - 1 {
		if constraint == nil {
			break
		}
		c, err := s.grammars.Constraint(r.GetSampling())
		if err != nil {
			return sched.Request{}, bad(err)
		}
		more = append(more, c)
	}
	mode := sched.ModeDecodeImported
	switch ep := in.GetPrefillEndpoint(); {
	case ep == localPrefill:
		mode = sched.ModeGenerate
	case svckit.ValidateAddr(ep) != nil:
		return sched.Request{}, bad(fmt.Errorf("prefill_endpoint: %q, want host:port or %q", ep, localPrefill))
	default:
		if err := s.peerLimits.allowed(ep); err != nil {
			return sched.Request{}, svckit.Errorf(svckit.ErrPeerNotAllowed, "%w", err)
		}
	}
	return sched.Request{ID: r.GetRequestId(), Mode: mode, Prompt: prompt, MaxTokens: maxNew, Params: params,
		Stop: r.GetSampling().GetStop(), StopIDs: stopIDs, IgnoreEOS: r.GetSampling().GetIgnoreEos(), Constraint: constraint,
		N: n, Constraints: more,
		// Colocated, the scheduler computes them; PD, prefill does (pull).
		PromptLogprobs: r.GetSampling().GetPromptLogprobs()}, nil
}

// submitErr is the status of the scheduler's refusal (svckit's one table:
// a stopping scheduler is UNAVAILABLE, as on prefill).
func submitErr(err error) error { return svckit.Status(err) }

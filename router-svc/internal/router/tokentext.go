package router

// Token text for the events a request's client gets: workers send token ids
// and log-probabilities only; the text beside them is the router's to add,
// from the tokenizer it encoded the prompt with.

import (
	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"github.com/baton-serving/baton/router-svc/internal/openai"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// withTokenText wraps send, the way req's events go to its client: every
// log-probability (generated tokens', the prompt's, their alternatives) gets
// its token text and bytes (openai.FillTokenText), so that the native API
// and the OpenAI layer show them beside token_id.
//
// A request that asked for the prompt's log-probabilities
// (SamplingParams.prompt_logprobs, echo) fails with UNIMPLEMENTED when the
// workers answer without them, one per prompt token after the first, by
// the first event that carries them, a token or the end (events before it
// are held until then): an echo whose prompt logprobs are all missing
// would be wrong data, and the first such event is also what starts an SSE
// response's 200.
func (s *Service) withTokenText(req *batonv1.GenerateRequest, send func(*batonv1.GenerateEvent) error) func(*batonv1.GenerateEvent) error {
	checking := req.GetSampling().GetPromptLogprobs()
	want := max(len(req.GetPromptTokenIds())-1, 0)
	var held []*batonv1.GenerateEvent
	return func(ev *batonv1.GenerateEvent) error {
		openai.FillTokenText(s.tok, ev)
		if !checking {
			return send(ev)
		}
		got := len(ev.GetPromptLogprobs())
		if got == 0 && len(ev.GetTokenIds()) == 0 && ev.GetFinishReason() == batonv1.FinishReason_FINISH_REASON_UNSPECIFIED {
			held = append(held, ev)
			return nil
		}
		checking = false
		if got != want {
			// A workerFault: the decode worker's doing, not the client's.
			return &workerFault{status.Errorf(codes.Unimplemented,
				"the prompt's logprobs (echo): the workers sent %d for a prompt of %d tokens, want %d (a worker that predates prompt_logprobs?)",
				got, len(req.GetPromptTokenIds()), want)}
		}
		for _, h := range held {
			if err := send(h); err != nil {
				return err
			}
		}
		held = nil
		return send(ev)
	}
}

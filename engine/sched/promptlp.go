package sched

import (
	"github.com/baton-serving/baton/engine/sample"
)

// Prompt log-probabilities (Request.PromptLogprobs, the completions API's
// echo): each chunk of the prompt asks the model for every row's logits
// (model.Chunk.RowLogits), and each row is reduced to the log-probability
// of the prompt token it predicts, with the top alternatives, as soon as
// its logits exist: a request keeps n-1 small entries, never n×Vocab
// floats. The entries go out on the request's first EventToken (or its
// EventDone when it ends before a token).
//
// A request that asks for them computes every prompt position: the prefix
// cache holds keys and values, not logits, so such a request attaches no
// cached pages (its finished pages are still offered to the cache).

// promptLogprobs collects one request's prompt log-probabilities while its
// prompt computes. Only the scheduler's goroutine touches it: the plan
// sets the chunk's position, the forward pass (on the same goroutine)
// calls add.
type promptLogprobs struct {
	prompt []int32
	top    int // alternatives per position (Params.TopLogprobs)
	pos    int // position of the chunk being computed
	out    []sample.Token
	add    func(i int, logits []float32) // p.row, bound once
}

func newPromptLogprobs(prompt []int32, top int) *promptLogprobs {
	p := &promptLogprobs{prompt: prompt, top: top, out: make([]sample.Token, 0, len(prompt)-1)}
	p.add = p.row
	return p
}

// chunk returns the model's per-row callback for the prompt chunk at pos.
// Entries from pos on are dropped first: after a preemption the prompt is
// recomputed from the start, and they come again, bit-identical.
func (p *promptLogprobs) chunk(pos int) func(int, []float32) {
	p.pos = pos
	p.out = p.out[:min(len(p.out), pos)]
	return p.add
}

// row takes the logits after prompt position pos+i: the distribution of
// the prompt token at pos+i+1 (natural log, the raw model distribution at
// temperature 1, exactly as sample.Logprobs reports a drawn token's).
func (p *promptLogprobs) row(i int, logits []float32) {
	j := p.pos + i + 1
	if j >= len(p.prompt) || j != len(p.out)+1 {
		return // the last prompt token's logits predict the first new token
	}
	lp, top := sample.Logprobs(logits, p.prompt[j], p.top)
	p.out = append(p.out, sample.Token{ID: p.prompt[j], Logprob: lp, Top: top})
}

// takePromptLogprobs returns the request's prompt log-probabilities once,
// when the whole prompt has been computed (len(prompt)-1 entries), and nil
// otherwise or when the request did not ask.
func (r *request) takePromptLogprobs() []sample.Token {
	p := r.plp
	if p == nil || len(p.out) != len(p.prompt)-1 {
		return nil
	}
	r.plp = nil
	return p.out
}

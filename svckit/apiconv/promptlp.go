package apiconv

import (
	"fmt"

	"github.com/baton-serving/baton/engine/sample"
	"github.com/baton-serving/baton/engine/tokenizer"
	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
)

// MaxPromptLogprobsBytes bounds the wire size of a request's prompt
// log-probabilities (SamplingParams.prompt_logprobs): they travel in one
// message each hop (PrefillDone, then the first GenerateEvent), and gRPC
// refuses to receive a message over 4 MiB unless the call raises its
// limit; 64 KiB are left for the message's other fields.
const MaxPromptLogprobsBytes = 4<<20 - 64<<10

// PromptLogprobsBytes is the most bytes the prompt log-probabilities of a
// prompt of promptTokens tokens, with top alternatives each, take on the
// wire on the router's hop, where every entry and alternative gains its
// token's text and bytes (a token of at most maxTokenBytes bytes or
// control-token name; its text at most 3 bytes per byte, an invalid byte
// shown as U+FFFD): per entry a tag and length (3), token_id (6), logprob
// (5), and per alternative a tag and length (3), token_id (6) and logprob
// (5); each of them text and bytes, a tag and length (4) and the content
// each (4 × maxTokenBytes together).
func PromptLogprobsBytes(promptTokens, top, maxTokenBytes int) int {
	if promptTokens < 2 {
		return 0
	}
	text := 8 + 4*maxTokenBytes
	return (promptTokens - 1) * (14 + text + (14+text)*top)
}

// MaxTokenBytes is the longest token of tok's first vocab ids: its bytes,
// or a control token's name (what the router shows as its text).
func MaxTokenBytes(tok *tokenizer.Tokenizer, vocab int) int {
	if tok == nil {
		return 0
	}
	m := 0
	for id := range int32(min(vocab, tok.VocabSize())) {
		m = max(m, len(tok.TokenBytes(id)), len(tok.Piece(id)))
	}
	return m
}

// CheckPromptLogprobs refuses a request that asks for prompt
// log-probabilities (p.prompt_logprobs) of more than MaxPromptLogprobsBytes
// on the wire once the router added token texts (see PromptLogprobsBytes);
// the error names the field and wraps engine.ErrInvalidInput.
func CheckPromptLogprobs(p *batonv1.SamplingParams, promptTokens, maxTokenBytes int) error {
	if !p.GetPromptLogprobs() {
		return nil
	}
	top := int(p.GetTopLogprobs())
	if n := PromptLogprobsBytes(promptTokens, top, maxTokenBytes); n > MaxPromptLogprobsBytes {
		return invalid("sampling.prompt_logprobs", true, fmt.Sprintf(
			"a prompt whose log-probabilities fit in %d bytes (%d tokens with top_logprobs %d make up to %d with their texts: fewer top_logprobs or a shorter prompt)",
			MaxPromptLogprobsBytes, promptTokens, top, n))
	}
	return nil
}

// WirePromptLogprobs converts a prompt's log-probabilities (entry i: prompt
// token i+1) to the wire; nil stays nil.
func WirePromptLogprobs(ts []sample.Token) []*batonv1.TokenLogprob {
	if ts == nil {
		return nil
	}
	out := make([]*batonv1.TokenLogprob, len(ts))
	for i, t := range ts {
		out[i] = WireLogprob(t)
	}
	return out
}

// CheckWirePromptLogprobs checks prompt log-probabilities from a peer (a
// prefill worker's PrefillDone) against the prompt they describe: one entry
// per prompt token after the first, each naming that token, with at most
// top alternatives from the vocabulary. The error says what differs.
func CheckWirePromptLogprobs(lps []*batonv1.TokenLogprob, prompt []uint32, top, vocab int) error {
	if want := max(len(prompt)-1, 0); len(lps) != want {
		return fmt.Errorf("prompt_logprobs: %d entries for a %d-token prompt, want %d", len(lps), len(prompt), want)
	}
	for i, lp := range lps {
		if lp.GetTokenId() != prompt[i+1] {
			return fmt.Errorf("prompt_logprobs[%d]: token %d, the prompt has %d there", i, lp.GetTokenId(), prompt[i+1])
		}
		if n := len(lp.GetTopLogprobs()); n > top {
			return fmt.Errorf("prompt_logprobs[%d]: %d alternatives, want at most %d", i, n, top)
		}
		for _, alt := range lp.GetTopLogprobs() {
			if int64(alt.GetTokenId()) >= int64(vocab) {
				return fmt.Errorf("prompt_logprobs[%d]: alternative %d outside the vocabulary of %d", i, alt.GetTokenId(), vocab)
			}
		}
	}
	return nil
}

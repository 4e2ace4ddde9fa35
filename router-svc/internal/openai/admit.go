package openai

// Cheap refusals first (issue 20 item 7). A request's expensive work at the
// router — rendering the chat template and tokenizing the prompt, seconds
// of CPU for a prompt of megabytes — happens only after the Generator's
// concurrency limiter admitted the request, and a prompt whose byte length
// alone proves it cannot fit the context window is refused before any
// tokenizing. So oversized or malformed requests cannot starve the others
// of the router's CPU.

import (
	"context"
	"sync"

	"github.com/baton-serving/baton/engine/tokenizer"
)

type admissionKey struct{}

// admission is the work a request does once admitted.
type admission struct {
	once sync.Once
	fn   func() error
	err  error
}

// WithAdmission returns ctx carrying fn, the work a request does once the
// Generator has admitted it (Admitted).
func WithAdmission(ctx context.Context, fn func() error) context.Context {
	return context.WithValue(ctx, admissionKey{}, &admission{fn: fn})
}

// Admitted runs, once, the work ctx carries for an admitted request
// (tokenizing and rendering its prompt) and returns its error, a gRPC status
// the Generator returns as the request's outcome. A Generator whose
// Options.Admits is set must call it after its admission control and
// before it reads the request's prompt. Without such work it returns nil.
func Admitted(ctx context.Context) error {
	a, ok := ctx.Value(admissionKey{}).(*admission)
	if !ok {
		return nil
	}
	a.once.Do(func() { a.err = a.fn() })
	return a.err
}

// minTokenBytes is the floor of MaxTokenBytes: a character the vocabulary
// lacks, up to 4 UTF-8 bytes, may become one unknown token.
const minTokenBytes = 4

// MaxTokenBytes is the most input bytes one token of tok can stand for: the
// longest piece of its vocabulary (the text a token decodes to, special
// tokens as their text), at least minTokenBytes. No tokenizing of a text of
// b bytes gives fewer than b / MaxTokenBytes tokens, so a prompt longer
// than the token limit times MaxTokenBytes cannot fit and is refused
// without being tokenized. (SentencePiece's "▁" is one input byte for three
// piece bytes and its dummy space prefix adds a token; neither makes a
// token cover more input than its piece.)
func MaxTokenBytes(tok *tokenizer.Tokenizer) int {
	n := minTokenBytes
	for id := range tok.VocabSize() {
		n = max(n, len(tok.Piece(int32(id))))
	}
	return n
}

// promptByteLimit is the longest prompt text, in bytes, that may still fit
// the prompt's token limit (the context window less the one token to
// generate, or --max-prompt-tokens when smaller).
func promptByteLimit(m Model, l Limits, maxTokenBytes int) int64 {
	tokens := m.ContextLength - 1
	if l.MaxPromptTokens > 0 && l.MaxPromptTokens < tokens {
		tokens = l.MaxPromptTokens
	}
	return int64(tokens) * int64(maxTokenBytes)
}

// checkPromptBytes refuses a prompt text of n bytes that cannot fit the
// token limit whatever it tokenizes to, naming param.
func (h *Handler) checkPromptBytes(param string, n int) *httpError {
	if int64(n) <= h.maxPromptBytes {
		return nil
	}
	tokens := h.model.ContextLength - 1
	limit := "this model's context window is %d tokens and at least one must be left to generate"
	code := "context_length_exceeded"
	if l := h.limits.MaxPromptTokens; l > 0 && l < tokens {
		tokens, limit, code = l, "this server accepts at most %d tokens (--max-prompt-tokens)", "prompt_too_long"
	}
	return invalid(param, "the prompt has %d bytes, more than %d tokens can hold (%d bytes at most per token of this model's vocabulary); "+limit,
		n, tokens, h.maxTokenBytes, tokens).withCode(code)
}

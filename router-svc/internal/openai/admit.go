package openai

// Cheap refusals first (issue 20 item 7). A request's expensive work at the
// router — rendering the chat template and tokenizing the prompt, seconds
// of CPU for a prompt of megabytes — happens only after the Generator's
// concurrency limiter admitted the request, and a prompt whose byte length
// alone proves it cannot fit the context window is refused before any
// tokenizing. So oversized or malformed requests cannot starve the others
// of the router's CPU.

import (
	"bytes"
	"context"
	"fmt"
	"strings"
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
	tokens, _, _ := PromptLimit(m.ContextLength, l.MaxPromptTokens)
	return int64(tokens) * int64(maxTokenBytes)
}

// PromptLimit is the most tokens a prompt may have — the context window
// less the one token to generate, or maxPromptTokens (--max-prompt-tokens)
// when smaller — with what says so and OpenAI's error code for a prompt
// beyond it. The OpenAI layer and the native API share it.
func PromptLimit(contextLength, maxPromptTokens int) (tokens int, reason, code string) {
	if l := maxPromptTokens; l > 0 && l < contextLength-1 {
		return l, fmt.Sprintf("this server accepts at most %d tokens (--max-prompt-tokens)", l), "prompt_too_long"
	}
	return contextLength - 1, fmt.Sprintf("this model's context window is %d tokens and at least one must be left to generate", contextLength),
		"context_length_exceeded"
}

// checkPromptBytes refuses a prompt text of n bytes that cannot fit the
// token limit whatever it tokenizes to, naming param.
func (h *Handler) checkPromptBytes(param string, n int) *httpError {
	if int64(n) <= h.maxPromptBytes {
		return nil
	}
	return h.promptTooLong(param, fmt.Sprintf("the prompt has %d bytes", n))
}

// promptTooLong is the refusal of a prompt the byte bound proves too long;
// what says how long it is.
func (h *Handler) promptTooLong(param, what string) *httpError {
	tokens, limit, code := PromptLimit(h.model.ContextLength, h.limits.MaxPromptTokens)
	return invalid(param, "%s, more than %d tokens can hold (%d bytes at most per token of this model's vocabulary); %s",
		what, tokens, h.maxTokenBytes, limit).withCode(code)
}

// maxEscapeRatio bounds the JSON bytes of one decoded byte of a string:
// "\u0001" is six bytes for one (a surrogate pair, twelve for four).
const maxEscapeRatio = 6

// precheckCompletion refuses, before the body is decoded — several passes
// of encoding/json over megabytes — a completions body whose "prompt" holds
// a string literal so long that, even decoded, it is past the byte bound:
// it names the field and its size, as checkPromptBytes does once decoded.
// It never refuses what the decoder would accept as a fitting prompt: a
// literal of n raw bytes decodes to at least n / maxEscapeRatio bytes, and
// a body it cannot read plainly (malformed, an escaped key, a key that
// only matches "prompt" without regard to case, as encoding/json matches
// it) is left to the decoder.
func (h *Handler) precheckCompletion(body []byte) *httpError {
	v := rawMember(body, "prompt")
	if v == nil {
		return nil
	}
	if n := longestString(v) - 2; int64(n) > maxEscapeRatio*h.maxPromptBytes {
		return h.promptTooLong("prompt", fmt.Sprintf("the prompt is a JSON string of %d bytes (at least %d bytes of text)", n, n/maxEscapeRatio))
	}
	return nil
}

// precheckChat is precheckCompletion for chat: the contents of messages,
// which every chat template renders into the prompt, are summed (a
// content's longest JSON string: the string, or its longest text part)
// and refused past maxEscapeRatio times the byte bound, naming messages,
// before the body is decoded. Other strings (roles, names, tool calls)
// are not counted, so it never refuses what could fit; a body it cannot
// read plainly is left to the decoder.
func (h *Handler) precheckChat(body []byte) *httpError {
	v := rawMember(body, "messages")
	if v == nil {
		return nil
	}
	i := skipSpace(v, 0)
	if i >= len(v) || v[i] != '[' {
		return nil
	}
	var n int64
	for i = skipSpace(v, i+1); i < len(v) && v[i] != ']'; {
		stop := skipValue(v, i)
		if stop <= i {
			return nil // not plainly a value: the decoder's to judge
		}
		if c := rawMember(v[i:stop], "content"); c != nil {
			n += int64(max(longestString(c)-2, 0))
		}
		switch i = skipSpace(v, stop); {
		case i < len(v) && v[i] == ',':
			i = skipSpace(v, i+1)
		case i >= len(v) || v[i] != ']':
			return nil
		}
	}
	if n > maxEscapeRatio*h.maxPromptBytes {
		return h.promptTooLong("messages", fmt.Sprintf("the messages' contents are JSON strings of %d bytes (at least %d bytes of text)", n, n/maxEscapeRatio))
	}
	return nil
}

// rawMember is the raw value of the last member name of the JSON object
// body, or nil when body is not plainly such an object or a key might also
// decode to name (an escape, or name in other letter case).
func rawMember(body []byte, name string) []byte {
	i := skipSpace(body, 0)
	if i >= len(body) || body[i] != '{' {
		return nil
	}
	i = skipSpace(body, i+1)
	var found []byte
	for i < len(body) && body[i] != '}' {
		end := skipString(body, i)
		if end < 0 {
			return nil
		}
		key := body[i+1 : end-1]
		if strings.IndexByte(string(key), '\\') >= 0 {
			return nil
		}
		i = skipSpace(body, end)
		if i >= len(body) || body[i] != ':' {
			return nil
		}
		start := skipSpace(body, i+1)
		stop := skipValue(body, start)
		if stop < 0 {
			return nil
		}
		switch {
		case string(key) == name:
			found = body[start:stop]
		case strings.EqualFold(string(key), name):
			return nil
		}
		i = skipSpace(body, stop)
		if i < len(body) && body[i] == ',' {
			i = skipSpace(body, i+1)
		}
	}
	return found
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// skipString returns the index after the string literal at i, or -1.
func skipString(b []byte, i int) int {
	if i >= len(b) || b[i] != '"' {
		return -1
	}
	for i++; ; {
		q := bytes.IndexByte(b[i:], '"')
		if q < 0 {
			return -1
		}
		i += q
		esc := 0 // the quote is escaped after an odd run of backslashes
		for j := i - 1; j >= 0 && b[j] == '\\'; j-- {
			esc++
		}
		i++
		if esc%2 == 0 {
			return i
		}
	}
}

// skipValue returns the index after the JSON value at i, or -1.
func skipValue(b []byte, i int) int {
	depth := 0
	for i < len(b) {
		switch c := b[i]; {
		case c == '"':
			if i = skipString(b, i); i < 0 {
				return -1
			}
		case c == '{' || c == '[':
			depth++
			i++
		case c == '}' || c == ']':
			if depth == 0 {
				return i // the end of the enclosing object
			}
			depth--
			i++
		case c == ',' && depth == 0:
			return i
		default:
			i++
		}
		if depth == 0 && i > 0 && (b[i-1] == '"' || b[i-1] == '}' || b[i-1] == ']') {
			return i
		}
	}
	if depth == 0 {
		return i
	}
	return -1
}

// longestString is the raw length, quotes included, of the longest string
// literal in the JSON value v.
func longestString(v []byte) int {
	n := 0
	for i := 0; i < len(v); i++ {
		if v[i] != '"' {
			continue
		}
		end := skipString(v, i)
		if end < 0 {
			return n
		}
		n = max(n, end-i)
		i = end - 1
	}
	return n
}

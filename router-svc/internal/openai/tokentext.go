package openai

// Token text for logprobs. Workers send token ids and log-probabilities;
// the text beside them comes from the router's tokenizer, so that every API
// shows the same bytes the response text is built from
// (tokenizer.TokenBytes: what the streaming decoder appends for the token).
//
// A token can be part of a UTF-8 character (a byte-fallback token, or a
// byte-level BPE token cut inside a character). Its bytes are exact
// everywhere; its string cannot be, and each API names it as it does:
//   - native API (TokenLogprob.token): U+FFFD for each byte that is not
//     part of a valid character (proto strings must be valid UTF-8), the
//     exact bytes in TokenLogprob.bytes;
//   - chat completions: the bytes escaped as "\xe2\x80", with "bytes" the
//     exact values, as OpenAI answers (a captured gpt-4o response in
//     confident-ai/deepeval's tests: {"token": "\\xe2\\x80", "bytes":
//     [226, 128]});
//   - legacy completions, which has no bytes field: "bytes:\xe9\x80", as
//     OpenAI answers (a captured gpt-3.5-turbo-instruct response:
//     "tokens": ["，", "bytes:\\xe9\\x80", "bytes:\\x82", "合", ...], and
//     stanford-crfm/helm's convert_tokens_to_text, which reassembles such
//     tokens).
// Control tokens (BOS, EOS) append nothing: their bytes are empty (JSON
// null in chat, as OpenAI's "null if there is no bytes representation")
// and their string is their name ("<s>").

import (
	"strings"
	"unicode/utf8"

	"github.com/baton-serving/baton/engine/tokenizer"
	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
)

// FillTokenText sets the token text and bytes of every log-probability in
// ev, the generated tokens' and the prompt's and their alternatives, from
// tok: bytes are the token's bytes (none for a control token), token its
// text with U+FFFD in place of each byte that is not part of a valid UTF-8
// character, a control token by its name. The router calls it on every
// event it passes to a client, so that the native API shows the text beside
// token_id.
func FillTokenText(tok *tokenizer.Tokenizer, ev *batonv1.GenerateEvent) {
	for _, list := range [][]*batonv1.TokenLogprob{ev.GetLogprobs(), ev.GetPromptLogprobs()} {
		for _, lp := range list {
			v := viewOf(tok, lp.GetTokenId())
			lp.Token, lp.Bytes = v.native(), v.bytes
			for _, top := range lp.GetTopLogprobs() {
				v := viewOf(tok, top.GetTokenId())
				top.Token, top.Bytes = v.native(), v.bytes
			}
		}
	}
}

// tokenView is one token as the APIs show it.
type tokenView struct {
	bytes []byte // what the token appends to the text; nil for a control token
	name  string // a control token's name (its piece), shown when bytes is nil
}

// viewOf looks the token up; an id beyond int32 is outside the vocabulary
// and shows as nothing.
func viewOf(tok *tokenizer.Tokenizer, id uint32) tokenView {
	if id > 1<<31-1 {
		return tokenView{}
	}
	b := tok.TokenBytes(int32(id))
	if b == nil {
		return tokenView{name: tok.Piece(int32(id))}
	}
	return tokenView{bytes: b}
}

// native is the native API's token string.
func (v tokenView) native() string {
	if v.bytes == nil {
		return tokenizer.ValidText([]byte(v.name))
	}
	return tokenizer.ValidText(v.bytes)
}

// chat is chat completions' token string.
func (v tokenView) chat() string {
	switch {
	case v.bytes == nil:
		return tokenizer.ValidText([]byte(v.name))
	case utf8.Valid(v.bytes):
		return string(v.bytes)
	}
	return escapeBytes(v.bytes)
}

// completion is legacy completions' token string (also its top_logprobs
// key).
func (v tokenView) completion() string {
	switch {
	case v.bytes == nil:
		return tokenizer.ValidText([]byte(v.name))
	case utf8.Valid(v.bytes):
		return string(v.bytes)
	}
	return "bytes:" + escapeBytes(v.bytes)
}

// chatBytes is chat completions' "bytes": the byte values, or nil (JSON
// null) for a control token.
func (v tokenView) chatBytes() []int {
	if v.bytes == nil {
		return nil
	}
	out := make([]int, len(v.bytes))
	for i, c := range v.bytes {
		out[i] = int(c)
	}
	return out
}

// escapeBytes writes b as Python's bytes repr shows its content, which is
// how OpenAI names a token that is not valid UTF-8: printable ASCII as
// itself, every other byte as \xNN (lower-case hex).
func escapeBytes(b []byte) string {
	const hex = "0123456789abcdef"
	var s strings.Builder
	for _, c := range b {
		if c >= 0x20 && c < 0x7f {
			s.WriteByte(c)
			continue
		}
		s.WriteString(`\x`)
		s.WriteByte(hex[c>>4])
		s.WriteByte(hex[c&15])
	}
	return s.String()
}

// charCounter counts the characters of a text given a piece at a time, as
// legacy completions' text_offset counts them. OpenAI's offsets are in
// characters (Python str indices), from the start of the prompt whether or
// not it is echoed: in the captured gpt-3.5-turbo-instruct response the
// prompt "天气非常好" (5 characters, 15 bytes) puts the first token at 5, and
// the two tokens "bytes:\xe9\x80", "bytes:\x82" of one character are both
// at 6, the next character at 7. So a character counts once its last byte
// is there, and a byte that can never be part of one counts as one (the
// text shows it as U+FFFD).
type charCounter struct {
	n       int
	pending []byte // the start of a character still incomplete
}

func (c *charCounter) add(b []byte) {
	c.pending = append(c.pending, b...)
	cut := completePrefix(c.pending)
	c.n += utf8.RuneCount(c.pending[:cut])
	c.pending = c.pending[:copy(c.pending, c.pending[cut:])]
}

// completePrefix returns the length of the longest prefix of b that does
// not end inside a UTF-8 sequence that later bytes could still complete.
func completePrefix(b []byte) int {
	for i := max(0, len(b)-(utf8.UTFMax-1)); i < len(b); i++ {
		if !utf8.FullRune(b[i:]) {
			return i
		}
	}
	return len(b)
}

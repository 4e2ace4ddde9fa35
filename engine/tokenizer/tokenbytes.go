package tokenizer

// TokenBytes returns the bytes the token appends to generated text: exactly
// what a StreamDecoder accumulates for it before holding back or replacing
// incomplete UTF-8. SentencePiece's "▁" is a space, a byte token <0xNN> is
// that one byte (so the result need not be valid UTF-8), a byte-level BPE
// token is its decoded bytes, and control, unknown and unused tokens append
// nothing, as do ids outside the vocabulary: those give nil.
//
// It exists so that logprob consumers (the router's token text, the
// constrained decoder's vocabulary) see the same bytes the text is built
// from: concatenating TokenBytes over a generation gives the streamed text's
// bytes before any U+FFFD replacement. The slice is fresh; callers may keep
// or modify it.
func (t *Tokenizer) TokenBytes(id int32) []byte {
	p := t.piece(id, false)
	if p == "" {
		return nil
	}
	return []byte(p)
}

// PromptBytes returns the bytes of each of a prompt's tokens as the text
// that was encoded shows them: TokenBytes, except that, when this
// vocabulary adds a space prefix, the first token with bytes after nothing
// but tokens without (control tokens such as BOS) loses the one leading
// space Encode put there. Joined they give back the encoded text, for text
// that encodes losslessly; an echo of a prompt shows the prompt so.
func (t *Tokenizer) PromptBytes(ids []int32) [][]byte {
	out := make([][]byte, len(ids))
	strip := t.addSpacePrefix
	for i, id := range ids {
		b := t.TokenBytes(id)
		if strip && len(b) > 0 {
			strip = false
			if b[0] == ' ' {
				b = b[1:]
			}
		}
		out[i] = b
	}
	return out
}

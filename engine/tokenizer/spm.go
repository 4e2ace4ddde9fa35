package tokenizer

import "strings"

// spmSpace is the SentencePiece meta symbol that stands for a space.
const spmSpace = "\u2581"

// encodeSPM tokenizes fragments the way llama.cpp's SPM tokenizer does:
// every text fragment that starts the input or follows a special token gets
// the dummy-prefix space (when the vocabulary asks for it), spaces become
// "▁", and the result is merged by score.
func (t *Tokenizer) encodeSPM(frags []fragment, out []int32) []int32 {
	var s mergeSession
	prevSpecial := true
	for _, f := range frags {
		if f.id != NoToken {
			out = append(out, f.id)
			prevSpecial = true
			continue
		}
		text := f.text
		if t.addSpacePrefix && prevSpecial {
			text = " " + text
		}
		text = strings.ReplaceAll(text, " ", spmSpace)
		out = s.spm(t, text, out)
		prevSpecial = false
	}
	return out
}

// mergeSession holds the buffers one Encode call reuses across fragments
// and words.
type mergeSession struct {
	syms  []symbol
	queue bigramQueue
	buf   []byte
}

// spm splits text into UTF-8 characters, repeatedly merges the adjacent pair
// whose concatenation is the highest-scoring token, and appends the tokens
// of the final symbols. A symbol that is not a token (only single
// characters can be) is spelled out with byte tokens.
func (s *mergeSession) spm(t *Tokenizer, text string, out []int32) []int32 {
	syms := s.merge(text, func(l, r symbol) (float64, bool) {
		if id, ok := t.toID[text[l.start:l.start+l.n+r.n]]; ok {
			return float64(t.score(id)), true
		}
		return 0, false
	})
	return appendPieces(out, syms, text, t.toID, func(out []int32, piece string) []int32 {
		for j := 0; j < len(piece); j++ {
			out = t.appendByte(out, piece[j])
		}
		return out
	})
}

// appendByte appends the byte-fallback token of b: "<0xHH>", else the token
// whose text is that single byte, else the unknown token. With none of them
// the byte is dropped (llama.cpp would abort).
func (t *Tokenizer) appendByte(out []int32, b byte) []int32 {
	if id := t.byteIDs[b]; id != NoToken {
		return append(out, id)
	}
	if t.unk != NoToken {
		return append(out, t.unk)
	}
	return out
}

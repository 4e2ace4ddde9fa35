package tokenizer

import (
	"strings"
	"unicode/utf8"
)

// byteRunes is GPT-2's byte-to-unicode table: printable ASCII and Latin-1
// bytes map to themselves, the other 68 bytes to U+0100 onwards in byte
// order, so that every byte has a visible, non-space stand-in.
var byteRunes = func() (t [256]rune) {
	n := rune(0)
	for b := range 256 {
		if (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF) {
			t[b] = rune(b)
		} else {
			t[b] = 256 + n
			n++
		}
	}
	return t
}()

// runeBytes inverts byteRunes; -1 marks a code point that stands for no
// byte. Every stand-in is below 0x144.
var runeBytes = func() (t [0x144]int16) {
	for i := range t {
		t[i] = -1
	}
	for b, r := range byteRunes {
		t[r] = int16(b)
	}
	return t
}()

// byteEncode appends the byte-level encoding of word to buf.
func byteEncode(buf []byte, word string) []byte {
	for i := 0; i < len(word); i++ {
		buf = utf8.AppendRune(buf, byteRunes[word[i]])
	}
	return buf
}

// byteDecode maps a byte-level encoded token text back to the bytes it
// stands for. A code point outside the table (a token added to the
// vocabulary in plain text) passes through as its own UTF-8; llama.cpp
// writes an "[UNK_BYTE_…]" marker there instead.
func byteDecode(text string) string {
	var b strings.Builder
	b.Grow(len(text))
	for _, r := range text {
		if r >= 0 && int(r) < len(runeBytes) && runeBytes[r] >= 0 {
			b.WriteByte(byte(runeBytes[r]))
		} else {
			b.WriteRune(r)
		}
	}
	return b.String()
}

// mergePair keys the merge ranks.
type mergePair struct{ left, right string }

// encodeBPE tokenizes fragments as llama.cpp's BPE tokenizer does: each text
// fragment is cut into words by the pre-tokenizer and each word is merged
// on its own.
func (t *Tokenizer) encodeBPE(frags []fragment, out []int32) []int32 {
	var s mergeSession
	for _, f := range frags {
		if f.id != NoToken {
			out = append(out, f.id)
			continue
		}
		for _, w := range preTokenize(f.text, t.pre.stages) {
			out = s.bpe(t, w, out)
		}
	}
	return out
}

// bpe byte-encodes one word, merges the adjacent pair with the lowest merge
// rank until no pair has one, and appends the tokens of the final symbols.
func (s *mergeSession) bpe(t *Tokenizer, word string, out []int32) []int32 {
	s.buf = byteEncode(s.buf[:0], word)
	text := string(s.buf)
	if t.pre.ignoreMerges {
		if id, ok := t.toID[text]; ok {
			return append(out, id)
		}
	}

	syms := s.merge(text, func(l, r symbol) (float64, bool) {
		rank, ok := t.ranks[mergePair{text[l.start : l.start+l.n], text[r.start : r.start+r.n]}]
		// Lowest rank first: negate it so that the max-heap serves it.
		return -float64(rank), ok
	})
	// A merge produced text that is not a token, or a byte's stand-in is
	// missing: spell the symbol character by character. llama.cpp looks up
	// single raw bytes here, which never match a byte-level vocabulary,
	// and drops them.
	return appendPieces(out, syms, text, t.toID, func(out []int32, piece string) []int32 {
		for _, r := range piece {
			if id, ok := t.toID[string(r)]; ok {
				out = append(out, id)
			} else if t.unk != NoToken {
				out = append(out, t.unk)
			}
		}
		return out
	})
}

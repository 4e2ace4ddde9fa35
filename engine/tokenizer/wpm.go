package tokenizer

import (
	"sort"
	"unicode"
	"unicode/utf8"
)

// ModelBERT is WordPiece (llama.cpp's WPM tokenizer), used by BERT-family
// encoders: the text is lower-cased, stripped of accents, cut at white
// space and punctuation, and each word is covered greedily by the longest
// tokens. In GGUF the tokens that start a word carry a "▁" prefix and the
// continuations ("##ing" in the original vocabulary) none.
const ModelBERT = "bert"

// encodeWPM tokenizes fragments as llama.cpp's WPM tokenizer does.
func (t *Tokenizer) encodeWPM(frags []fragment, out []int32) []int32 {
	var buf []byte
	for _, f := range frags {
		if f.id != NoToken {
			out = append(out, f.id)
			continue
		}
		for _, w := range wpmWords(f.text) {
			buf = append(append(buf[:0], spmSpace...), w...)
			out = t.wpmWord(string(buf), out)
		}
	}
	return out
}

// wpmWord covers word (with its "▁" prefix) from the left with the longest
// token at each position. If some position has none, the whole word becomes
// the unknown token.
func (t *Tokenizer) wpmWord(word string, out []int32) []int32 {
	start := len(out)
	for i := 0; i < len(word); {
		matched := false
		for j := min(len(word), i+t.maxTokenLen+1); j > i; j-- {
			if id, ok := t.toID[word[i:j]]; ok {
				out = append(out, id)
				i, matched = j, true
				break
			}
		}
		if !matched {
			out = out[:start]
			break
		}
	}
	if len(out) == start && t.unk != NoToken {
		out = append(out, t.unk)
	}
	return out
}

// wpmWords is llama.cpp's WPM preprocessing: each code point is replaced by
// the first code point of its canonical decomposition and lower-cased;
// white space separates words; NUL, U+FFFD (which invalid UTF-8 becomes)
// and control and format characters are dropped; punctuation, ASCII symbols
// and CJK ideographs are words of their own.
func wpmWords(text string) []string {
	var words []string
	var cur []byte
	flush := func() {
		if len(cur) > 0 {
			words = append(words, string(cur))
			cur = cur[:0]
		}
	}
	for _, r := range text {
		r = nfd(r)
		switch {
		case unicode.Is(unicode.White_Space, r):
			flush()
			continue
		case r == 0 || r == utf8.RuneError || unicode.In(r, unicode.Cc, unicode.Cf, unicode.Co, unicode.Cs):
			continue
		}
		lower := unicode.ToLower(r)
		if unicode.IsPunct(r) || (r < 0x7F && unicode.IsSymbol(r)) || wpmChinese(r) {
			flush()
			words = append(words, string(lower))
			continue
		}
		cur = utf8.AppendRune(cur, lower)
	}
	flush()
	return words
}

// nfd returns the first code point of r's canonical decomposition.
func nfd(r rune) rune {
	if r < 0xC0 {
		return r
	}
	i := sort.Search(len(nfdFirst), func(i int) bool { return nfdFirst[i].hi >= r })
	if i < len(nfdFirst) && nfdFirst[i].lo <= r {
		return nfdFirst[i].to
	}
	return r
}

// wpmChinese reports the CJK ideograph blocks that BERT's basic tokenizer
// isolates (including its 0x2B920 start for the fifth extension block).
func wpmChinese(r rune) bool {
	return (r >= 0x4E00 && r <= 0x9FFF) || (r >= 0x3400 && r <= 0x4DBF) ||
		(r >= 0x20000 && r <= 0x2A6DF) || (r >= 0x2A700 && r <= 0x2B73F) ||
		(r >= 0x2B740 && r <= 0x2B81F) || (r >= 0x2B920 && r <= 0x2CEAF) ||
		(r >= 0xF900 && r <= 0xFAFF) || (r >= 0x2F800 && r <= 0x2FA1F)
}

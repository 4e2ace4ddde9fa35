package tokenizer

import (
	"strings"
	"unicode/utf8"
)

// renderPiece is llama.cpp's token_to_piece with special=true and no
// stripping: control, unknown and user-defined tokens show their text,
// normal tokens their text with "▁" as a space (llama) or byte-decoded
// (gpt2), byte tokens the byte itself, and unused or undefined tokens
// nothing.
func (t *Tokenizer) renderPiece(id int32) string {
	text := t.tokens[id]
	switch t.types[id] {
	case TypeControl, TypeUnknown, TypeUserDefined:
		return text
	case TypeByte:
		if b, ok := parseByteToken(text); ok {
			return string([]byte{b})
		}
		// Not of the form <0xHH>: llama.cpp would read garbage; show it as
		// the normal token it looks like.
	case TypeNormal:
	default:
		return ""
	}
	if t.model == ModelLlama || t.model == ModelBERT {
		return strings.ReplaceAll(text, spmSpace, " ")
	}
	return byteDecode(text)
}

// parseByteToken reads "<0xHH>".
func parseByteToken(s string) (byte, bool) {
	if len(s) != 6 || s[:3] != "<0x" || s[5] != '>' {
		return 0, false
	}
	hi, ok1 := hexDigit(s[3])
	lo, ok2 := hexDigit(s[4])
	return hi<<4 | lo, ok1 && ok2
}

func hexDigit(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10, true
	case c >= 'A' && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// Piece returns the text of one token with special tokens shown, as
// llama.cpp's token_to_piece(special=true) renders it: "▁" becomes a space,
// BOS shows as "<s>", a byte token is its single byte (so a piece need not
// be valid UTF-8). An id outside the vocabulary gives "".
func (t *Tokenizer) Piece(id int32) string {
	if !t.valid(id) {
		return ""
	}
	return t.pieces[id]
}

// piece is Piece, with control and unknown tokens rendered as nothing
// unless special is set.
func (t *Tokenizer) piece(id int32, special bool) string {
	if !t.valid(id) {
		return ""
	}
	if !special {
		if typ := t.types[id]; typ == TypeControl || typ == TypeUnknown {
			return ""
		}
	}
	return t.pieces[id]
}

// DecodeOptions are llama_detokenize's two switches.
type DecodeOptions struct {
	// RemoveSpecial drops a leading BOS when the vocabulary adds BOS and a
	// trailing EOS when it adds EOS.
	RemoveSpecial bool
	// UnparseSpecial renders control and unknown tokens as their text
	// instead of nothing.
	UnparseSpecial bool
}

// Decode turns ids into text as llama_detokenize(remove_special=false,
// unparse_special=false) does: pieces are concatenated (byte tokens
// reassemble multi-byte characters), control and unknown tokens vanish, and
// when the vocabulary adds a space prefix the first token's leading space is
// removed, since Encode put it there. So Decode(Encode(" Hi")) is " Hi" only
// because "▁▁Hi" keeps one space. Ids outside the vocabulary are skipped.
// The result is not valid UTF-8 if the ids spell an incomplete character.
func (t *Tokenizer) Decode(ids []int32) string {
	return t.DecodeWith(ids, DecodeOptions{})
}

// DecodeWith is Decode with llama_detokenize's options.
func (t *Tokenizer) DecodeWith(ids []int32, opts DecodeOptions) string {
	removeSpace := t.addSpacePrefix
	if opts.RemoveSpecial && t.addBOS && len(ids) > 0 && ids[0] == t.bos {
		// The space prefix follows BOS in the encoding, so it stays.
		removeSpace = false
		ids = ids[1:]
	}
	if opts.RemoveSpecial && t.addEOS && len(ids) > 0 && ids[len(ids)-1] == t.eos {
		ids = ids[:len(ids)-1]
	}
	var b []byte
	for _, id := range ids {
		if !t.valid(id) {
			continue
		}
		p := t.piece(id, opts.UnparseSpecial)
		if removeSpace && strings.HasPrefix(p, " ") {
			p = p[1:]
		}
		// Only the very first token may lose its space, even if it
		// rendered as nothing.
		removeSpace = false
		b = append(b, p...)
	}
	if t.pre.cleanSpaces {
		b = cleanSpaces(b)
	}
	return string(b)
}

// cleanSpaces is llama.cpp's clean_spaces pass for BPE vocabularies, which
// mirrors Hugging Face's clean_up_tokenization_spaces: " ?", " !", " .",
// " ," lose the space, " ' " loses both, and " 's", " 'm", " 're", " 've"
// lose the space. It works in place, byte by byte, exactly as llama.cpp's
// three passes do.
func cleanSpaces(text []byte) []byte {
	if len(text) == 0 {
		return text
	}
	text = squeeze(text, func(i int) (dropPrev, skipNext bool) {
		x := text[i]
		return text[i-1] == ' ' && (x == '?' || x == '!' || x == '.' || x == ','), false
	})
	text = squeeze(text, func(i int) (dropPrev, skipNext bool) {
		both := text[i] == '\'' && i+1 < len(text) && text[i-1] == ' ' && text[i+1] == ' '
		return both, both
	})
	return squeeze(text, func(i int) (dropPrev, skipNext bool) {
		if text[i-1] != ' ' || text[i] != '\'' || i+1 >= len(text) {
			return false, false
		}
		switch x1 := text[i+1]; {
		case x1 == 's' || x1 == 'm':
			return true, false
		case i+2 < len(text):
			x2 := text[i+2]
			return (x1 == 'r' && x2 == 'e') || (x1 == 'v' && x2 == 'e'), false
		}
		return false, false
	})
}

// squeeze is one of cleanSpaces' passes over a non-empty text, in place:
// it keeps text[0] and copies each later byte down, dropping the byte
// before it where rule says dropPrev, and skipping the byte after it where
// rule says skipNext (that byte is zeroed first, so that it no longer reads
// as a space to the next rule).
func squeeze(text []byte, rule func(i int) (dropPrev, skipNext bool)) []byte {
	total := 1
	for i := 1; i < len(text); i++ {
		x := text[i]
		dropPrev, skipNext := rule(i)
		if dropPrev {
			total--
		}
		if skipNext {
			i++
			text[i] = 0
		}
		text[total] = x
		total++
	}
	return text[:total]
}

// StreamDecoder turns generated ids into text one id at a time. Each Next
// returns the text that is now complete: bytes of a character whose
// byte-fallback tokens have not all arrived yet are held back, so no call
// returns part of a UTF-8 sequence. Bytes that can never form a character
// come out as U+FFFD, one per byte, so every output is valid UTF-8.
//
// Generated text continues the prompt, so, as llama-server does, the
// decoder keeps the SentencePiece space of the first token ("▁Once" gives
// " Once"); this is the difference from Decode, which strips it. Control
// and unknown tokens render as nothing, and no clean_spaces pass runs (the
// server streams raw pieces too). For ids whose text is valid UTF-8, the
// concatenation of every Next and the final Flush equals the pieces joined.
//
// A StreamDecoder is not safe for concurrent use.
type StreamDecoder struct {
	t       *Tokenizer
	pending []byte
}

// NewStreamDecoder returns a decoder for one generated sequence.
func (t *Tokenizer) NewStreamDecoder() *StreamDecoder {
	return &StreamDecoder{t: t}
}

// Next adds one generated id and returns the text it completes, possibly "".
func (d *StreamDecoder) Next(id int32) string {
	d.pending = append(d.pending, d.t.piece(id, false)...)
	cut := completePrefix(d.pending)
	if cut == 0 {
		return ""
	}
	s := ValidText(d.pending[:cut])
	d.pending = d.pending[:copy(d.pending, d.pending[cut:])]
	return s
}

// Flush returns whatever is held back, an incomplete character becoming
// U+FFFD per byte, and resets the decoder.
func (d *StreamDecoder) Flush() string {
	s := ValidText(d.pending)
	d.pending = d.pending[:0]
	return s
}

// completePrefix returns the length of the longest prefix of b that does not
// end inside a UTF-8 sequence that later bytes could still complete.
func completePrefix(b []byte) int {
	for i := max(0, len(b)-(utf8.UTFMax-1)); i < len(b); i++ {
		if !utf8.FullRune(b[i:]) {
			return i
		}
	}
	return len(b)
}

// ValidText converts b, replacing each byte that is not part of a valid
// UTF-8 sequence with U+FFFD, as the streaming decoder writes its text (so
// a layer that renders token bytes itself renders them the same way).
func ValidText(b []byte) string {
	if utf8.Valid(b) {
		return string(b)
	}
	var s strings.Builder
	s.Grow(len(b) + 8)
	for len(b) > 0 {
		r, n := utf8.DecodeRune(b)
		if r == utf8.RuneError && n == 1 {
			s.WriteString("\uFFFD")
		} else {
			s.Write(b[:n])
		}
		b = b[n:]
	}
	return s.String()
}

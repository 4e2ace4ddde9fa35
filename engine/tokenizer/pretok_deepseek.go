package tokenizer

import "unicode"

// The DeepSeek pre-tokenizers are sequences of Hugging Face "Split"
// expressions, each of which isolates its matches inside every piece the
// previous ones made. llama.cpp runs them through std::regex, so these
// stages follow its semantics: leftmost match, greedy quantifiers, and
// white space as Unicode White_Space (llama.cpp maps non-ASCII white space to
// U+000B before matching, which `\s` then accepts).

// deepseekLatin is the letter class of DeepSeek LLM's second expression
// (`\s?[A-Za-zµÀ-ÖØ-ö…𞤀-𞥃]+`), written out as code point ranges.
var deepseekLatin = &unicode.RangeTable{
	R16: []unicode.Range16{
		{0x0041, 0x005A, 1}, {0x0061, 0x007A, 1}, {0x00B5, 0x00B5, 1}, {0x00C0, 0x00D6, 1},
		{0x00D8, 0x00F6, 1}, {0x00F8, 0x01BA, 1}, {0x01BC, 0x01BF, 1}, {0x01C4, 0x0293, 1},
		{0x0295, 0x02AF, 1}, {0x0370, 0x0373, 1}, {0x0376, 0x0377, 1}, {0x037B, 0x037D, 1},
		{0x037F, 0x037F, 1}, {0x0386, 0x0386, 1}, {0x0388, 0x038A, 1}, {0x038C, 0x038C, 1},
		{0x038E, 0x03A1, 1}, {0x03A3, 0x03F5, 1}, {0x03F7, 0x0481, 1}, {0x048A, 0x052F, 1},
		{0x0531, 0x0556, 1}, {0x10A0, 0x10C5, 1}, {0x13A0, 0x13F5, 1}, {0x13F8, 0x13FD, 1},
		{0x1C90, 0x1CBA, 1}, {0x1CBD, 0x1CBF, 1}, {0x1D00, 0x1D2B, 1}, {0x1D6B, 0x1D77, 1},
		{0x1D79, 0x1D9A, 1}, {0x1E00, 0x1F15, 1}, {0x1F18, 0x1F1D, 1}, {0x1F20, 0x1F45, 1},
		{0x1F48, 0x1F4D, 1}, {0x1F50, 0x1F57, 1}, {0x1F59, 0x1F59, 1}, {0x1F5B, 0x1F5B, 1},
		{0x1F5D, 0x1F5D, 1}, {0x1F5F, 0x1F7D, 1}, {0x1F80, 0x1FB4, 1}, {0x1FB6, 0x1FBC, 1},
		{0x1FBE, 0x1FBE, 1}, {0x1FC2, 0x1FC4, 1}, {0x1FC6, 0x1FCC, 1}, {0x1FD0, 0x1FD3, 1},
		{0x1FD6, 0x1FDB, 1}, {0x1FE0, 0x1FEC, 1}, {0x1FF2, 0x1FF4, 1}, {0x1FF6, 0x1FFC, 1},
		{0x2102, 0x2102, 1}, {0x2107, 0x2107, 1}, {0x210A, 0x2113, 1}, {0x2115, 0x2115, 1},
		{0x2119, 0x211D, 1}, {0x2124, 0x2124, 1}, {0x2126, 0x2126, 1}, {0x2128, 0x2128, 1},
		{0x212A, 0x212D, 1}, {0x212F, 0x2134, 1}, {0x2139, 0x2139, 1}, {0x213C, 0x213F, 1},
		{0x2145, 0x2149, 1}, {0x214E, 0x214E, 1}, {0x2183, 0x2184, 1}, {0x2C00, 0x2C7B, 1},
		{0x2C7E, 0x2CE4, 1}, {0x2CEB, 0x2CEE, 1}, {0x2CF2, 0x2CF3, 1}, {0xA640, 0xA66D, 1},
		{0xA680, 0xA69B, 1}, {0xA722, 0xA76F, 1}, {0xA771, 0xA787, 1}, {0xA78B, 0xA78E, 1},
		{0xAB70, 0xABBF, 1}, {0xFB00, 0xFB06, 1}, {0xFB13, 0xFB17, 1}, {0xFF21, 0xFF3A, 1},
		{0xFF41, 0xFF5A, 1},
	},
	R32: []unicode.Range32{
		{0x10400, 0x1044F, 1}, {0x104B0, 0x104D3, 1}, {0x104D8, 0x104FB, 1}, {0x10C80, 0x10CB2, 1},
		{0x10CC0, 0x10CF2, 1}, {0x118A0, 0x118DF, 1}, {0x1E900, 0x1E943, 1},
	},
}

// deepseekPunct is the class of DeepSeek LLM's third expression,
// `\s?[!-/:-~！-／：-～‘-‟　-。]+`. Its ASCII part includes the letters:
// inside a piece that the letter expression left, a run such as " caf" in
// " café" is a match of its own, as in the original tokenizer.
func deepseekPunct(r rune) bool {
	switch {
	case r >= 0x21 && r <= 0x2F, r >= 0x3A && r <= 0x7E:
		return true
	case r >= 0xFF01 && r <= 0xFF0F, r >= 0xFF1A && r <= 0xFF5E, r >= 0x2018 && r <= 0x201F:
		return true
	case r >= 0x3001 && r <= 0x3002:
		// U+3000 is in the range too, but as white space it reaches the
		// expression as U+000B and so never matches it.
		return true
	}
	return false
}

// deepseekCJK is `[一-龥ࠀ-一가-퟿]`: U+0800 to U+9FA5 and the Hangul
// syllables and Jamo extension, U+AC00 to U+D7FF. White space inside the
// range (U+1680, U+2000…U+200A, U+3000 and the like) reaches the expression
// as U+000B and does not match.
func deepseekCJK(r rune, c charClass) bool {
	return c&clSpace == 0 && ((r >= 0x0800 && r <= 0x9FA5) || (r >= 0xAC00 && r <= 0xD7FF))
}

var (
	// DeepSeek LLM: [\r\n], \s?[latin]+, \s?[punct]+, \s+$, [CJK]+, \p{N}+.
	stagesDeepSeekLLM = []stage{
		matchStage(matchNewline),
		matchStage(matchSpaceThen(func(r rune, _ charClass) bool { return unicode.Is(deepseekLatin, r) })),
		matchStage(matchSpaceThen(func(r rune, c charClass) bool { return c&clSpace == 0 && deepseekPunct(r) })),
		splitTrailingSpace,
		matchStage(matchRun(deepseekCJK)),
		matchStage(matchNumberRun),
	}
	// DeepSeek Coder: [\r\n], \s?\p{L}+, \s?\p{P}+, [CJK]+, \p{N}.
	stagesDeepSeekCoder = []stage{
		matchStage(matchNewline),
		matchStage(matchSpaceThen(func(_ rune, c charClass) bool { return c&clLetter != 0 })),
		matchStage(matchSpaceThen(func(_ rune, c charClass) bool { return c&clPunct != 0 })),
		matchStage(matchRun(deepseekCJK)),
		matchStage(matchOneNumber),
	}
)

// matchNewline is [\r\n].
func matchNewline(cps []rune, _ []charClass, i, _ int) int {
	if cps[i] == '\r' || cps[i] == '\n' {
		return i + 1
	}
	return i
}

// matchSpaceThen makes `\s?X+` for the class X that in accepts.
func matchSpaceThen(in func(rune, charClass) bool) func(cps []rune, cls []charClass, i, hi int) int {
	run := matchRun(in)
	return func(cps []rune, cls []charClass, i, hi int) int {
		if cls[i]&clSpace != 0 && i+1 < hi && in(cps[i+1], cls[i+1]) {
			return run(cps, cls, i+1, hi)
		}
		return run(cps, cls, i, hi)
	}
}

// matchRun makes `X+` for the class X that in accepts.
func matchRun(in func(rune, charClass) bool) func(cps []rune, cls []charClass, i, hi int) int {
	return func(cps []rune, cls []charClass, i, hi int) int {
		for i < hi && in(cps[i], cls[i]) {
			i++
		}
		return i
	}
}

// splitTrailingSpace is `\s+$` as one std::regex stage: the white space
// that ends a piece becomes a piece of its own. (Searching for the leftmost
// match position by position, as matchStage does, would be quadratic in a
// long run of spaces that does not reach the end.)
func splitTrailingSpace(_ []rune, cls []charClass, lo, hi int, out []int) []int {
	e := emitter{out: out, prev: lo}
	t := hi
	for t > lo && cls[t-1]&clSpace != 0 {
		t--
	}
	e.emit(t)
	e.emit(hi)
	return e.out
}

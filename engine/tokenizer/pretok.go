package tokenizer

import (
	"strings"
	"unicode"
	"unicode/utf8"
)

// The pre-tokenizers cut text into words before byte-level BPE. llama.cpp
// defines each one as a list of regular expressions applied in turn, every
// expression cutting the pieces the previous one produced (text between
// matches stays a piece of its own). Go's regexp has no lookahead, which the
// GPT-2 family needs for `\s+(?!\S)`, so each expression is written here by
// hand, following llama.cpp's own hand-written versions of the GPT-2 and
// Llama 3 expressions (unicode_regex_split_custom_gpt2 / _llama3) where it
// has them. A piece boundary from an earlier expression is a hard edge for
// the later ones: they see the piece as if it were the whole text.

// charClass holds the properties of one code point the splitters look at.
type charClass uint8

const (
	clLetter charClass = 1 << iota // \p{L}
	clNumber                       // \p{N}
	clSpace                        // \s: Unicode White_Space
	clPunct                        // \p{P}
	// clPresent is set for every code point inside the piece being split,
	// so a class of 0 means "past the end of the piece", which is how
	// llama.cpp's splitters tell the end apart from an unassigned code point.
	clPresent
)

// asciiClasses caches classify for ASCII, where nearly all text lives.
var asciiClasses = func() (t [utf8.RuneSelf]charClass) {
	for r := rune(0); r < utf8.RuneSelf; r++ {
		t[r] = classifySlow(r)
	}
	return t
}()

func classify(r rune) charClass {
	if r >= 0 && r < utf8.RuneSelf {
		return asciiClasses[r]
	}
	return classifySlow(r)
}

func classifySlow(r rune) charClass {
	c := clPresent
	switch {
	case unicode.IsLetter(r):
		c |= clLetter
	case unicode.IsNumber(r):
		c |= clNumber
	case unicode.IsPunct(r):
		c |= clPunct
	}
	if unicode.Is(unicode.White_Space, r) {
		c |= clSpace
	}
	return c
}

// stage cuts the code points cps[lo:hi] into consecutive pieces and appends
// the end index of each piece to out.
type stage func(cps []rune, cls []charClass, lo, hi int, out []int) []int

// preConfig is what a tokenizer.ggml.pre name selects in llama.cpp.
type preConfig struct {
	stages       []stage
	ignoreMerges bool // a word that is itself a token skips the merges
	addBOS       bool // default for tokenizer.ggml.add_bos_token
	cleanSpaces  bool // detokenize removes spaces before punctuation
	noBOS        bool // no default BOS id (llama.cpp's chatglm-bpe)
}

func normPre(name string) string {
	if name == "" {
		return "default"
	}
	return name
}

var (
	stagesGPT2   = []stage{splitGPT2}
	stagesLlama3 = []stage{splitLlama3(3)}
	stagesQwen2  = []stage{splitLlama3(1)}
	stagesSmolLM = []stage{matchStage(matchOneNumber), splitGPT2}
	stagesFalcon = []stage{
		matchStage(matchPunctRunTick),
		splitGPT2,
		matchStage(matchThreeASCIIDigits),
	}
	stagesDefault = []stage{
		matchStage(matchPunctRun),
		splitGPT2,
		matchStage(matchNumberRun),
		matchStage(matchThreeASCIIDigits),
	}
)

// preTokenizers maps tokenizer.ggml.pre to its configuration, following
// llama.cpp's llama_vocab::impl::load. Only names whose expressions this
// package implements are listed; any other name is rejected by New.
var preTokenizers = map[string]preConfig{
	"default": {stages: stagesDefault, cleanSpaces: true},

	// GPT-2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
	"gpt-2": {stages: stagesGPT2, cleanSpaces: true},
	"gpt2":  {stages: stagesGPT2, cleanSpaces: true},
	"phi-2": {stages: stagesGPT2, cleanSpaces: true},
	"mpt":   {stages: stagesGPT2, cleanSpaces: true},
	"olmo":  {stages: stagesGPT2, cleanSpaces: true},
	"jais":  {stages: stagesGPT2, cleanSpaces: true},
	// The encoder models' BPE vocabularies that llama.cpp gives GPT-2's
	// expression (jina-v2-de, -es and -code also need <mask> to strip the
	// space before it, which this package does not do: they are refused).
	"jina-es":     {stages: stagesGPT2, cleanSpaces: true},
	"jina-de":     {stages: stagesGPT2, cleanSpaces: true},
	"jina-v1-en":  {stages: stagesGPT2, cleanSpaces: true},
	"gigachat":    {stages: stagesGPT2, cleanSpaces: true},
	"roberta-bpe": {stages: stagesGPT2, cleanSpaces: true},

	// Llama 3: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
	//          ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
	"llama3":    {stages: stagesLlama3, ignoreMerges: true, addBOS: true, cleanSpaces: true},
	"llama-v3":  {stages: stagesLlama3, ignoreMerges: true, addBOS: true, cleanSpaces: true},
	"llama-bpe": {stages: stagesLlama3, ignoreMerges: true, addBOS: true, cleanSpaces: true},
	"falcon3":   {stages: stagesLlama3, ignoreMerges: true, addBOS: true, cleanSpaces: true},
	"pixtral":   {stages: stagesLlama3, ignoreMerges: true, addBOS: true, cleanSpaces: true},
	"dbrx":      {stages: stagesLlama3, cleanSpaces: true},
	// ChatGLM4: the Llama 3 expression, and no BOS by default.
	"chatglm-bpe": {stages: stagesLlama3, cleanSpaces: true, noBOS: true},
	"smaug-bpe":   {stages: stagesLlama3, cleanSpaces: true},

	// Qwen2: the Llama 3 expression with \p{N} (single digits) for \p{N}{1,3}.
	"qwen2":            {stages: stagesQwen2},
	"deepseek-r1-qwen": {stages: stagesQwen2},
	"hunyuan":          {stages: stagesQwen2},
	"megrez":           {stages: stagesQwen2, cleanSpaces: true},
	"stablelm2":        {stages: stagesQwen2, cleanSpaces: true},

	// Falcon: [\p{P}\$\+<=>\^~\|`]+, GPT-2, [0-9][0-9][0-9].
	"falcon": {stages: stagesFalcon, cleanSpaces: true},

	// DeepSeek LLM and Coder: sequences of isolating splits (pretok_deepseek.go).
	"deepseek-llm":   {stages: stagesDeepSeekLLM},
	"deepseek-coder": {stages: stagesDeepSeekCoder},

	// BLOOM family, Viking, Chameleon and Tekken (pretok_more.go).
	"bloom":        {stages: stagesBloom, cleanSpaces: true},
	"gpt3-finnish": {stages: stagesBloom, cleanSpaces: true},
	"poro-chat":    {stages: stagesBloom},
	"viking":       {stages: stagesViking},
	"chameleon":    {stages: stagesChameleon, addBOS: true},
	"tekken":       {stages: stagesTekken, ignoreMerges: true, addBOS: true},

	// SmolLM / StarCoder: \p{N} first (every digit alone), then GPT-2.
	"smollm":     {stages: stagesSmolLM},
	"command-r":  {stages: stagesSmolLM},
	"starcoder":  {stages: stagesSmolLM, cleanSpaces: true},
	"refact":     {stages: stagesSmolLM, cleanSpaces: true},
	"codeshell":  {stages: stagesSmolLM, cleanSpaces: true},
	"exaone":     {stages: stagesSmolLM, cleanSpaces: true},
	"minerva-7b": {stages: stagesSmolLM, cleanSpaces: true},
}

// preTokenize cuts text into words with the given stages. The words are
// substrings of text; together they are exactly text. Bytes that are not
// valid UTF-8 are classified as U+FFFD would be (a symbol), as llama.cpp
// does, but stay themselves in the words.
func preTokenize(text string, stages []stage) []string {
	if text == "" {
		return nil
	}
	cps := make([]rune, 0, len(text))
	offs := make([]int, 0, len(text)+1)
	for i, r := range text { // invalid bytes come out as RuneError, one at a time
		cps = append(cps, r)
		offs = append(offs, i)
	}
	offs = append(offs, len(text))
	cls := make([]charClass, len(cps))
	for i, r := range cps {
		cls[i] = classify(r)
	}

	ends := []int{len(cps)}
	next := make([]int, 0, len(cps)/3+1)
	for _, st := range stages {
		next = next[:0]
		lo := 0
		for _, hi := range ends {
			next = st(cps, cls, lo, hi, next)
			lo = hi
		}
		ends, next = next, ends
	}

	words := make([]string, 0, len(ends))
	lo := 0
	for _, hi := range ends {
		words = append(words, text[offs[lo]:offs[hi]])
		lo = hi
	}
	return words
}

// emitter appends piece ends, skipping empty pieces.
type emitter struct {
	out  []int
	prev int
}

func (e *emitter) emit(end int) {
	if end > e.prev {
		e.out = append(e.out, end)
		e.prev = end
	}
}

// classAt returns the class of cps[i], or 0 past the end of the piece.
func classAt(cls []charClass, i, hi int) charClass {
	if i < hi {
		return cls[i]
	}
	return 0
}

// splitGPT2 implements 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+|
// ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ (contractions are case-sensitive).
func splitGPT2(cps []rune, cls []charClass, lo, hi int, out []int) []int {
	e := emitter{out: out, prev: lo}
	const word = clSpace | clLetter | clNumber
	for pos := lo; pos < hi; {
		c := cps[pos]
		if c == '\'' && pos+1 < hi {
			if n := contraction(cps, pos, hi, false); n > 0 {
				pos += n
				e.emit(pos)
				continue
			}
		}

		f2 := cls[pos]
		if c == ' ' {
			f2 = classAt(cls, pos+1, hi)
		}
		switch {
		case f2&clLetter != 0:
			if c == ' ' {
				pos++
			}
			for classAt(cls, pos, hi)&clLetter != 0 {
				pos++
			}
			e.emit(pos)
			continue
		case f2&clNumber != 0:
			if c == ' ' {
				pos++
			}
			for classAt(cls, pos, hi)&clNumber != 0 {
				pos++
			}
			e.emit(pos)
			continue
		case f2&word == 0 && f2 != 0:
			if c == ' ' {
				pos++
			}
			for f := classAt(cls, pos, hi); f&word == 0 && f != 0; f = classAt(cls, pos, hi) {
				pos++
			}
			e.emit(pos)
			continue
		}

		pos = whitespace(cps, cls, pos, hi, false)
		e.emit(pos)
	}
	return e.out
}

// splitLlama3 implements the Llama 3 expression with \p{N}{1,maxDigits}:
// (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,maxDigits}|
// ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
// With maxDigits 1 it is Qwen2's expression.
func splitLlama3(maxDigits int) stage {
	return func(cps []rune, cls []charClass, lo, hi int, out []int) []int {
		e := emitter{out: out, prev: lo}
		const word = clSpace | clLetter | clNumber
		for pos := lo; pos < hi; {
			c, f := cps[pos], cls[pos]
			if c == '\'' && pos+1 < hi {
				if n := contraction(cps, pos, hi, true); n > 0 {
					pos += n
					e.emit(pos)
					continue
				}
			}

			// [^\r\n\p{L}\p{N}]?\p{L}+
			if c != '\r' && c != '\n' && f&clNumber == 0 {
				if f&clLetter != 0 || classAt(cls, pos+1, hi)&clLetter != 0 {
					pos++
					for classAt(cls, pos, hi)&clLetter != 0 {
						pos++
					}
					e.emit(pos)
					continue
				}
			}

			// \p{N}{1,maxDigits}
			if f&clNumber != 0 {
				start := pos
				for classAt(cls, pos, hi)&clNumber != 0 {
					pos++
					if pos-start >= maxDigits {
						e.emit(pos)
						start = pos
					}
				}
				e.emit(pos)
				continue
			}

			// ' ?[^\s\p{L}\p{N}]+[\r\n]*'. As in llama.cpp, a lone space at
			// the end of the piece is taken here; \s+ would take the same.
			f2 := f
			if c == ' ' {
				f2 = classAt(cls, pos+1, hi)
			}
			if f2&word == 0 && f != 0 {
				if c == ' ' {
					pos++
				}
				for g := classAt(cls, pos, hi); g&word == 0 && g != 0; g = classAt(cls, pos, hi) {
					pos++
				}
				for pos < hi && (cps[pos] == '\r' || cps[pos] == '\n') {
					pos++
				}
				e.emit(pos)
				continue
			}

			pos = whitespace(cps, cls, pos, hi, true)
			e.emit(pos)
		}
		return e.out
	}
}

// contraction returns the length of the contraction 's 't 're 've 'm 'll 'd
// starting at the apostrophe cps[pos], or 0. fold makes it case-insensitive.
func contraction(cps []rune, pos, hi int, fold bool) int {
	lower := func(r rune) rune {
		if fold {
			return unicode.ToLower(r)
		}
		return r
	}
	n := lower(cps[pos+1])
	switch n {
	case 's', 't', 'm', 'd':
		return 2
	}
	if pos+2 < hi {
		nn := lower(cps[pos+2])
		if (n == 'r' && nn == 'e') || (n == 'v' && nn == 'e') || (n == 'l' && nn == 'l') {
			return 3
		}
	}
	return 0
}

// whitespace matches, at pos, the alternatives both expressions end with:
// \s*[\r\n]+ (only when newlines is set), \s+(?!\S), \s+, and failing all
// of them a single code point. It returns the end of the match.
func whitespace(cps []rune, cls []charClass, pos, hi int, newlines bool) int {
	n, lastNL := 0, -1
	for classAt(cls, pos+n, hi)&clSpace != 0 {
		if newlines && (cps[pos+n] == '\r' || cps[pos+n] == '\n') {
			lastNL = pos + n + 1
		}
		n++
	}
	switch {
	case lastNL >= 0:
		return lastNL
	case n > 1 && pos+n < hi:
		// \s+(?!\S): leave the last space to prefix the word that follows.
		return pos + n - 1
	case n > 0:
		return pos + n
	}
	return pos + 1
}

// matchStage makes a stage that behaves like one regular expression in
// llama.cpp's std::regex fallback: each leftmost match becomes a piece, and
// so does the text between matches. match returns the end of the match that
// starts at i, or i when there is none.
func matchStage(match func(cps []rune, cls []charClass, i, hi int) int) stage {
	return func(cps []rune, cls []charClass, lo, hi int, out []int) []int {
		e := emitter{out: out, prev: lo}
		for pos := lo; pos < hi; {
			if end := match(cps, cls, pos, hi); end > pos {
				e.emit(pos)
				e.emit(end)
				pos = end
			} else {
				pos++
			}
		}
		e.emit(hi)
		return e.out
	}
}

// matchOneNumber is \p{N}.
func matchOneNumber(_ []rune, cls []charClass, i, _ int) int {
	if cls[i]&clNumber != 0 {
		return i + 1
	}
	return i
}

// matchNumberRun is \p{N}+.
func matchNumberRun(_ []rune, cls []charClass, i, hi int) int {
	for i < hi && cls[i]&clNumber != 0 {
		i++
	}
	return i
}

// matchPunctRun is [\p{P}\$\+<=>\^~\|]+.
func matchPunctRun(cps []rune, cls []charClass, i, hi int) int {
	for i < hi && (cls[i]&clPunct != 0 || strings.ContainsRune("$+<=>^~|", cps[i])) {
		i++
	}
	return i
}

// matchPunctRunTick is Falcon's [\p{P}\$\+<=>\^~\|`]+.
func matchPunctRunTick(cps []rune, cls []charClass, i, hi int) int {
	for i < hi && (cls[i]&clPunct != 0 || strings.ContainsRune("$+<=>^~|`", cps[i])) {
		i++
	}
	return i
}

// matchThreeASCIIDigits is [0-9][0-9][0-9].
func matchThreeASCIIDigits(cps []rune, _ []charClass, i, hi int) int {
	if i+3 > hi {
		return i
	}
	for _, r := range cps[i : i+3] {
		if r < '0' || r > '9' {
			return i
		}
	}
	return i + 3
}

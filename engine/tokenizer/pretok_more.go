package tokenizer

import "strings"

// More of llama.cpp's pre-tokenizers: the BLOOM family's single expression,
// Chameleon's sequence and Mistral's Tekken expression. The first two run
// through std::regex in llama.cpp, Tekken too; each stage follows the
// semantics of the expression it names (leftmost match, greedy, white space
// as Unicode White_Space).

var (
	// BLOOM, Poro, GPT-3 Finnish: ` ?[^(\s|.,!?…。，、।۔،)]+`.
	stagesBloom = []stage{matchStage(matchBloomWord)}
	// Viking: the BLOOM expression, then \p{N}.
	stagesViking = []stage{matchStage(matchBloomWord), matchStage(matchOneNumber)}
	// Chameleon: <sentinel:[0-9]+>, (IMGIMG)((A|…|I){1,4})Z, ([\t\n]|    |  ),
	// \p{N}, [\p{P}!-/:-@\[-`{-~], then GPT-2.
	stagesChameleon = []stage{
		matchStage(matchSentinel),
		matchStage(matchImageToken),
		matchStage(matchChameleonSpace),
		matchStage(matchOneNumber),
		matchStage(matchChameleonPunct),
		splitGPT2,
	}
	// Tekken (Mistral NeMo and later): see splitTekken.
	stagesTekken = []stage{splitTekken}
)

// bloomStop holds the characters besides white space that the BLOOM
// expression's class excludes: `(`, `|`, `)` (the class is written as if it
// were a group) and sentence punctuation.
const bloomStop = "(|).,!?…。，、।۔،"

func bloomWordRune(r rune, c charClass) bool {
	return c&clSpace == 0 && !strings.ContainsRune(bloomStop, r)
}

// matchBloomWord is ` ?[^(\s|.,!?…。，、।۔،)]+`.
func matchBloomWord(cps []rune, cls []charClass, i, hi int) int {
	j := i
	if cps[j] == ' ' && j+1 < hi && bloomWordRune(cps[j+1], cls[j+1]) {
		j++
	}
	for j < hi && bloomWordRune(cps[j], cls[j]) {
		j++
	}
	return j
}

// matchSentinel is <sentinel:[0-9]+>.
func matchSentinel(cps []rune, _ []charClass, i, hi int) int {
	const pre = "<sentinel:"
	if !hasPrefixRunes(cps[i:hi], pre) {
		return i
	}
	j := i + len(pre)
	k := j
	for k < hi && cps[k] >= '0' && cps[k] <= '9' {
		k++
	}
	if k == j || k >= hi || cps[k] != '>' {
		return i
	}
	return k + 1
}

// matchImageToken is (IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z. Backing off the
// greedy {1,4} cannot help: the letter it gives back is not a Z.
func matchImageToken(cps []rune, _ []charClass, i, hi int) int {
	if !hasPrefixRunes(cps[i:hi], "IMGIMG") {
		return i
	}
	j := i + 6
	k := j
	for k < hi && k-j < 4 && cps[k] >= 'A' && cps[k] <= 'I' {
		k++
	}
	if k == j || k >= hi || cps[k] != 'Z' {
		return i
	}
	return k + 1
}

// matchChameleonSpace is ([\t\n]|    |  ).
func matchChameleonSpace(cps []rune, _ []charClass, i, hi int) int {
	switch {
	case cps[i] == '\t' || cps[i] == '\n':
		return i + 1
	case hasPrefixRunes(cps[i:hi], "    "):
		return i + 4
	case hasPrefixRunes(cps[i:hi], "  "):
		return i + 2
	}
	return i
}

// matchChameleonPunct is [\p{P}!-/:-@\[-`{-~]: one punctuation mark or
// ASCII symbol.
func matchChameleonPunct(cps []rune, cls []charClass, i, _ int) int {
	r := cps[i]
	if cls[i]&clPunct != 0 || (r >= '!' && r <= '/') || (r >= ':' && r <= '@') || (r >= '[' && r <= '`') || (r >= '{' && r <= '~') {
		return i + 1
	}
	return i
}

func hasPrefixRunes(cps []rune, s string) bool {
	i := 0
	for _, r := range s {
		if i >= len(cps) || cps[i] != r {
			return false
		}
		i++
	}
	return true
}

// splitTekken implements Tekken's expression as llama.cpp runs it:
//
//	[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+|
//	[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*|
//	\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+
//
// With U a letter that is not a-z and W a letter that is not A-Z, the first
// two alternatives are P?U*W+ and P?U+W*. Only ASCII letters differ between
// U and W (llama.cpp matches on a collapsed text in which every non-ASCII
// letter is the same byte, so it is both), so an ASCII word splits before
// an upper-case letter that follows a lower-case one ("camelCase" is
// "camel", "Case").
func splitTekken(cps []rune, cls []charClass, lo, hi int, out []int) []int {
	e := emitter{out: out, prev: lo}
	const word = clSpace | clLetter | clNumber
	isU := func(k int) bool { return k < hi && cls[k]&clLetter != 0 && !(cps[k] >= 'a' && cps[k] <= 'z') }
	isW := func(k int) bool { return k < hi && cls[k]&clLetter != 0 && !(cps[k] >= 'A' && cps[k] <= 'Z') }
	wRun := func(k int) int {
		for isW(k) {
			k++
		}
		return k
	}
	// uw matches U*W+ at s: the greedy U* gives back letters until W+ can
	// start, which takes a letter that is both (non-ASCII).
	uw := func(s int) (int, bool) {
		k := s
		for isU(k) {
			k++
		}
		for j := k; j >= s; j-- {
			if isW(j) {
				return wRun(j), true
			}
		}
		return 0, false
	}
	// uPlusW matches U+W* at s.
	uPlusW := func(s int) (int, bool) {
		k := s
		for isU(k) {
			k++
		}
		if k == s {
			return 0, false
		}
		return wRun(k), true
	}
	for pos := lo; pos < hi; {
		c, f := cps[pos], cls[pos]
		prefix := c != '\r' && c != '\n' && f&(clLetter|clNumber) == 0
		matched := false
		for _, alt := range []func(int) (int, bool){uw, uPlusW} {
			if prefix {
				if end, ok := alt(pos + 1); ok {
					pos, matched = end, true
					break
				}
			}
			if end, ok := alt(pos); ok {
				pos, matched = end, true
				break
			}
		}
		if matched {
			e.emit(pos)
			continue
		}
		if f&clNumber != 0 {
			pos++
			e.emit(pos)
			continue
		}
		// ' ?[^\s\p{L}\p{N}]+[\r\n/]*'
		f2 := f
		if c == ' ' {
			f2 = classAt(cls, pos+1, hi)
		}
		if f2&word == 0 && f2 != 0 {
			if c == ' ' {
				pos++
			}
			for g := classAt(cls, pos, hi); g&word == 0 && g != 0; g = classAt(cls, pos, hi) {
				pos++
			}
			for pos < hi && (cps[pos] == '\r' || cps[pos] == '\n' || cps[pos] == '/') {
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

package jsonschema

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/baton-serving/baton/engine/internal/runeset"
)

// The pattern subset: literals, escapes of punctuation, \d \w \s (and their
// negations) with Go regexp's ASCII meanings, \t \n \r \f \v \xHH \uHHHH,
// classes [...] and [^...] with ranges, '.', groups (...) and (?:...),
// alternation, the quantifiers * + ? {m} {m,} {m,n} (lazy forms too: same
// language), and anchors ^ and $ at the start and end of a top-level
// alternative. A pattern is a search, as in JSON Schema: an alternative not
// anchored at an end may have anything there. Everything else (lookaround,
// backreferences, \b, \p{...}, named groups, flags) is refused by name.

type rng = runeset.Range

const maxRune = runeset.MaxRune

type rxOp uint8

const (
	rxSet    rxOp = iota // one character of set
	rxConcat             // subs in order
	rxAlt                // one of subs
	rxRepeat             // subs[0] min..max times (max < 0: unbounded)
)

type rx struct {
	op       rxOp
	set      []rng
	subs     []*rx
	min, max int
}

type rxParser struct {
	src   []rune
	pos   int
	path  string
	depth int
}

func (p *rxParser) fail(format string, args ...any) *Error {
	return errorf(p.path, "pattern", "%s (at character %d of the pattern)", fmt.Sprintf(format, args...), p.pos)
}

// pattern compiles a pattern to the GBNF of a JSON string's contents (the
// text between the quotes) whose decoded value the pattern matches.
func (c *compiler) pattern(src, path string) (string, error) {
	p := &rxParser{src: []rune(src), path: path}
	var branches []string
	for {
		anchoredStart := false
		if p.peek() == '^' {
			p.pos++
			anchoredStart = true
		}
		body, err := p.concat(true)
		if err != nil {
			return "", err
		}
		anchoredEnd := false
		if p.peek() == '$' {
			p.pos++
			anchoredEnd = true
		}
		if p.pos < len(p.src) && p.src[p.pos] != '|' {
			if p.src[p.pos] == '^' || p.src[p.pos] == '$' {
				return "", p.fail("anchors are supported only at the start or end of the pattern or of a top-level alternative")
			}
			return "", p.fail("unexpected %q", p.src[p.pos])
		}
		g, err := c.rxGBNF(body, path)
		if err != nil {
			return "", err
		}
		var parts []string
		if !anchoredStart {
			parts = append(parts, c.use("char")+"*")
		}
		if g != `""` {
			parts = append(parts, g)
		}
		if !anchoredEnd && (anchoredStart || g != `""`) {
			parts = append(parts, c.use("char")+"*")
		}
		if len(parts) == 0 {
			parts = []string{`""`}
		}
		branches = append(branches, strings.Join(parts, " "))
		if p.pos >= len(p.src) {
			break
		}
		p.pos++ // '|'
	}
	return alternatives(branches), nil
}

func (p *rxParser) peek() rune {
	if p.pos < len(p.src) {
		return p.src[p.pos]
	}
	return -1
}

// alt parses alternatives inside a group.
func (p *rxParser) alt() (*rx, error) {
	var subs []*rx
	for {
		s, err := p.concat(false)
		if err != nil {
			return nil, err
		}
		subs = append(subs, s)
		if p.peek() != '|' {
			break
		}
		p.pos++
	}
	if len(subs) == 1 {
		return subs[0], nil
	}
	return &rx{op: rxAlt, subs: subs}, nil
}

// concat parses a sequence up to '|', ')' or the end. At the top level a
// '$' that ends the alternative stops it too.
func (p *rxParser) concat(top bool) (*rx, error) {
	seq := &rx{op: rxConcat}
	for p.pos < len(p.src) {
		r := p.src[p.pos]
		switch r {
		case '|', ')':
			if r == ')' && top {
				return nil, p.fail("unbalanced ')'")
			}
			return seq, nil
		case '$':
			if top && (p.pos+1 == len(p.src) || p.src[p.pos+1] == '|') {
				return seq, nil
			}
			return nil, p.fail("anchors are supported only at the start or end of the pattern or of a top-level alternative")
		case '^':
			return nil, p.fail("anchors are supported only at the start or end of the pattern or of a top-level alternative")
		case '*', '+', '?':
			return nil, p.fail("%q has nothing to repeat", r)
		}
		atom, err := p.atom()
		if err != nil {
			return nil, err
		}
		if atom, err = p.quantifiers(atom); err != nil {
			return nil, err
		}
		seq.subs = append(seq.subs, atom)
	}
	return seq, nil
}

func (p *rxParser) quantifiers(atom *rx) (*rx, error) {
	repeated := false
	for p.pos < len(p.src) {
		lo, hi := 0, 0
		start := p.pos
		switch p.src[p.pos] {
		case '*':
			lo, hi = 0, -1
			p.pos++
		case '+':
			lo, hi = 1, -1
			p.pos++
		case '?':
			lo, hi = 0, 1
			p.pos++
		case '{':
			var ok bool
			lo, hi, ok = p.braces()
			if !ok {
				p.pos = start
				return atom, nil // a literal '{', as Go's regexp reads it
			}
		default:
			return atom, nil
		}
		if repeated {
			p.pos = start
			return nil, p.fail("nested repetition operators are not supported")
		}
		repeated = true
		if p.peek() == '?' {
			p.pos++ // lazy: the same set of strings
		}
		if p.peek() == '+' {
			return nil, p.fail("possessive quantifiers are not supported")
		}
		if lo > MaxCount || hi > MaxCount {
			return nil, p.fail("repetition count above %d", MaxCount)
		}
		atom = &rx{op: rxRepeat, subs: []*rx{atom}, min: lo, max: hi}
	}
	return atom, nil
}

// braces reads {m}, {m,} or {m,n}; ok is false if the '{' starts no
// quantifier.
func (p *rxParser) braces() (lo, hi int, ok bool) {
	i := p.pos + 1
	num := func() (int, bool) {
		j := i
		for i < len(p.src) && p.src[i] >= '0' && p.src[i] <= '9' && i-j < 7 {
			i++
		}
		if i == j {
			return 0, false
		}
		n, err := strconv.Atoi(string(p.src[j:i]))
		return n, err == nil
	}
	lo, ok = num()
	if !ok {
		return 0, 0, false
	}
	hi = lo
	if i < len(p.src) && p.src[i] == ',' {
		i++
		hi = -1
		if i < len(p.src) && p.src[i] != '}' {
			if hi, ok = num(); !ok {
				return 0, 0, false
			}
		}
	}
	if i >= len(p.src) || p.src[i] != '}' {
		return 0, 0, false
	}
	if hi >= 0 && hi < lo {
		return 0, 0, false
	}
	p.pos = i + 1
	return lo, hi, true
}

var (
	setDigit = []rng{{Lo: '0', Hi: '9'}}
	setWord  = []rng{{Lo: '0', Hi: '9'}, {Lo: 'A', Hi: 'Z'}, {Lo: '_', Hi: '_'}, {Lo: 'a', Hi: 'z'}}
	setSpace = []rng{{Lo: '\t', Hi: '\n'}, {Lo: '\f', Hi: '\r'}, {Lo: ' ', Hi: ' '}}
	// setDot is what '.' matches: any character but a newline (Go regexp).
	setDot = []rng{{Lo: 0, Hi: '\n' - 1}, {Lo: '\n' + 1, Hi: maxRune}}
)

func (p *rxParser) atom() (*rx, error) {
	r := p.src[p.pos]
	switch r {
	case '(':
		p.pos++
		if p.peek() == '?' {
			if p.pos+1 < len(p.src) && p.src[p.pos+1] == ':' {
				p.pos += 2
			} else {
				return nil, p.fail("group syntax (?...) other than (?:...) is not supported (lookaround, named groups and flags are not)")
			}
		}
		p.depth++
		if p.depth > 100 {
			return nil, p.fail("groups nested deeper than 100")
		}
		inner, err := p.alt()
		if err != nil {
			return nil, err
		}
		if p.peek() != ')' {
			return nil, p.fail("unbalanced '('")
		}
		p.pos++
		p.depth--
		return inner, nil
	case '[':
		return p.class()
	case '.':
		p.pos++
		return &rx{op: rxSet, set: setDot}, nil
	case '\\':
		set, err := p.escape(false)
		if err != nil {
			return nil, err
		}
		return &rx{op: rxSet, set: set}, nil
	}
	p.pos++
	return &rx{op: rxSet, set: []rng{{Lo: r, Hi: r}}}, nil
}

// escape reads a backslash escape and returns its character set.
func (p *rxParser) escape(inClass bool) ([]rng, error) {
	p.pos++ // '\'
	if p.pos >= len(p.src) {
		return nil, p.fail("the pattern ends with a lone backslash")
	}
	e := p.src[p.pos]
	p.pos++
	one := func(r rune) []rng { return []rng{{Lo: r, Hi: r}} }
	switch e {
	case 'd':
		return setDigit, nil
	case 'D':
		return runeset.Complement(setDigit), nil
	case 'w':
		return setWord, nil
	case 'W':
		return runeset.Complement(setWord), nil
	case 's':
		return setSpace, nil
	case 'S':
		return runeset.Complement(setSpace), nil
	case 't':
		return one('\t'), nil
	case 'n':
		return one('\n'), nil
	case 'r':
		return one('\r'), nil
	case 'f':
		return one('\f'), nil
	case 'v':
		return one('\v'), nil
	case 'x', 'u':
		n := 2
		if e == 'u' {
			n = 4
		}
		if p.pos+n > len(p.src) {
			return nil, p.fail("\\%c needs %d hex digits", e, n)
		}
		v, err := strconv.ParseUint(string(p.src[p.pos:p.pos+n]), 16, 32)
		if err != nil {
			return nil, p.fail("\\%c needs %d hex digits", e, n)
		}
		p.pos += n
		if v >= 0xD800 && v <= 0xDFFF {
			return nil, p.fail("surrogate escapes are not supported")
		}
		return one(rune(v)), nil
	}
	if e < 0x80 && !('a' <= e && e <= 'z' || 'A' <= e && e <= 'Z' || '0' <= e && e <= '9') {
		return one(e), nil // an escaped punctuation character is itself
	}
	what := "escape"
	switch e {
	case 'b', 'B':
		what = "word boundaries"
	case 'p', 'P':
		what = "Unicode classes"
	case 'k', '1', '2', '3', '4', '5', '6', '7', '8', '9':
		what = "backreferences"
	}
	return nil, p.fail("\\%c is not supported (%s)", e, what)
}

func (p *rxParser) class() (*rx, error) {
	p.pos++ // '['
	neg := false
	if p.peek() == '^' {
		neg = true
		p.pos++
	}
	if p.peek() == ']' {
		return nil, p.fail("a class starting with ']' is not supported (escape it)")
	}
	var set []rng
	for {
		if p.pos >= len(p.src) {
			return nil, p.fail("unterminated character class")
		}
		r := p.src[p.pos]
		if r == ']' {
			p.pos++
			break
		}
		if r == '[' {
			return nil, p.fail("'[' inside a class is not supported (escape it)")
		}
		var lo []rng
		if r == '\\' {
			s, err := p.escape(true)
			if err != nil {
				return nil, err
			}
			lo = s
		} else {
			p.pos++
			lo = []rng{{Lo: r, Hi: r}}
		}
		// A range a-b, unless '-' ends the class.
		if p.peek() == '-' && p.pos+1 < len(p.src) && p.src[p.pos+1] != ']' {
			if len(lo) != 1 || lo[0].Lo != lo[0].Hi {
				return nil, p.fail("a range must start with one character")
			}
			p.pos++
			var hi rune
			if p.src[p.pos] == '\\' {
				s, err := p.escape(true)
				if err != nil {
					return nil, err
				}
				if len(s) != 1 || s[0].Lo != s[0].Hi {
					return nil, p.fail("a range must end with one character")
				}
				hi = s[0].Lo
			} else {
				hi = p.src[p.pos]
				p.pos++
			}
			if hi < lo[0].Lo {
				return nil, p.fail("the range %q-%q is backwards", lo[0].Lo, hi)
			}
			lo = []rng{{Lo: lo[0].Lo, Hi: hi}}
		}
		set = append(set, lo...)
	}
	set = runeset.Normalize(set)
	if neg {
		set = runeset.Complement(set)
	}
	return &rx{op: rxSet, set: set}, nil
}

// subtract removes the code points of b from a (both normalized).
func subtract(a, b []rng) []rng {
	return intersect(a, runeset.Complement(b))
}

func intersect(a, b []rng) []rng {
	var out []rng
	i, j := 0, 0
	for i < len(a) && j < len(b) {
		lo, hi := max(a[i].Lo, b[j].Lo), min(a[i].Hi, b[j].Hi)
		if lo <= hi {
			out = append(out, rng{Lo: lo, Hi: hi})
		}
		if a[i].Hi < b[j].Hi {
			i++
		} else {
			j++
		}
	}
	return out
}

// jsonSpecial are the code points a JSON string cannot hold raw; surrogates
// are not characters at all.
var (
	jsonSpecial = []rng{{Lo: 0, Hi: 0x1F}, {Lo: '"', Hi: '"'}, {Lo: '\\', Hi: '\\'}}
	surrogates  = []rng{{Lo: 0xD800, Hi: 0xDFFF}}
)

// setGBNF is the GBNF of one decoded character from set, as it appears
// inside a JSON string: raw where JSON allows, else as its escape.
func setGBNF(set []rng) string {
	set = subtract(set, surrogates)
	if len(set) == 1 && set[0].Lo == set[0].Hi && set[0].Lo >= 0x20 {
		return gbnfLit(jsonEscapeIfNeeded(set[0].Lo))
	}
	var alts []string
	if raw := subtract(set, jsonSpecial); len(raw) > 0 {
		var sb strings.Builder
		sb.WriteByte('[')
		for _, r := range raw {
			sb.WriteString(classChar(r.Lo))
			if r.Hi > r.Lo {
				sb.WriteByte('-')
				sb.WriteString(classChar(r.Hi))
			}
		}
		sb.WriteByte(']')
		alts = append(alts, sb.String())
	}
	for _, r := range intersect(set, jsonSpecial) {
		for ch := r.Lo; ch <= r.Hi; ch++ {
			alts = append(alts, gbnfLit(jsonEscape(ch)))
		}
	}
	if len(alts) == 0 {
		return ""
	}
	return alternatives(alts)
}

func jsonEscapeIfNeeded(r rune) string {
	if len(intersect([]rng{{Lo: r, Hi: r}}, jsonSpecial)) > 0 {
		return jsonEscape(r)
	}
	return string(r)
}

// jsonEscape is how JSON writes a character it cannot hold raw.
func jsonEscape(r rune) string {
	switch r {
	case '"':
		return `\"`
	case '\\':
		return `\\`
	case '\b':
		return `\b`
	case '\f':
		return `\f`
	case '\n':
		return `\n`
	case '\r':
		return `\r`
	case '\t':
		return `\t`
	}
	return fmt.Sprintf(`\u%04x`, r)
}

// rxGBNF writes a parsed pattern as GBNF over JSON string contents.
func (c *compiler) rxGBNF(x *rx, path string) (string, error) {
	switch x.op {
	case rxSet:
		g := setGBNF(x.set)
		if g == "" {
			return "", errorf(path, "pattern", "a character class matches no character")
		}
		return g, nil
	case rxConcat:
		var parts []string
		for _, s := range x.subs {
			g, err := c.rxGBNF(s, path)
			if err != nil {
				return "", err
			}
			if g != `""` {
				parts = append(parts, g)
			}
		}
		if len(parts) == 0 {
			return `""`, nil
		}
		if len(parts) == 1 {
			return parts[0], nil
		}
		return "(" + strings.Join(parts, " ") + ")", nil
	case rxAlt:
		var alts []string
		for _, s := range x.subs {
			g, err := c.rxGBNF(s, path)
			if err != nil {
				return "", err
			}
			alts = append(alts, g)
		}
		return alternatives(alts), nil
	}
	g, err := c.rxGBNF(x.subs[0], path)
	if err != nil {
		return "", err
	}
	if g == `""` {
		return `""`, nil
	}
	if err := c.spend(path, "pattern", max(x.min, x.max)); err != nil {
		return "", err
	}
	return repeat(group(g), x.min, x.max), nil
}

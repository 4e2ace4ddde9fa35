package grammar

import (
	"fmt"
	"slices"
	"strconv"
	"unicode/utf8"

	"github.com/baton-serving/baton/engine"
	"github.com/baton-serving/baton/engine/internal/runeset"
)

// Limits that keep a hostile grammar from taking unbounded memory or time
// while it is parsed and compiled. Each is far above what real grammars
// (llama.cpp's examples, compiled JSON Schemas) need.
const (
	// MaxSourceBytes bounds the GBNF source text.
	MaxSourceBytes = 1 << 20
	// MaxElements bounds the compiled grammar: terminals and rule
	// references after repetitions are expanded.
	MaxElements = 1 << 18
	// MaxRules bounds the rules, named and synthesized (groups, repetitions).
	MaxRules = 1 << 16
	// MaxRepeat bounds the counts of {m}, {m,} and {m,n}.
	MaxRepeat = 10000
	// maxNesting bounds parenthesis depth (the parser recurses on it).
	maxNesting = 512
)

// Error is a grammar that cannot be compiled. It wraps
// engine.ErrInvalidInput; Error() names the rule and the byte offset.
type Error struct {
	Rule   string // the rule being parsed or at fault; "" before the first rule
	Offset int    // byte offset into the source
	Msg    string
}

func (e *Error) Error() string {
	if e.Rule == "" {
		return fmt.Sprintf("grammar: offset %d: %s", e.Offset, e.Msg)
	}
	return fmt.Sprintf("grammar: rule %q at offset %d: %s", e.Rule, e.Offset, e.Msg)
}

// Unwrap makes errors.Is(err, engine.ErrInvalidInput) true.
func (e *Error) Unwrap() error { return engine.ErrInvalidInput }

// item is one symbol of a sequence while parsing: a character set or a
// reference to a rule.
type item struct {
	ref bool
	set []rng // when !ref: sorted, merged, non-empty ranges (empty: matches nothing)
	id  int32 // when ref: the rule id
	off int32 // source offset, for messages
}

// prule is a rule while parsing.
type prule struct {
	name    string // the user rule's name (synthesized rules carry their parent's)
	alts    [][]item
	defined bool
	defOff  int
	useOff  int // first reference, for "undefined" messages
	synth   bool
}

type parser struct {
	src   string
	pos   int
	rules []*prule
	ids   map[string]int32
	items int // total items, against MaxElements
	depth int
	cur   string // rule being parsed, for messages
}

func (p *parser) fail(off int, format string, args ...any) {
	panic(&Error{Rule: p.cur, Offset: off, Msg: fmt.Sprintf(format, args...)})
}

// Parse compiles GBNF source in llama.cpp's notation (start rule "root").
// Errors wrap engine.ErrInvalidInput and name the rule and the offset.
func Parse(src string) (g *Grammar, err error) {
	if len(src) > MaxSourceBytes {
		return nil, &Error{Msg: fmt.Sprintf("source is %d bytes, more than the limit of %d", len(src), MaxSourceBytes)}
	}
	p := &parser{src: src, ids: map[string]int32{}}
	defer func() {
		if r := recover(); r != nil {
			e, ok := r.(*Error)
			if !ok {
				panic(r)
			}
			g, err = nil, e
		}
	}()
	p.parse()
	return compile(p), nil
}

func (p *parser) peek(k int) byte {
	if p.pos+k < len(p.src) {
		return p.src[p.pos+k]
	}
	return 0
}

func (p *parser) eof() bool { return p.pos >= len(p.src) }

// space skips blanks and comments; newlines only when newlineOK.
func (p *parser) space(newlineOK bool) {
	for !p.eof() {
		switch c := p.src[p.pos]; {
		case c == ' ' || c == '\t':
			p.pos++
		case c == '#':
			for !p.eof() && p.src[p.pos] != '\n' && p.src[p.pos] != '\r' {
				p.pos++
			}
		case newlineOK && (c == '\n' || c == '\r'):
			p.pos++
		default:
			return
		}
	}
}

// isWordChar: rule names are letters, digits and '-' as in llama.cpp;
// '_' is accepted too.
func isWordChar(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_'
}

func (p *parser) name() string {
	start := p.pos
	for !p.eof() && isWordChar(p.src[p.pos]) {
		p.pos++
	}
	if p.pos == start {
		p.fail(start, "expected a rule name, found %s", p.describe())
	}
	return p.src[start:p.pos]
}

// describe names what is at the current position, for messages.
func (p *parser) describe() string {
	if p.eof() {
		return "the end of the grammar"
	}
	r, _ := utf8.DecodeRuneInString(p.src[p.pos:])
	return strconv.QuoteRune(r)
}

func (p *parser) symbol(name string, off int) int32 {
	if id, ok := p.ids[name]; ok {
		return id
	}
	id := p.newRule(name, false)
	p.ids[name] = id
	p.rules[id].useOff = off
	return id
}

func (p *parser) newRule(name string, synth bool) int32 {
	if len(p.rules) >= MaxRules {
		p.fail(p.pos, "more than %d rules", MaxRules)
	}
	p.rules = append(p.rules, &prule{name: name, synth: synth, useOff: -1})
	return int32(len(p.rules) - 1)
}

func (p *parser) parse() {
	p.space(true)
	for !p.eof() {
		p.rule()
	}
	p.cur = ""
	for _, r := range p.rules {
		if !r.defined && !r.synth {
			p.cur = r.name
			p.fail(r.useOff, "rule %q is used but never defined", r.name)
		}
	}
	if _, ok := p.ids["root"]; !ok || !p.rules[p.ids["root"]].defined {
		p.fail(len(p.src), "no rule named \"root\" (the start rule)")
	}
}

func (p *parser) rule() {
	start := p.pos
	p.cur = ""
	name := p.name()
	p.cur = name
	id := p.symbol(name, start)
	r := p.rules[id]
	if r.defined {
		p.fail(start, "rule %q is defined twice (first at offset %d)", name, r.defOff)
	}
	r.defined, r.defOff = true, start
	p.space(false)
	if !(p.peek(0) == ':' && p.peek(1) == ':' && p.peek(2) == '=') {
		p.fail(p.pos, "expected \"::=\" after the rule name, found %s", p.describe())
	}
	p.pos += 3
	p.space(true)
	r.alts = p.alternates(name, false)
	switch {
	case p.eof():
	case p.peek(0) == '\r':
		p.pos++
		if p.peek(0) == '\n' {
			p.pos++
		}
	case p.peek(0) == '\n':
		p.pos++
	case p.peek(0) == ')':
		p.fail(p.pos, "unbalanced ')'")
	default:
		p.fail(p.pos, "expected a newline or the end of the grammar, found %s", p.describe())
	}
	p.space(true)
}

func (p *parser) alternates(name string, nested bool) [][]item {
	alts := [][]item{p.sequence(name, nested)}
	for p.peek(0) == '|' {
		p.pos++
		p.space(true)
		alts = append(alts, p.sequence(name, nested))
	}
	return alts
}

func (p *parser) add(seq []item, it item) []item {
	p.items++
	if p.items > MaxElements {
		p.fail(int(it.off), "the grammar has more than %d elements", MaxElements)
	}
	return append(seq, it)
}

func (p *parser) sequence(name string, nested bool) []item {
	var seq []item
	last := -1 // start of the last symbol in seq, for repetition operators
	for !p.eof() {
		c := p.src[p.pos]
		off := p.pos
		switch {
		case c == '"':
			p.pos++
			last = len(seq)
			for {
				if p.eof() {
					p.fail(off, "unterminated string literal")
				}
				if p.src[p.pos] == '"' {
					break
				}
				r := p.char()
				seq = p.add(seq, item{set: []rng{{Lo: r, Hi: r}}, off: int32(off)})
			}
			p.pos++
			if len(seq) == last {
				last = -1 // "" is nothing to repeat
			}
		case c == '[':
			p.pos++
			neg := false
			if p.peek(0) == '^' {
				neg = true
				p.pos++
			}
			var set []rng
			for {
				if p.eof() {
					p.fail(off, "unterminated character class (missing ']')")
				}
				if p.src[p.pos] == ']' {
					break
				}
				lo := p.char()
				hi := lo
				if p.peek(0) == '-' && p.peek(1) != ']' && p.pos+1 < len(p.src) {
					p.pos++
					hi = p.char()
					if hi < lo {
						p.fail(p.pos, "character range is backwards (%U > %U)", lo, hi)
					}
				}
				set = append(set, rng{Lo: lo, Hi: hi})
			}
			p.pos++
			set = runeset.Normalize(set)
			if neg {
				set = runeset.Complement(set)
			}
			last = len(seq)
			seq = p.add(seq, item{set: set, off: int32(off)})
		case c == '.':
			p.pos++
			last = len(seq)
			seq = p.add(seq, item{set: []rng{{Lo: 0, Hi: maxRune}}, off: int32(off)})
		case isWordChar(c):
			n := p.name()
			last = len(seq)
			seq = p.add(seq, item{ref: true, id: p.symbol(n, off), off: int32(off)})
		case c == '(':
			p.pos++
			p.depth++
			if p.depth > maxNesting {
				p.fail(off, "parentheses nested deeper than %d", maxNesting)
			}
			p.space(true)
			id := p.newRule(name, true)
			p.rules[id].defined = true
			p.rules[id].alts = p.alternates(name, true)
			if p.peek(0) != ')' {
				p.fail(off, "unbalanced '(': expected ')', found %s", p.describe())
			}
			p.pos++
			p.depth--
			last = len(seq)
			seq = p.add(seq, item{ref: true, id: id, off: int32(off)})
		case c == '*' || c == '+' || c == '?':
			p.pos++
			lo, hi := 0, -1
			if c == '+' {
				lo = 1
			} else if c == '?' {
				hi = 1
			}
			seq = p.repeat(name, seq, last, lo, hi, off)
			last = -1
		case c == '{':
			p.pos++
			p.space(nested)
			lo := p.count()
			hi := lo
			p.space(nested)
			switch p.peek(0) {
			case '}':
			case ',':
				p.pos++
				p.space(nested)
				hi = -1
				if '0' <= p.peek(0) && p.peek(0) <= '9' {
					hi = p.count()
					p.space(nested)
				}
				if p.peek(0) != '}' {
					p.fail(p.pos, "expected '}' to close the repetition, found %s", p.describe())
				}
			default:
				p.fail(p.pos, "expected ',' or '}' in the repetition, found %s", p.describe())
			}
			p.pos++
			if hi >= 0 && hi < lo {
				p.fail(off, "repetition {%d,%d}: the maximum is below the minimum", lo, hi)
			}
			seq = p.repeat(name, seq, last, lo, hi, off)
			last = -1
		case c == ']':
			p.fail(off, "unbalanced ']'")
		case c == '}':
			p.fail(off, "unbalanced '}'")
		default:
			return seq
		}
		p.space(nested)
	}
	return seq
}

func (p *parser) count() int {
	start := p.pos
	for !p.eof() && '0' <= p.src[p.pos] && p.src[p.pos] <= '9' {
		p.pos++
		if p.pos-start > 6 {
			break
		}
	}
	if p.pos == start {
		p.fail(start, "expected a repetition count, found %s", p.describe())
	}
	n, _ := strconv.Atoi(p.src[start:p.pos])
	if n > MaxRepeat {
		p.fail(start, "repetition count %s is above the limit of %d", p.src[start:p.pos], MaxRepeat)
	}
	return n
}

// repeat applies a repetition operator to the last symbol of seq: the
// symbol min times, then either a right-recursive rule (no maximum) or a
// chain of nested optional rules (max-min of them). Right recursion in tail
// position runs in constant stack depth (see step).
func (p *parser) repeat(name string, seq []item, last, lo, hi, off int) []item {
	if last < 0 || last >= len(seq) {
		p.fail(off, "a repetition operator must follow a symbol")
	}
	sym := slices.Clone(seq[last:])
	seq = seq[:last]
	p.items -= len(sym)
	x := sym[0]
	if len(sym) > 1 {
		id := p.newRule(name, true)
		p.rules[id].defined = true
		p.rules[id].alts = [][]item{sym}
		p.items += len(sym)
		x = item{ref: true, id: id, off: int32(off)}
	}
	for range lo {
		seq = p.add(seq, x)
	}
	if hi < 0 {
		id := p.newRule(name, true)
		r := p.rules[id]
		r.defined = true
		r.alts = [][]item{{x, {ref: true, id: id, off: int32(off)}}, nil}
		p.items += 2
		return p.add(seq, item{ref: true, id: id, off: int32(off)})
	}
	prev := int32(-1)
	for range hi - lo {
		id := p.newRule(name, true)
		r := p.rules[id]
		r.defined = true
		alt := []item{x}
		if prev >= 0 {
			alt = append(alt, item{ref: true, id: prev, off: int32(off)})
		}
		r.alts = [][]item{alt, nil}
		p.items += len(alt)
		if p.items > MaxElements {
			p.fail(off, "the grammar has more than %d elements", MaxElements)
		}
		prev = id
	}
	if prev >= 0 {
		seq = p.add(seq, item{ref: true, id: prev, off: int32(off)})
	}
	return seq
}

// char reads one character of a literal or class: an escape or one UTF-8
// encoded code point.
func (p *parser) char() rune {
	off := p.pos
	c := p.src[p.pos]
	if c != '\\' {
		r, n := utf8.DecodeRuneInString(p.src[p.pos:])
		if r == utf8.RuneError && n <= 1 {
			p.fail(off, "invalid UTF-8 in the grammar")
		}
		p.pos += n
		return r
	}
	if p.pos+1 >= len(p.src) {
		p.fail(off, "unterminated escape")
	}
	e := p.src[p.pos+1]
	p.pos += 2
	switch e {
	case 'n':
		return '\n'
	case 't':
		return '\t'
	case 'r':
		return '\r'
	case '\\', '"', '[', ']', '-', '^':
		return rune(e)
	case 'x':
		return p.hex(off, 2)
	case 'u':
		return p.hex(off, 4)
	case 'U':
		return p.hex(off, 8)
	}
	p.pos = off
	p.fail(off, "unknown escape \\%c", e)
	return 0
}

func (p *parser) hex(off, n int) rune {
	if p.pos+n > len(p.src) {
		p.fail(off, "escape %s needs %d hex digits", p.src[off:min(off+2, len(p.src))], n)
	}
	v, err := strconv.ParseUint(p.src[p.pos:p.pos+n], 16, 32)
	if err != nil {
		p.fail(off, "escape %s needs %d hex digits", p.src[off:off+2], n)
	}
	p.pos += n
	if v > maxRune {
		p.fail(off, "escape %s is beyond Unicode (max U+10FFFF)", p.src[off:p.pos])
	}
	return rune(v)
}

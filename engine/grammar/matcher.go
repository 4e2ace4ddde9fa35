package grammar

import (
	"errors"
	"fmt"
	"slices"
)

// ErrRejected is returned by Matcher.Accept for a token the grammar does
// not allow at this point.
var ErrRejected = errors.New("token rejected by the grammar")

// partial is a UTF-8 sequence begun by the bytes so far and not yet
// complete: the bits read, how many continuation bytes are still needed,
// and the sequence's total length. The zero value is "none".
type partial struct {
	val  rune
	need uint8
	n    uint8
}

// minRune is the smallest code point each sequence length may encode
// (anything below is an overlong encoding).
var minRune = [5]rune{0, 0, 0x80, 0x800, 0x10000}

// utf8Lead starts the sequence a lead byte b (≥ 0x80) begins; ok is false
// for a byte no well-formed sequence starts with (a continuation byte, an
// overlong 0xC0/0xC1 lead, or one beyond U+10FFFF).
func utf8Lead(b byte) (p partial, ok bool) {
	switch {
	case b >= 0xC2 && b <= 0xDF:
		return partial{val: rune(b & 0x1F), need: 1, n: 2}, true
	case b&0xF0 == 0xE0:
		return partial{val: rune(b & 0x0F), need: 2, n: 3}, true
	case b >= 0xF0 && b <= 0xF4:
		return partial{val: rune(b & 0x07), need: 3, n: 4}, true
	}
	return partial{}, false
}

// completions is the range of code points the unfinished sequence p may
// still become (lo > hi when none: the prefix only starts overlong forms
// or ones beyond U+10FFFF).
func (p partial) completions() (lo, hi rune) {
	shift := 6 * uint(p.need)
	return max(p.val<<shift, minRune[p.n]), min(p.val<<shift|(1<<shift-1), maxRune)
}

// stepByte advances (s, p) over one byte of output; ok is false when the
// byte cannot follow: invalid UTF-8, or no character the grammar allows
// here can be encoded starting with the bytes so far.
func (g *Grammar) stepByte(s *dstate, p partial, b byte) (*dstate, partial, bool) {
	if p.need == 0 {
		if b < 0x80 {
			t := g.next(s, int(g.asciiClass[b]))
			return t, partial{}, t != nil
		}
		var ok bool
		if p, ok = utf8Lead(b); !ok {
			return nil, partial{}, false
		}
	} else {
		if b&0xC0 != 0x80 {
			return nil, partial{}, false
		}
		p.val = p.val<<6 | rune(b&0x3F)
		p.need--
		if p.need == 0 {
			c := p.val
			if c < minRune[p.n] || c > maxRune || 0xD800 <= c && c <= 0xDFFF {
				return nil, partial{}, false
			}
			t := g.next(s, g.classOf(c))
			return t, partial{}, t != nil
		}
	}
	lo, hi := p.completions()
	if lo > hi || isSurrogate(lo) && isSurrogate(hi) || !g.allowsRange(s, lo, hi) {
		return nil, partial{}, false
	}
	return s, p, true
}

// Matcher follows one sequence through the grammar (not safe for
// concurrent use; many Matchers of one Grammar may run in parallel).
type Matcher struct {
	g    *Grammar
	v    *Vocab
	st   *dstate
	part partial
	dfs  []frame

	visited int // trie nodes the last fill visited (for tests)
}

type frame struct {
	node int32
	st   *dstate
	part partial
	run  *selfLoops // a run known to hold from st, with n characters left
	n    uint8
}

// NewMatcher starts a sequence at the beginning of the grammar.
func (g *Grammar) NewMatcher(v *Vocab) *Matcher {
	return &Matcher{g: g, v: v, st: g.start()}
}

// walk advances the state over a token's bytes.
func (m *Matcher) walk(piece []byte) (*dstate, partial, bool) {
	s, p := m.st, m.part
	ok := true
	for _, b := range piece {
		if s, p, ok = m.g.stepByte(s, p, b); !ok {
			return nil, partial{}, false
		}
	}
	return s, p, true
}

// Allows reports whether Accept(id) would succeed. It costs a few lookups
// per byte of the token once the states it passes are known.
func (m *Matcher) Allows(id int32) bool {
	if id < 0 || int(id) >= len(m.v.pieces) {
		return false
	}
	if m.v.isEOG(id) {
		return m.Complete()
	}
	piece := m.v.pieces[id]
	if len(piece) == 0 {
		return false
	}
	_, _, ok := m.walk(piece)
	return ok
}

// Accept advances over token id; it wraps ErrRejected when the grammar
// does not allow it, and then the matcher is unchanged. An
// end-of-generation id is accepted where the text is complete and leaves
// the state as it is.
func (m *Matcher) Accept(id int32) error {
	if id < 0 || int(id) >= len(m.v.pieces) {
		return fmt.Errorf("grammar: token %d is outside the vocabulary of %d: %w", id, len(m.v.pieces), ErrRejected)
	}
	if m.v.isEOG(id) {
		if !m.Complete() {
			return fmt.Errorf("grammar: end of generation (token %d) before the text is complete: %w", id, ErrRejected)
		}
		return nil
	}
	piece := m.v.pieces[id]
	if len(piece) == 0 {
		return fmt.Errorf("grammar: token %d has no text: %w", id, ErrRejected)
	}
	s, p, ok := m.walk(piece)
	if !ok {
		return fmt.Errorf("grammar: token %d (%q): %w", id, piece, ErrRejected)
	}
	m.st, m.part = s, p
	return nil
}

// AcceptBytes advances over raw output text (not a token), e.g. a forced
// prefix; it wraps ErrRejected and leaves the matcher unchanged when the
// grammar does not allow it.
func (m *Matcher) AcceptBytes(text []byte) error {
	s, p, ok := m.walk(text)
	if !ok {
		return fmt.Errorf("grammar: text %q: %w", text, ErrRejected)
	}
	m.st, m.part = s, p
	return nil
}

// Complete reports whether the text so far is a whole sentence of the
// grammar (the end-of-generation ids are allowed).
func (m *Matcher) Complete() bool { return m.part.need == 0 && m.st.accept }

// Finished reports whether the text is a whole sentence and nothing can
// follow it: only the end-of-generation ids are allowed.
func (m *Matcher) Finished() bool { return m.Complete() && len(m.st.stacks) == 0 }

// FillMask sets bit id of mask (mask[id/64] bit id%64) exactly for the
// tokens Allows accepts, and clears the others; len(mask) should be
// (v.Size()+63)/64 (ids beyond a shorter mask are left out). Masks are
// cached per state of the Grammar and vocabulary: at a character boundary
// a state seen before costs one copy. Inside a multi-byte character (a
// token left it unfinished) the mask is computed each time, into mask.
func (m *Matcher) FillMask(mask []uint64) {
	words := (len(m.v.pieces) + 63) / 64
	if m.part.need == 0 {
		if bits := m.st.mask(m.v); bits != nil {
			n := copy(mask, bits)
			clear(mask[n:])
			return
		}
	}
	if len(mask) < words {
		// Too short to fill in place (ids beyond it are left out).
		bits := make([]uint64, words)
		m.fill(bits)
		if m.part.need == 0 {
			m.g.storeMask(m.st, m.v, bits)
		}
		copy(mask, bits)
		return
	}
	clear(mask)
	m.fill(mask[:words])
	if m.part.need == 0 {
		m.g.storeMask(m.st, m.v, slices.Clone(mask[:words]))
	}
}

// fill computes the mask: one walk of the trie from the current state,
// following only bytes the grammar allows, so a subtree the grammar rules
// out is never visited.
func (m *Matcher) fill(bits []uint64) {
	v, g := m.v, m.g
	if m.Complete() {
		copy(bits, v.eog)
	}
	// The shortcut needs the trie's own UTF-8 bookkeeping (decoded from
	// the root) to match the walk's, true when the walk starts at a
	// character boundary; then a node inside a character qualifies too:
	// its state is the one before the character.
	shortcut := m.part.need == 0
	stack := append(m.dfs[:0], frame{node: 0, st: m.st, part: m.part})
	visited := 0
	for len(stack) > 0 {
		f := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		visited++
		run, n := f.run, f.n
		if run == nil && shortcut {
			// Working out a state's run costs a transition per class:
			// worth it for a big subtree (at the root, always), not to
			// save walking a small one.
			if run = f.st.loops.Load(); run == nil && v.end[f.node]-f.node >= 1024 {
				run = g.selfLoops(f.st)
			}
			if run != nil {
				n = run.n
			}
		}
		if run != nil && v.clean[f.node] && v.chars[f.node] <= n &&
			v.subASCII[f.node][0]&^run.ascii[0] == 0 && v.subASCII[f.node][1]&^run.ascii[1] == 0 &&
			(run.high || !v.subHigh[f.node]) {
			// Every string below is in the run: the whole subtree is allowed.
			for _, id := range v.toks[v.tokFirst[f.node]:v.tokFirst[v.end[f.node]]] {
				bits[id>>6] |= 1 << (id & 63)
			}
			continue
		}
		for _, id := range v.toks[v.tokFirst[f.node]:v.tokFirst[f.node+1]] {
			bits[id>>6] |= 1 << (id & 63)
		}
		for e := v.first[f.node]; e < v.first[f.node+1]; e++ {
			b := v.label[e]
			var s *dstate
			p := partial{}
			if b < 0x80 && f.part.need == 0 {
				s = g.next(f.st, int(g.asciiClass[b]))
			} else {
				var ok bool
				if s, p, ok = g.stepByte(f.st, f.part, b); !ok {
					s = nil
				}
			}
			if s == nil {
				continue
			}
			// The child inherits the run: inside a character the state
			// has not moved; a character of the run's set uses one up.
			c := frame{node: v.child[e], st: s, part: p}
			switch {
			case run == nil:
			case p.need > 0:
				c.run, c.n = run, n
			case n > 0 && (b < 0x80 && run.ascii[b>>6]>>(b&63)&1 != 0 || b >= 0x80 && run.high):
				c.run, c.n = run, n
				if n != runForever {
					c.n--
				}
			}
			stack = append(stack, c)
		}
	}
	m.visited = visited
	// Keep the buffer, not the states it pointed to.
	clear(stack[:cap(stack)])
	m.dfs = stack[:0]
}

// MatchString reports whether text is a whole sentence of the grammar.
func (g *Grammar) MatchString(text string) bool {
	s, p := g.start(), partial{}
	ok := true
	for i := 0; i < len(text); i++ {
		if s, p, ok = g.stepByte(s, p, text[i]); !ok {
			return false
		}
	}
	return p.need == 0 && s.accept
}

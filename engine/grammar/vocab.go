package grammar

import (
	"bytes"
	"slices"
)

// Vocab is a model's tokens as the bytes each appends to the output text,
// with a token trie; built once per model and shared (safe for concurrent use).
// pieces[i] == nil: token i can never be produced under a grammar (control
// tokens), except the end-of-generation ids eog, allowed exactly where a
// sentence of the grammar is complete.
type Vocab struct {
	pieces [][]byte // views into one buffer
	eog    []uint64 // bitset of the end-of-generation ids

	// The trie, nodes numbered in pre-order from the root 0, so node i's
	// subtree is the nodes [i, end[i]) and its tokens are
	// toks[tokFirst[i]:tokFirst[end[i]]]. Node i's edges are
	// label/child[first[i]:first[i+1]] (sorted by byte), and the tokens
	// whose piece ends at node i are toks[tokFirst[i]:tokFirst[i+1]].
	// Tokens with nil or empty pieces and end-of-generation ids are not in
	// the trie.
	first    []int32
	label    []byte
	child    []int32
	tokFirst []int32
	toks     []int32
	end      []int32

	// Per node, what the bytes below it are, for FillMask's shortcut (a
	// subtree whose every byte keeps the automaton in its state is allowed
	// whole): the ASCII bytes on edges below the node, whether any byte
	// below is >= 0x80, and whether every path to and below it is
	// well-formed UTF-8 (a sequence left unfinished at a token's end counts
	// as well-formed), decoding from the root.
	subASCII [][2]uint64
	subHigh  []bool
	clean    []bool
	// chars[i] is the most characters a token below node i still needs
	// from the state at node i (a character node i is inside counts, and
	// so does one a token leaves unfinished); at most runForever.
	chars []uint8
}

// NewVocab builds the vocabulary and its trie. It copies pieces. Ids in
// eog outside [0, len(pieces)) are ignored.
func NewVocab(pieces [][]byte, eog []int32) *Vocab {
	v := &Vocab{pieces: make([][]byte, len(pieces)), eog: make([]uint64, (len(pieces)+63)/64)}
	total := 0
	for _, p := range pieces {
		total += len(p)
	}
	buf := make([]byte, 0, total)
	for i, p := range pieces {
		if p != nil {
			start := len(buf)
			buf = append(buf, p...)
			v.pieces[i] = buf[start:len(buf):len(buf)]
		}
	}
	for _, id := range eog {
		if id >= 0 && int(id) < len(pieces) {
			v.eog[id>>6] |= 1 << (id & 63)
		}
	}
	var ids []int32
	for i, p := range v.pieces {
		if len(p) > 0 && !v.isEOG(int32(i)) {
			ids = append(ids, int32(i))
		}
	}
	slices.SortStableFunc(ids, func(a, b int32) int { return bytes.Compare(v.pieces[a], v.pieces[b]) })

	v.build(ids)
	return v
}

// Size is the number of token ids.
func (v *Vocab) Size() int { return len(v.pieces) }

func (v *Vocab) isEOG(id int32) bool {
	return id >= 0 && int(id) < len(v.pieces) && v.eog[id>>6]>>(id&63)&1 != 0
}

// build lays out the trie of the sorted ids in pre-order.
func (v *Vocab) build(ids []int32) {
	var ok []bool     // the path to the node is well-formed UTF-8 so far
	var inside []bool // the node is inside a character
	newNode := func(good, mid bool) int32 {
		v.first = append(v.first, int32(len(v.label)))
		v.tokFirst = append(v.tokFirst, int32(len(v.toks)))
		v.end = append(v.end, 0)
		ok = append(ok, good)
		inside = append(inside, mid)
		return int32(len(v.end) - 1)
	}
	type group struct {
		lo, hi int
		b      byte
	}
	var walk func(lo, hi, depth int, node int32, part partial)
	walk = func(lo, hi, depth int, node int32, part partial) {
		i := lo
		for i < hi && len(v.pieces[ids[i]]) == depth {
			if depth > 0 {
				v.toks = append(v.toks, ids[i])
			}
			i++
		}
		var groups []group
		for i < hi {
			b := v.pieces[ids[i]][depth]
			j := i + 1
			for j < hi && v.pieces[ids[j]][depth] == b {
				j++
			}
			groups = append(groups, group{i, j, b})
			i = j
		}
		// Reserve this node's edges before any child is numbered, so
		// first[] stays in node order.
		e0 := len(v.label)
		for _, gr := range groups {
			v.label = append(v.label, gr.b)
			v.child = append(v.child, 0)
		}
		for k, gr := range groups {
			p, good := utf8Next(part, gr.b)
			good = good && ok[node]
			c := newNode(good, p.need > 0)
			v.child[e0+k] = c
			walk(gr.lo, gr.hi, depth+1, c, p)
		}
		v.end[node] = int32(len(v.end))
	}
	walk(0, len(ids), 0, newNode(true, false), partial{})
	v.first = append(v.first, int32(len(v.label)))
	v.tokFirst = append(v.tokFirst, int32(len(v.toks)))

	// Summaries bottom-up: children are numbered after their parents.
	n := len(v.end)
	v.subASCII = make([][2]uint64, n)
	v.subHigh = make([]bool, n)
	v.clean = make([]bool, n)
	v.chars = make([]uint8, n)
	allOK := ok
	for x := n - 1; x >= 0; x-- {
		m := 0
		if inside[x] {
			m = 1
		}
		for e := v.first[x]; e < v.first[x+1]; e++ {
			c, b := v.child[e], v.label[e]
			// A child that ends a character (or is one) adds it; one
			// inside a character counts it already.
			mc := int(v.chars[c])
			if !inside[c] {
				mc++
			}
			m = max(m, mc)
			if b < 0x80 {
				v.subASCII[x][b>>6] |= 1 << (b & 63)
			} else {
				v.subHigh[x] = true
			}
			v.subASCII[x][0] |= v.subASCII[c][0]
			v.subASCII[x][1] |= v.subASCII[c][1]
			v.subHigh[x] = v.subHigh[x] || v.subHigh[c]
			allOK[x] = allOK[x] && allOK[c]
		}
		v.clean[x] = allOK[x]
		v.chars[x] = uint8(min(m, runForever))
	}
}

// utf8Next decodes one more byte of output after the unfinished sequence
// p, as stepByte does with a grammar that allows every character: ok is
// false for ill-formed UTF-8 (a stray continuation byte, an invalid lead
// byte, an overlong form, a surrogate, beyond U+10FFFF, or a prefix no
// code point completes).
func utf8Next(p partial, b byte) (partial, bool) {
	if p.need == 0 {
		if b < 0x80 {
			return partial{}, true
		}
		var ok bool
		if p, ok = utf8Lead(b); !ok {
			return partial{}, false
		}
	} else {
		if b&0xC0 != 0x80 {
			return partial{}, false
		}
		p.val = p.val<<6 | rune(b&0x3F)
		p.need--
		if p.need == 0 {
			c := p.val
			return partial{}, c >= minRune[p.n] && c <= maxRune && !(0xD800 <= c && c <= 0xDFFF)
		}
	}
	lo, hi := p.completions()
	return p, lo <= hi && !(isSurrogate(lo) && isSurrogate(hi))
}

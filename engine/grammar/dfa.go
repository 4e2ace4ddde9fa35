package grammar

import (
	"cmp"
	"encoding/binary"
	"math/bits"
	"slices"
	"sync/atomic"
	"unsafe"
)

// DefaultCacheBytes bounds the memory one Grammar's automaton cache
// (stack nodes, states, transitions and token masks) may hold before it
// starts a new generation: about 2000 masks of a 32000-token vocabulary,
// far more states than one schema's generations visit.
const DefaultCacheBytes = 8 << 20

// SetCacheLimit changes the bound on the Grammar's cache (bytes; values
// below 64 KiB are raised to it). Safe to call at any time.
func (g *Grammar) SetCacheLimit(bytes int64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.cacheLimit = max(bytes, 64<<10)
}

// Bounds on one parse state; paths beyond them are dropped (the text that
// remains allowed is still in the grammar's language). Which paths are
// kept depends only on the grammar and the text: a state's stacks are in
// a structural order (cmpStack), not the order nodes were interned in, so
// every worker keeps the same ones whatever its cache saw before.
const (
	maxDepth  = 4096 // return addresses on one stack: nesting depth
	maxStacks = 4096 // stacks in one state: ambiguity
	// maxClosureWork bounds the (position, return stack) pairs one
	// closure (the start state, or one transition) visits, and so the
	// nodes it interns: without it a grammar whose rules fork into two
	// ways of reaching the same text at every level costs twice as much
	// per level, however few stacks the state keeps. Parse refuses a
	// grammar whose start state exceeds it; a character whose transition
	// exceeds it is refused, as if the grammar did not allow it (a dead
	// end: the sampler reports that no token is allowed).
	maxClosureWork = 1 << 16
)

// snode is one entry of a persistent stack: a position in Grammar.elems
// (for the top, a kChars element; below it, return addresses) and the rest
// of the stack. Nodes are interned per generation, so equal stacks are one
// pointer and a state's key is its stack pointers' ids.
type snode struct {
	pos    int32
	depth  int32
	parent *snode
	id     uint64
	h      uint64 // structural hash of (pos, parent's h): the same on every worker
}

// cmpStack orders stacks by their structure alone (hash, then positions
// from the top down), never by interning ids, which depend on the order a
// cache built its states in.
func cmpStack(a, b *snode) int {
	for a != b {
		switch {
		case a == nil:
			return -1
		case b == nil:
			return 1
		case a.h != b.h:
			return cmp.Compare(a.h, b.h)
		case a.pos != b.pos:
			return cmp.Compare(a.pos, b.pos)
		}
		a, b = a.parent, b.parent
	}
	return 0
}

type nodeKey struct {
	pos    int32
	parent *snode
}

// dstate is a state of the lazily built automaton: a canonical set of
// stacks (every top a kChars element) and whether the text so far is a
// whole sentence. Its transitions, one per code-point class, are filled on
// first use; nil means not yet computed. A state never changes once
// published except for trans and masks, which are atomic.
type dstate struct {
	stacks []*snode // sorted by id
	accept bool
	epoch  uint64
	trans  []atomic.Pointer[dstate]
	masks  atomic.Pointer[maskEntry]
	loops  atomic.Pointer[selfLoops]
}

// selfLoops describes a run of characters from a state that is always
// allowed: every string of at most n characters from the set (the ASCII
// bytes in ascii, and every code point from U+0080 up when high) is
// allowed from the state; n = runForever for any length. FillMask allows
// a trie subtree whole when all its bytes are in the set and its longest
// token is at most n characters. Inside a JSON string the set is the
// characters that keep the state where it is (n unbounded); in a
// counted repetition such as [a-z]{0,40} it is the characters that move
// one step on, and n what is left of the count.
type selfLoops struct {
	ascii [2]uint64
	high  bool
	n     uint8
}

// runForever is selfLoops.n for runs of any length; runs are followed at
// most this many characters (more than any token holds).
const runForever = 255

// maxRunStates bounds the states one level of the run search may hold.
const maxRunStates = 16

// wide reports whether s is worth computing selfLoops for: some stack
// takes many characters next (inside a string, free text).
func (g *Grammar) wide(s *dstate) bool {
	for _, n := range s.stacks {
		cs := &g.sets[g.elems[n.pos].arg]
		if bits.OnesCount64(cs.ascii[0])+bits.OnesCount64(cs.ascii[1]) >= 16 {
			return true
		}
	}
	return false
}

// selfLoops computes (once) the allowed run from s; an empty one for a
// state that is not wide. The set is the characters that lead from s to
// the state most ASCII characters lead to (surrogates aside: UTF-8 text
// never holds them); n is how many levels of the states the set reaches
// stay alive for every character of the set, searched breadth first: a
// level that brings no new state closes the search with n unbounded.
func (g *Grammar) selfLoops(s *dstate) *selfLoops {
	if l := s.loops.Load(); l != nil {
		return l
	}
	l := &selfLoops{}
	if g.wide(s) {
		l = g.run(s)
	}
	s.loops.Store(l)
	return l
}

func (g *Grammar) run(s *dstate) *selfLoops {
	l := &selfLoops{}
	count := map[*dstate]int{}
	var tgt *dstate
	for c := range rune(128) {
		if t := g.next(s, int(g.asciiClass[c])); t != nil {
			count[t]++
			if tgt == nil || count[t] > count[tgt] {
				tgt = t
			}
		}
	}
	if tgt == nil {
		return l
	}
	var classes []int // the classes of the set, each once
	seenCls := map[int]bool{}
	for c := range rune(128) {
		cls := int(g.asciiClass[c])
		if g.next(s, cls) == tgt {
			l.ascii[c>>6] |= 1 << (c & 63)
			if !seenCls[cls] {
				seenCls[cls] = true
				classes = append(classes, cls)
			}
		}
	}
	l.high = true
	var high []int
	for k, c := range g.cuts {
		if c >= 0x80 && !isSurrogate(c) {
			if g.next(s, k) != tgt {
				l.high = false
				break
			}
			high = append(high, k)
		}
	}
	if l.high {
		classes = append(classes, high...)
	}
	l.n = 1
	level := []*dstate{tgt}
	seen := map[*dstate]bool{tgt: true}
	// A bounded run stops one short of runForever (which means any
	// length): a count of 255 levels or more is kept as 254.
	for l.n < runForever-1 {
		var next []*dstate
		for _, t := range level {
			for _, cls := range classes {
				u := g.next(t, cls)
				if u == nil {
					return l
				}
				if !seen[u] {
					seen[u] = true
					next = append(next, u)
				}
			}
		}
		l.n++
		if len(next) == 0 {
			l.n = runForever
			return l
		}
		if len(next) > maxRunStates {
			return l
		}
		level = next
	}
	return l
}

// maskEntry is a cached token mask of a state for one vocabulary.
type maskEntry struct {
	v    *Vocab
	bits []uint64
	next *maskEntry
}

// dfa holds the intern tables of the current generation. Guarded by
// Grammar.mu.
type dfa struct {
	nodes   map[nodeKey]*snode
	states  map[string]*dstate
	init    *dstate // the start state of the current generation
	nextID  uint64
	bytes   int64
	epoch   uint64
	resets  int64
	keybuf  []byte
	scratch closure
}

func (g *Grammar) lockedInit() {
	if g.dfa.nodes != nil {
		return
	}
	g.dfa.nodes = map[nodeKey]*snode{}
	g.dfa.states = map[string]*dstate{}
	g.dfa.init = nil
}

// locked prepares the tables for use under g.mu, starting a new generation
// when the last operations filled the cache beyond its limit.
func (g *Grammar) locked() {
	if g.dfa.bytes > g.cacheLimit {
		g.reset()
	}
	g.lockedInit()
}

// reset starts a new generation: the tables are dropped, and states of
// older generations stop being extended (see step), so they are freed once
// no Matcher holds them.
func (g *Grammar) reset() {
	g.dfa.nodes = nil
	g.dfa.states = nil
	g.dfa.bytes = 0
	g.dfa.epoch++
	g.dfa.resets++
	g.lockedInit()
}

// account adds to the cache's size; the reset it may call for happens at
// the next locked operation, never in the middle of one.
func (g *Grammar) account(n int64) { g.dfa.bytes += n }

// start returns the start state (the current generation's).
func (g *Grammar) start() *dstate {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.locked()
	if g.dfa.init == nil {
		g.dfa.init, _ = g.startClosure()
	}
	return g.dfa.init
}

// startClosure computes the start state under g.mu; over is the position
// of the reference being expanded when the closure ran past
// maxClosureWork, -1 when it did not.
func (g *Grammar) startClosure() (s *dstate, over int32) {
	c := &g.dfa.scratch
	c.init(g)
	for _, a := range g.alts[g.root] {
		c.expand(a, nil)
	}
	over = -1
	if c.spent > maxClosureWork {
		over = c.lastRef
	}
	return c.state(), over
}

func (g *Grammar) node(pos int32, parent *snode) *snode {
	k := nodeKey{pos, parent}
	if n, ok := g.dfa.nodes[k]; ok {
		return n
	}
	g.dfa.nextID++
	n := &snode{pos: pos, parent: parent, id: g.dfa.nextID}
	h := uint64(pos) + 1
	if parent != nil {
		n.depth = parent.depth + 1
		h ^= parent.h * 0x9E3779B97F4A7C15
	}
	// splitmix64's finalizer
	h = (h ^ h>>30) * 0xBF58476D1CE4E5B9
	h = (h ^ h>>27) * 0x94D049BB133111EB
	n.h = h ^ h>>31
	g.dfa.nodes[k] = n
	g.account(int64(unsafe.Sizeof(*n)) + 48)
	return n
}

// closure collects the stacks that expanding positions yields. One is
// kept in the dfa and reused under Grammar.mu.
type closure struct {
	g      *Grammar
	seen   keySet
	stacks []*snode
	accept bool
	work   []nodeKey
	// spent counts the pairs visited, against maxClosureWork; lastRef is
	// the reference expanded last (for Parse's message).
	spent   int
	lastRef int32
}

// init readies c for a new set, keeping its buffers.
func (c *closure) init(g *Grammar) {
	c.g = g
	c.seen.reset()
	clear(c.stacks)
	c.stacks = c.stacks[:0]
	c.accept = false
	c.spent = 0
	c.lastRef = -1
}

// keySet is a set of (position, parent) pairs packed in a uint64 (the
// parent's id above the position's 24 bits; ids start at 1, nil is 0):
// open addressing, cleared by undoing only the slots used, so a closure
// costs what it touches even after a large one grew the table.
type keySet struct {
	slots []uint64 // key+1; 0 is empty
	used  []uint32
}

// Positions stay below 1<<24: at most MaxElements symbols, one end per
// alternative (fewer than MaxSourceBytes written, two per synthesized
// rule).
func packKey(k nodeKey) uint64 {
	var id uint64
	if k.parent != nil {
		id = k.parent.id
	}
	return id<<24 | uint64(k.pos)
}

func (s *keySet) reset() {
	if len(s.slots) > 1<<16 && len(s.used) < len(s.slots)/64 {
		s.slots, s.used = nil, s.used[:0] // give back a table a hostile closure grew
		return
	}
	for _, i := range s.used {
		s.slots[i] = 0
	}
	s.used = s.used[:0]
}

// add inserts k and reports whether it was absent.
func (s *keySet) add(k uint64) bool {
	if 2*(len(s.used)+1) > len(s.slots) {
		old := s.slots
		s.slots = make([]uint64, max(64, 2*len(old)))
		s.used = s.used[:0]
		for _, v := range old {
			if v != 0 {
				s.add(v - 1)
			}
		}
	}
	mask := uint64(len(s.slots) - 1)
	for i := (k * 0x9E3779B97F4A7C15) >> 20 & mask; ; i = (i + 1) & mask {
		switch s.slots[i] {
		case 0:
			s.slots[i] = k + 1
			s.used = append(s.used, uint32(i))
			return true
		case k + 1:
			return false
		}
	}
}

// expand adds every stack that results from being at pos with the return
// stack parent: rule references are expanded into their alternatives, ends
// of alternatives return to the parent, until a character set is on top.
// A reference in tail position pushes no return address, so right
// recursion (repetition) keeps the stack depth constant. The work list
// (not recursion) keeps a long chain of optional symbols off the
// goroutine stack; the order does not matter, the result is a set.
func (c *closure) expand(pos int32, parent *snode) {
	g := c.g
	work := append(c.work[:0], nodeKey{pos, parent})
	for len(work) > 0 {
		k := work[len(work)-1]
		work = work[:len(work)-1]
		if !c.seen.add(packKey(k)) {
			continue
		}
		if c.spent++; c.spent > maxClosureWork {
			// Out of budget: the rest is dropped (spent stays above the
			// bound, so later expands of this closure stop at once).
			break
		}
		switch e := g.elems[k.pos]; e.kind {
		case kEnd:
			if k.parent == nil {
				c.accept = true
				continue
			}
			work = append(work, nodeKey{k.parent.pos, k.parent.parent})
		case kChars:
			if len(c.stacks) >= maxStacks {
				continue
			}
			// Each (pos, parent) is seen once and nodes are interned, so
			// no stack is added twice.
			c.stacks = append(c.stacks, g.node(k.pos, k.parent))
		case kRef:
			c.lastRef = k.pos
			ret := k.parent
			if g.elems[k.pos+1].kind != kEnd {
				if k.parent != nil && k.parent.depth+1 >= maxDepth {
					continue
				}
				ret = g.node(k.pos+1, k.parent)
			}
			for _, a := range g.alts[e.arg] {
				work = append(work, nodeKey{a, ret})
			}
		}
	}
	clear(work)
	c.work = work[:0]
}

// state interns the collected set; g.dead when it is empty.
func (c *closure) state() *dstate {
	g := c.g
	if len(c.stacks) == 0 && !c.accept {
		return g.dead
	}
	slices.SortFunc(c.stacks, cmpStack)
	key := g.dfa.keybuf[:0]
	if c.accept {
		key = append(key, 1)
	} else {
		key = append(key, 0)
	}
	for _, n := range c.stacks {
		key = binary.AppendUvarint(key, n.id)
	}
	g.dfa.keybuf = key
	if s, ok := g.dfa.states[string(key)]; ok {
		return s
	}
	s := &dstate{
		stacks: slices.Clone(c.stacks),
		accept: c.accept,
		epoch:  g.dfa.epoch,
		trans:  make([]atomic.Pointer[dstate], len(g.cuts)),
	}
	g.dfa.states[string(key)] = s
	g.account(int64(len(key)) + 8*int64(len(s.stacks)) + 8*int64(len(s.trans)) + 160)
	return s
}

// next returns the state after a code point of class cls from s; nil
// when no such code point can follow.
func (g *Grammar) next(s *dstate, cls int) *dstate {
	if len(s.stacks) == 0 {
		return nil // accept-only: nothing follows
	}
	if t := s.trans[cls].Load(); t != nil {
		if t == g.dead {
			return nil
		}
		return t
	}
	return g.nextSlow(s, cls)
}

func (g *Grammar) nextSlow(s *dstate, cls int) *dstate {
	if len(s.stacks) == 0 {
		return nil // accept-only: nothing follows
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.locked()
	if t := s.trans[cls].Load(); t != nil {
		if t == g.dead {
			return nil
		}
		return t
	}
	rep := g.cuts[cls]
	cl := &g.dfa.scratch
	cl.init(g)
	epoch := g.dfa.epoch
	for _, n := range s.stacks {
		if g.sets[g.elems[n.pos].arg].has(rep) {
			cl.expand(n.pos+1, n.parent)
		}
	}
	t := cl.state()
	if cl.spent > maxClosureWork {
		// Too ambiguous to follow: the character is refused (cached like
		// any dead end), the same on every worker, rather than keeping
		// an arbitrary part of the paths.
		t = g.dead
	}
	// States of an older generation are not extended: the new state
	// belongs to the current one, and the old graph can be freed.
	if s.epoch == epoch && g.dfa.epoch == epoch {
		s.trans[cls].Store(t)
	}
	if t == g.dead {
		return nil
	}
	return t
}

// allowsRange reports whether some stack of s can take a code point in
// [lo, hi]: used to keep a token that ends inside a UTF-8 sequence.
func (g *Grammar) allowsRange(s *dstate, lo, hi rune) bool {
	for _, n := range s.stacks {
		if g.sets[g.elems[n.pos].arg].overlaps(lo, hi) {
			return true
		}
	}
	return false
}

// mask returns the cached mask of s for v, or nil.
func (s *dstate) mask(v *Vocab) []uint64 {
	for e := s.masks.Load(); e != nil; e = e.next {
		if e.v == v {
			return e.bits
		}
	}
	return nil
}

// storeMask caches a mask of s for v when s is of the current generation.
func (g *Grammar) storeMask(s *dstate, v *Vocab, bits []uint64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.locked()
	if s.epoch != g.dfa.epoch || s.mask(v) != nil {
		return
	}
	s.masks.Store(&maskEntry{v: v, bits: bits, next: s.masks.Load()})
	g.account(8*int64(len(bits)) + 64)
}

// CacheStats reports the automaton cache's size: states and stack nodes of
// the current generation, bytes accounted, and how many times the cache was
// cleared for being full.
func (g *Grammar) CacheStats() (states, nodes int, bytes, resets int64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.dfa.states), len(g.dfa.nodes), g.dfa.bytes, g.dfa.resets
}

func isSurrogate(c rune) bool { return 0xD800 <= c && c <= 0xDFFF }

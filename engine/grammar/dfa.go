package grammar

import (
	"encoding/binary"
	"slices"
	"sync/atomic"
	"unsafe"
)

// DefaultCacheBytes bounds the memory one Grammar's automaton cache
// (stack nodes, states, transitions and token masks) may hold before it
// starts a new generation.
const DefaultCacheBytes = 32 << 20

// Bounds on one parse state; paths beyond them are dropped (the text that
// remains allowed is still in the grammar's language).
const (
	maxDepth  = 4096 // return addresses on one stack: nesting depth
	maxStacks = 4096 // stacks in one state: ambiguity
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
	nodes  map[nodeKey]*snode
	states map[string]*dstate
	init   *dstate // the start state of the current generation
	nextID uint64
	bytes  int64
	epoch  uint64
	resets int64
	keybuf []byte
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
		var c closure
		c.init(g)
		for _, a := range g.alts[g.root] {
			c.expand(a, nil)
		}
		g.dfa.init = c.state()
	}
	return g.dfa.init
}

func (g *Grammar) node(pos int32, parent *snode) *snode {
	k := nodeKey{pos, parent}
	if n, ok := g.dfa.nodes[k]; ok {
		return n
	}
	g.dfa.nextID++
	n := &snode{pos: pos, parent: parent, id: g.dfa.nextID}
	if parent != nil {
		n.depth = parent.depth + 1
	}
	g.dfa.nodes[k] = n
	g.account(int64(unsafe.Sizeof(*n)) + 48)
	return n
}

// closure collects the stacks that expanding positions yields.
type closure struct {
	g       *Grammar
	seen    map[nodeKey]bool
	stacks  []*snode
	present map[*snode]bool
	accept  bool
}

func (c *closure) init(g *Grammar) {
	c.g = g
	c.seen = map[nodeKey]bool{}
	c.present = map[*snode]bool{}
}

// expand adds every stack that results from being at pos with the return
// stack parent: rule references are expanded into their alternatives, ends
// of alternatives return to the parent, until a character set is on top.
// A reference in tail position pushes no return address, so right
// recursion (repetition) keeps the stack depth constant.
func (c *closure) expand(pos int32, parent *snode) {
	k := nodeKey{pos, parent}
	if c.seen[k] {
		return
	}
	c.seen[k] = true
	g := c.g
	switch e := g.elems[pos]; e.kind {
	case kEnd:
		if parent == nil {
			c.accept = true
			return
		}
		c.expand(parent.pos, parent.parent)
	case kChars:
		if len(c.stacks) >= maxStacks {
			return
		}
		n := g.node(pos, parent)
		if !c.present[n] {
			c.present[n] = true
			c.stacks = append(c.stacks, n)
		}
	case kRef:
		ret := parent
		if g.elems[pos+1].kind != kEnd {
			if parent != nil && parent.depth+1 >= maxDepth {
				return
			}
			ret = g.node(pos+1, parent)
		}
		for _, a := range g.alts[e.arg] {
			c.expand(a, ret)
		}
	}
}

// state interns the collected set; g.dead when it is empty.
func (c *closure) state() *dstate {
	g := c.g
	if len(c.stacks) == 0 && !c.accept {
		return g.dead
	}
	slices.SortFunc(c.stacks, func(a, b *snode) int {
		if a.id < b.id {
			return -1
		}
		if a.id > b.id {
			return 1
		}
		return 0
	})
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
	var cl closure
	cl.init(g)
	epoch := g.dfa.epoch
	for _, n := range s.stacks {
		if g.sets[g.elems[n.pos].arg].has(rep) {
			cl.expand(n.pos+1, n.parent)
		}
	}
	t := cl.state()
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

package grammar

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
)

type elemKind uint8

const (
	kEnd   elemKind = iota // end of an alternative: return to the caller
	kChars                 // one code point from sets[arg]
	kRef                   // the rule arg
)

type elem struct {
	kind elemKind
	arg  int32
}

// Grammar is a compiled GBNF grammar. It is immutable except for its
// automaton cache (states, transitions and masks), which is safe for
// concurrent use: share one Grammar between all sequences that use the same
// source, so they share the cache.
type Grammar struct {
	elems []elem    // every rule's alternatives, each ended by kEnd
	alts  [][]int32 // per rule: the start of each alternative in elems
	names []string  // per rule: the user rule it belongs to
	sets  []charset

	// Code-point classes: every set's boundaries cut the code points into
	// classes [cuts[k], cuts[k+1]) that every set treats alike, so the
	// automaton keeps one transition per class.
	cuts       []rune
	asciiClass [128]int32

	root int32

	dead       *dstate // the transition target meaning "cannot follow"
	cacheLimit int64
	mu         sync.Mutex // guards the automaton tables in dfa
	dfa        dfa
}

// compile turns the parse into the flat form the automaton runs on, and
// checks for left recursion.
func compile(p *parser) *Grammar {
	g := &Grammar{root: p.ids["root"], cacheLimit: DefaultCacheBytes, dead: &dstate{}}
	setIdx := map[string]int32{}
	var offs []int32
	var key strings.Builder
	g.alts = make([][]int32, len(p.rules))
	g.names = make([]string, len(p.rules))
	for id, r := range p.rules {
		g.names[id] = r.name
		for _, alt := range r.alts {
			g.alts[id] = append(g.alts[id], int32(len(g.elems)))
			for _, it := range alt {
				if it.ref {
					g.elems = append(g.elems, elem{kRef, it.id})
				} else {
					key.Reset()
					for _, r := range it.set {
						fmt.Fprintf(&key, "%x-%x,", r.Lo, r.Hi)
					}
					si, ok := setIdx[key.String()]
					if !ok {
						si = int32(len(g.sets))
						setIdx[key.String()] = si
						g.sets = append(g.sets, newCharset(it.set))
					}
					g.elems = append(g.elems, elem{kChars, si})
				}
				offs = append(offs, it.off)
			}
			g.elems = append(g.elems, elem{kEnd, 0})
			offs = append(offs, -1)
		}
	}
	g.classes()
	g.checkLeftRecursion(p, offs)
	g.checkStart(p, offs)
	return g
}

// checkStart computes the start state and refuses a grammar whose start
// alone runs past the closure budget (maxClosureWork): rules forking into
// many ways of reaching the same text. The router parses every grammar it
// forwards, so such a grammar is refused there, not on a worker.
func (g *Grammar) checkStart(p *parser, offs []int32) {
	g.mu.Lock()
	g.lockedInit()
	var over int32
	g.dfa.init, over = g.startClosure()
	g.mu.Unlock()
	if over < 0 {
		return
	}
	// The rule the reference being expanded belongs to.
	rule := 0
	for r, alts := range g.alts {
		if len(alts) > 0 && alts[0] <= over {
			rule = r
		}
	}
	p.cur = g.names[rule]
	p.fail(int(offs[over]), "the grammar is too ambiguous: from the start its rules fork into more than %d parse paths (alternatives that match the same text in different ways, nested); rewrite them so that each text matches one way",
		maxClosureWork)
}

func (g *Grammar) classes() {
	// 0x80: classes are ASCII or not; the surrogates (never text) are
	// classes of their own.
	cut := map[rune]bool{0: true, 0x80: true, 0xD800: true, 0xE000: true}
	for _, s := range g.sets {
		for _, r := range s.ranges {
			cut[r.Lo] = true
			if r.Hi < maxRune {
				cut[r.Hi+1] = true
			}
		}
	}
	for c := range cut {
		g.cuts = append(g.cuts, c)
	}
	slices.Sort(g.cuts)
	for c := range rune(128) {
		g.asciiClass[c] = int32(g.classOfSlow(c))
	}
}

func (g *Grammar) classOfSlow(c rune) int {
	return sort.Search(len(g.cuts), func(i int) bool { return g.cuts[i] > c }) - 1
}

// classOf returns the class of a code point.
func (g *Grammar) classOf(c rune) int {
	if c < 128 {
		return int(g.asciiClass[c])
	}
	return g.classOfSlow(c)
}

// checkLeftRecursion rejects the grammars whose expansion would push
// without end: a rule that reaches itself through the leftmost symbols of
// its alternatives (after symbols that can match nothing) with a return
// address pushed on the way. A cycle made only of references in tail
// position (x ::= y x | ...) pushes nothing and runs.
func (g *Grammar) checkLeftRecursion(p *parser, offs []int32) {
	n := len(g.alts)
	nullable := make([]bool, n)
	for changed := true; changed; {
		changed = false
		for r := range n {
			if nullable[r] {
				continue
			}
			for _, a := range g.alts[r] {
				ok := true
				for pos := a; g.elems[pos].kind != kEnd; pos++ {
					if e := g.elems[pos]; e.kind == kChars || !nullable[e.arg] {
						ok = false
						break
					}
				}
				if ok {
					nullable[r], changed = true, true
					break
				}
			}
		}
	}
	type edge struct {
		to   int32
		push bool
		off  int32
	}
	edges := make([][]edge, n)
	for r := range n {
		for _, a := range g.alts[r] {
			for pos := a; g.elems[pos].kind == kRef; pos++ {
				b := g.elems[pos].arg
				edges[r] = append(edges[r], edge{b, g.elems[pos+1].kind != kEnd, offs[pos]})
				if !nullable[b] {
					break
				}
			}
		}
	}
	// Tarjan's strongly connected components, iteratively.
	index := make([]int32, n)
	low := make([]int32, n)
	comp := make([]int32, n)
	onStack := make([]bool, n)
	for i := range index {
		index[i] = -1
	}
	var stack []int32
	next := int32(0)
	ncomp := int32(0)
	type frame struct {
		v int32
		e int
	}
	for s := range int32(n) {
		if index[s] >= 0 {
			continue
		}
		work := []frame{{s, 0}}
		index[s], low[s] = next, next
		next++
		stack = append(stack, s)
		onStack[s] = true
		for len(work) > 0 {
			f := &work[len(work)-1]
			v := f.v
			if f.e < len(edges[v]) {
				w := edges[v][f.e].to
				f.e++
				if index[w] < 0 {
					index[w], low[w] = next, next
					next++
					stack = append(stack, w)
					onStack[w] = true
					work = append(work, frame{w, 0})
				} else if onStack[w] {
					low[v] = min(low[v], index[w])
				}
				continue
			}
			if low[v] == index[v] {
				for {
					w := stack[len(stack)-1]
					stack = stack[:len(stack)-1]
					onStack[w] = false
					comp[w] = ncomp
					if w == v {
						break
					}
				}
				ncomp++
			}
			work = work[:len(work)-1]
			if len(work) > 0 {
				u := work[len(work)-1].v
				low[u] = min(low[u], low[v])
			}
		}
	}
	for r := range n {
		for _, e := range edges[r] {
			if e.push && comp[r] == comp[e.to] {
				name := g.names[r]
				p.cur = name
				p.fail(int(e.off), "left recursion: rule %q can reach itself before matching any character, which this engine cannot run (rewrite it with repetition, e.g. list ::= item (\",\" item)*)", name)
			}
		}
	}
}

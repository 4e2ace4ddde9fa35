package grammar

import (
	"errors"
	"fmt"
	"math/bits"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
)

// tokenID finds the id of a piece in pieces.
func tokenID(t testing.TB, pieces [][]byte, s string) int32 {
	t.Helper()
	for i, p := range pieces {
		if p != nil && string(p) == s && s != "" {
			return int32(i)
		}
	}
	t.Fatalf("no token %q", s)
	return -1
}

// acceptAll feeds tokens by text and fails on the first rejection.
func acceptAll(t *testing.T, m *Matcher, pieces [][]byte, toks ...string) {
	t.Helper()
	for _, s := range toks {
		id := tokenID(t, pieces, s)
		if !m.Allows(id) {
			t.Fatalf("token %q not allowed", s)
		}
		if err := m.Accept(id); err != nil {
			t.Fatalf("Accept(%q): %v", s, err)
		}
	}
}

// checkMask compares FillMask with Allows for every token.
func checkMask(t *testing.T, m *Matcher, v *Vocab) []uint64 {
	t.Helper()
	mask := make([]uint64, (v.Size()+63)/64)
	m.FillMask(mask)
	for id := range int32(v.Size()) {
		if got, want := mask[id>>6]>>(id&63)&1 != 0, m.Allows(id); got != want {
			t.Fatalf("token %d (%q): mask bit %v, Allows %v", id, v.pieces[id], got, want)
		}
	}
	return mask
}

func TestMatcherTokens(t *testing.T) {
	v, pieces := smallVocab()
	g := mustParse(t, jsonGrammar(t))
	m := g.NewMatcher(v)
	if m.Complete() || m.Allows(1) {
		t.Fatal("the empty text is complete under the JSON grammar")
	}
	if m.Allows(0) {
		t.Error("the empty piece is allowed")
	}
	if m.Allows(int32(len(pieces) - 1)) {
		t.Error("a control token (nil piece) is allowed")
	}
	if m.Allows(-1) || m.Allows(int32(v.Size())) {
		t.Error("an id outside the vocabulary is allowed")
	}
	acceptAll(t, m, pieces, "{\"", "a", "\":", " ", "[1", ",", " ", "12", "]}")
	if !m.Complete() || !m.Allows(1) {
		t.Fatal(`{"a": [1, 12]} is not complete`)
	}
	if m.Finished() {
		t.Error("finished although trailing whitespace may follow")
	}
	if err := m.Accept(tokenID(t, pieces, "a")); !errors.Is(err, ErrRejected) {
		t.Errorf("Accept(a) after the object: %v, want ErrRejected", err)
	}
	if err := m.Accept(1); err != nil {
		t.Errorf("Accept(eos) when complete: %v", err)
	}

	// Rejection leaves the matcher where it was.
	m = g.NewMatcher(v)
	acceptAll(t, m, pieces, "[1")
	if err := m.Accept(tokenID(t, pieces, "}")); !errors.Is(err, ErrRejected) {
		t.Fatalf("Accept(}) inside an array: %v", err)
	}
	if err := m.Accept(1); !errors.Is(err, ErrRejected) {
		t.Fatalf("Accept(eos) inside an array: %v", err)
	}
	acceptAll(t, m, pieces, "]")
	if !m.Complete() {
		t.Error("[1] is not complete")
	}
}

// TestSplitUTF8: a token that ends inside a character is allowed only
// when the character can be one the grammar allows, and the next token
// must complete it.
func TestSplitUTF8(t *testing.T) {
	v, pieces := smallVocab()
	g := mustParse(t, `root ::= ("é" | "日本" | "😀")+`)
	m := g.NewMatcher(v)
	checkMask(t, m, v)
	for _, s := range []string{"\xe6\x97", "\xf0\x9f", "\xc3"} {
		if !m.Allows(tokenID(t, pieces, s)) {
			t.Errorf("the start of a character of the grammar, %q, is not allowed", s)
		}
	}
	for _, s := range []string{"\xa9", "\x80", "\xff", "a"} {
		if m.Allows(tokenID(t, pieces, s)) {
			t.Errorf("%q allowed at the start", s)
		}
	}
	acceptAll(t, m, pieces, "\xc3")
	if m.Complete() {
		t.Error("complete in the middle of é")
	}
	mask := checkMask(t, m, v)
	n := 0
	for id := range int32(v.Size()) {
		if mask[id>>6]>>(id&63)&1 != 0 {
			n++
			if string(pieces[id]) != "\xa9" {
				t.Errorf("after \\xc3, %q allowed", pieces[id])
			}
		}
	}
	if n != 1 {
		t.Errorf("after \\xc3, %d tokens allowed, want 1 (\\xa9)", n)
	}
	acceptAll(t, m, pieces, "\xa9", "\xe6\x97", "\xa5", "本", "\xf0\x9f", "\x98\x80")
	if !m.Complete() {
		t.Error("é日本😀 is not complete")
	}
	checkMask(t, m, v)

	// 日 alone is a prefix of no character but 日本's first: \xe6\x97 then
	// \xa5 makes 日, which must be followed by 本.
	m = g.NewMatcher(v)
	acceptAll(t, m, pieces, "日")
	if m.Complete() || m.Allows(tokenID(t, pieces, "日")) || !m.Allows(tokenID(t, pieces, "本")) {
		t.Error("after 日, only 本 may follow")
	}
	// A grammar of ASCII only allows no multi-byte start at all.
	ga := mustParse(t, `root ::= [a-z]+`)
	ma := ga.NewMatcher(v)
	for _, s := range []string{"\xc3", "\xe6\x97", "é"} {
		if ma.Allows(tokenID(t, pieces, s)) {
			t.Errorf("ASCII grammar allows %q", s)
		}
	}
}

// TestRepetitionBounds: {m,n} is enforced token by token.
func TestRepetitionBounds(t *testing.T) {
	v, pieces := smallVocab()
	g := mustParse(t, `root ::= "a"{2,4}`)
	m := g.NewMatcher(v)
	a := tokenID(t, pieces, "a")
	aa := tokenID(t, pieces, "aa")
	for i := range 4 {
		if m.Complete() != (i >= 2) {
			t.Fatalf("after %d a: Complete %v", i, m.Complete())
		}
		if err := m.Accept(a); err != nil {
			t.Fatalf("a number %d: %v", i+1, err)
		}
		checkMask(t, m, v)
	}
	if !m.Finished() || m.Allows(a) || !m.Allows(1) {
		t.Error("after 4 a: not finished, or a still allowed, or eos not allowed")
	}
	m = g.NewMatcher(v)
	acceptAll(t, m, pieces, "aa", "a")
	if m.Allows(aa) || !m.Allows(a) {
		t.Error("after 3 a: aa allowed or a not")
	}
}

func TestCompleteFinished(t *testing.T) {
	v, pieces := smallVocab()
	cases := []struct {
		src      string
		toks     []string
		complete bool
		finished bool
	}{
		{`root ::= "ab"`, nil, false, false},
		{`root ::= "ab"`, []string{"a"}, false, false},
		{`root ::= "ab"`, []string{"ab"}, true, true},
		{`root ::= "a" "b"?`, []string{"a"}, true, false},
		{`root ::= "a" "b"?`, []string{"a", "b"}, true, true},
		{`root ::= "a"*`, nil, true, false},
		{`root ::= ""`, nil, true, true},
		{`root ::= "x" [^\x00-\U0010FFFF]?`, []string{"x"}, true, false},
	}
	for _, c := range cases {
		m := mustParse(t, c.src).NewMatcher(v)
		for _, s := range c.toks {
			if err := m.Accept(tokenID(t, pieces, s)); err != nil {
				t.Fatalf("%s: %v", c.src, err)
			}
		}
		if m.Complete() != c.complete || m.Finished() != c.finished {
			t.Errorf("%s after %q: Complete %v Finished %v, want %v %v", c.src, c.toks, m.Complete(), m.Finished(), c.complete, c.finished)
		}
		mask := checkMask(t, m, v)
		if m.Finished() {
			for id := range int32(v.Size()) {
				if mask[id>>6]>>(id&63)&1 != 0 && id != 1 {
					t.Errorf("%s: finished but %q allowed", c.src, pieces[id])
				}
			}
		}
		if (mask[0]>>1&1 != 0) != c.complete {
			t.Errorf("%s: eos bit %v, Complete %v", c.src, mask[0]>>1&1 != 0, c.complete)
		}
	}
}

// propertyGrammars are walked by the property tests.
func propertyGrammars(t testing.TB) map[string]string {
	return map[string]string{
		"json":    jsonGrammar(t),
		"schema":  schemaGrammar,
		"utf8":    `root ::= ("é" | "日本" | "😀" | [a-b] | " ")* "."?`,
		"parens":  `root ::= "(" root ")" root | ""`,
		"counts":  `root ::= ("a" | "ab"){1,5} "x"{0,3}`,
		"ascii":   `root ::= [a-z0-9 ,.:{}"\[\]-]* "!"?`,
		"wide":    `root ::= ([^\x00-\x1F"] | "日本")+ "."`,
		"bounded": `root ::= "\"" [^"\\\x00-\x1F]{0,6} "\"" | "<" [a-z ]{2,5} ">"`,
	}
}

// TestRandomWalks: random walks choosing among the allowed tokens always
// yield text the grammar accepts when they end, FillMask equals Allows at
// every step, and the cached mask equals a freshly computed one.
func TestRandomWalks(t *testing.T) {
	v, pieces := smallVocab()
	for name, src := range propertyGrammars(t) {
		t.Run(name, func(t *testing.T) {
			g := mustParse(t, src)
			for seed := range uint64(60) {
				rng := rand.New(rand.NewPCG(seed, 7))
				m := g.NewMatcher(v)
				var text []byte
				for step := 0; step < 40; step++ {
					mask := checkMask(t, m, v)
					fresh := make([]uint64, len(mask))
					m.clone().fill(fresh)
					for i := range mask {
						if mask[i] != fresh[i] {
							t.Fatalf("seed %d step %d: cached mask differs from a fresh one at word %d", seed, step, i)
						}
					}
					var allowed []int32
					for id := range int32(v.Size()) {
						if mask[id>>6]>>(id&63)&1 != 0 {
							allowed = append(allowed, id)
						}
					}
					if len(allowed) == 0 {
						t.Fatalf("seed %d: dead end after %q", seed, text)
					}
					id := allowed[rng.IntN(len(allowed))]
					if id == 1 {
						break
					}
					if err := m.Accept(id); err != nil {
						t.Fatalf("seed %d: Accept of an allowed token: %v", seed, err)
					}
					text = append(text, pieces[id]...)
				}
				if m.Complete() && !g.MatchString(string(text)) {
					t.Fatalf("seed %d: complete text %q is not in the grammar", seed, text)
				}
				if !m.Complete() && g.MatchString(string(text)) {
					t.Fatalf("seed %d: incomplete text %q is in the grammar", seed, text)
				}
			}
		})
	}
}

// TestConcurrentMatchers: matchers of one Grammar share its cache from
// many goroutines (run with -race); each must see the masks a private
// grammar computes.
func TestConcurrentMatchers(t *testing.T) {
	v, pieces := smallVocab()
	src := jsonGrammar(t)
	shared := mustParse(t, src)
	shared.SetCacheLimit(64 << 10) // small: generations turn over during the test
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			private := mustParse(t, src)
			rng := rand.New(rand.NewPCG(uint64(w), 3))
			words := (v.Size() + 63) / 64
			for range 30 {
				a, b := shared.NewMatcher(v), private.NewMatcher(v)
				for range 30 {
					ma, mb := make([]uint64, words), make([]uint64, words)
					a.FillMask(ma)
					b.FillMask(mb)
					var allowed []int32
					for id := range int32(v.Size()) {
						bit := ma[id>>6]>>(id&63)&1 != 0
						if bit != (mb[id>>6]>>(id&63)&1 != 0) || bit != a.Allows(id) {
							errs <- fmt.Errorf("worker %d: token %q: shared and private masks differ", w, pieces[id])
							return
						}
						if bit && id != 1 {
							allowed = append(allowed, id)
						}
					}
					if len(allowed) == 0 {
						break
					}
					id := allowed[rng.IntN(len(allowed))]
					if a.Accept(id) != nil || b.Accept(id) != nil {
						errs <- fmt.Errorf("worker %d: allowed token %q rejected", w, pieces[id])
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	_, _, bytes, resets := shared.CacheStats()
	if resets == 0 {
		t.Error("the 64 KiB cache never started a new generation: the bound is not exercised")
	}
	if bytes > 2*64<<10 {
		t.Errorf("the cache holds %d bytes, bound 64 KiB", bytes)
	}
}

// schemaGrammar is what a JSON Schema compiler emits for an object with
// required and optional properties, an enum and an array; its strings
// leave out the surrogates, as engine/jsonschema writes them.
const schemaGrammar = `root ::= "{" ws "\"name\"" ws ":" ws string ("," ws "\"age\"" ws ":" ws integer)? "," ws "\"tags\"" ws ":" ws tags "," ws "\"kind\"" ws ":" ws kind ws "}"
tags ::= "[" ws (string (ws "," ws string)*)? ws "]"
kind ::= "\"a\"" | "\"b\"" | "\"xyz\""
string ::= "\"" ([^"\\\x00-\x1F\uD800-\uDFFF] | "\\" ["\\/bfnrt])* "\""
integer ::= "-"? ("0" | [1-9] [0-9]{0,15})
ws ::= " "?
`

// TestMask32k: on the 32000-token vocabulary, along whole generations
// (including a character split over byte tokens), the mask equals Allows
// for every token at every step, cached or not, and the end is complete.
func TestMask32k(t *testing.T) {
	v := vocab32k(t)
	g := mustParse(t, jsonGrammar(t))
	gs := mustParse(t, schemaGrammar)
	// Counted strings (maxLength): the run shortcut has a length to respect.
	gb := mustParse(t, `root ::= "{\"s\": \"" [^"\\\x00-\x1F]{0,30} "\", \"t\": \"" [^"\\]{1,3} "\"}"`)
	doc := `{"notes": "naïve café, 日本語 😀 \"q\" \\ \u00e9", "n": [1, -2.5e3]}`
	toks := greedy(t, v, doc)
	// The same text with é as its two byte tokens: the first token ends
	// inside the character.
	split := greedy(t, v, `{"x": "caf`)
	split = append(split, 3+0xC3, 3+0xA9)
	split = append(split, greedy(t, v, `!"}`)...)
	for _, c := range []struct {
		g    *Grammar
		toks []int32
	}{{g, toks}, {g, split}, {gs, greedy(t, v, sampleSchema)}, {g, greedy(t, v, sampleJSON)},
		{gb, greedy(t, v, `{"s": "naïve café, 日本語 😀 and more", "t": "x"}`)}} {
		for pass := range 2 { // the second pass finds every mask cached
			m := c.g.NewMatcher(v)
			mask := make([]uint64, (v.Size()+63)/64)
			for i, id := range c.toks {
				m.FillMask(mask)
				for x := range int32(v.Size()) {
					if (mask[x>>6]>>(x&63)&1 != 0) != m.Allows(x) {
						t.Fatalf("pass %d step %d: token %d %q: mask %v, Allows %v", pass, i, x, v.pieces[x], !m.Allows(x), m.Allows(x))
					}
				}
				if mask[id>>6]>>(id&63)&1 == 0 {
					t.Fatalf("pass %d step %d: the text's own token %q is masked out", pass, i, v.pieces[id])
				}
				if err := m.Accept(id); err != nil {
					t.Fatal(err)
				}
			}
			if !m.Complete() || !m.Allows(2) {
				t.Fatal("the whole document is not complete")
			}
		}
	}
}

// TestHostileGrammars: ambiguous and deeply nested grammars stay within
// the state bounds (stacks per state, return addresses per stack) while
// they are matched, and deep but legal nesting still works.
func TestHostileGrammars(t *testing.T) {
	v, pieces := smallVocab()
	a := tokenID(t, pieces, "a")
	for _, src := range []string{
		`root ::= ("a"?){0,10000}`,
		`root ::= ("a" | "a" "a" | "a"?)*`,
		"root ::= (x | x x)*\nx ::= (\"a\" | \"aa\")+",
		`root ::= ((("a"{1000}){1000}){1000})`,
		"root ::= " + strings.Repeat("(", 500) + `"a"?` + strings.Repeat(")*", 500),
	} {
		g := mustParse(t, src)
		m := g.NewMatcher(v)
		for step := range 20 {
			if len(m.st.stacks) > maxStacks {
				t.Fatalf("%.30q step %d: %d stacks", src, step, len(m.st.stacks))
			}
			for _, n := range m.st.stacks {
				if n.depth >= maxDepth {
					t.Fatalf("%.30q: a stack of depth %d", src, n.depth)
				}
			}
			checkMask(t, m, v)
			if err := m.Accept(a); err != nil {
				t.Fatalf("%.30q step %d: %v", src, step, err)
			}
		}
	}
	g := mustParse(t, jsonGrammar(t))
	m := g.NewMatcher(v)
	open, closing := tokenID(t, pieces, "["), tokenID(t, pieces, "]")
	for range 1000 {
		if err := m.Accept(open); err != nil {
			t.Fatal(err)
		}
	}
	for range 1000 {
		if err := m.Accept(closing); err != nil {
			t.Fatal(err)
		}
	}
	if !m.Complete() {
		t.Error("1000 nested arrays are not complete")
	}
}

// TestShortcutApplies: inside a string, the mask walk allows most of the
// trie whole instead of visiting it, also when the string's character set
// leaves out the surrogates (engine/jsonschema's strings do; UTF-8 text
// never holds them).
func TestShortcutApplies(t *testing.T) {
	v := vocab32k(t)
	for _, c := range []struct{ name, src, prefix string }{
		{"json", jsonGrammar(t), `{"notes": "She`},
		{"no surrogates", schemaGrammar, `{"name": "Ada`},
		{"any", `root ::= "<" .* ">"`, `<x`},
		{"bounded", `root ::= "\"" [^"\\\x00-\x1F\uD800-\uDFFF]{0,40} "\""`, `"ab`},
	} {
		m := mustParse(t, c.src).NewMatcher(v)
		if err := m.AcceptBytes([]byte(c.prefix)); err != nil {
			t.Fatal(err)
		}
		mask := make([]uint64, (v.Size()+63)/64)
		m.fill(mask)
		allowed := 0
		for _, w := range mask {
			allowed += bits.OnesCount64(w)
		}
		t.Logf("%s: visited %d of %d trie nodes, %d tokens allowed", c.name, m.visited, v.nodes(), allowed)
		if m.visited > v.nodes()/10 {
			t.Errorf("%s: the walk visited %d of %d trie nodes: the shortcut did not apply", c.name, m.visited, v.nodes())
		}
		if allowed < v.Size()/2 {
			t.Errorf("%s: only %d tokens allowed inside a string", c.name, allowed)
		}
	}
}

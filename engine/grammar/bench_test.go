package grammar

import (
	"testing"
)

// sampleJSON is a document the benchmarks generate token by token.
const sampleJSON = `{"name": "Ada Lovelace", "age": 36, "tags": ["mathematician", "writer", "analyst"], "kind": "a", "notes": "She wrote the first program for Babbage's Analytical Engine, in 1843; it computed Bernoulli numbers.", "scores": [1.5, -2.25e3, 0, 42], "ok": true, "none": null}`

// sampleSchema is a sentence of schemaGrammar.
const sampleSchema = `{"name": "Ada Lovelace, Countess of Lovelace", "age": 36, "tags": ["mathematician", "writer"], "kind": "xyz"}`

// greedy splits text into tokens by longest match in the trie (a stand-in
// for a tokenizer: any split the vocabulary allows is a valid generation).
func greedy(tb testing.TB, v *Vocab, text string) []int32 {
	tb.Helper()
	var out []int32
	for i := 0; i < len(text); {
		node, best, bestLen := int32(0), int32(-1), 0
		for j := i; j < len(text); j++ {
			next := int32(-1)
			for e := v.first[node]; e < v.first[node+1]; e++ {
				if v.label[e] == text[j] {
					next = v.child[e]
					break
				}
			}
			if next < 0 {
				break
			}
			node = next
			if ts := v.toks[v.tokFirst[node]:v.tokFirst[node+1]]; len(ts) > 0 {
				best, bestLen = ts[0], j-i+1
			}
		}
		if best < 0 {
			tb.Fatalf("no token for %q", text[i:])
		}
		out = append(out, best)
		i += bestLen
	}
	return out
}

// fresh returns a copy of g with an empty cache.
func fresh(g *Grammar) *Grammar {
	return &Grammar{elems: g.elems, alts: g.alts, names: g.names, sets: g.sets, cuts: g.cuts,
		asciiClass: g.asciiClass, root: g.root, dead: &dstate{}, cacheLimit: g.cacheLimit}
}

// inString returns a matcher of the JSON grammar inside a string value,
// where nearly every token is allowed: the widest mask.
func inString(b *testing.B, g *Grammar, v *Vocab) *Matcher {
	m := g.NewMatcher(v)
	if err := m.AcceptBytes([]byte(`{"notes": "She wrote`)); err != nil {
		b.Fatal(err)
	}
	return m
}

func BenchmarkFillMask(b *testing.B) {
	v := vocab32k(b)
	g := mustParse(b, jsonGrammar(b))
	mask := make([]uint64, (v.Size()+63)/64)
	b.Run("json-string/cold", func(b *testing.B) {
		// The mask of a state never seen: a new grammar each time, so the
		// automaton's transitions are built too.
		for b.Loop() {
			inString(b, fresh(g), v).FillMask(mask)
		}
	})
	b.Run("json-string/uncached", func(b *testing.B) {
		// The trie walk alone (transitions known, mask not cached).
		m := inString(b, g, v)
		m.FillMask(mask)
		for b.Loop() {
			m.fill(mask)
		}
	})
	b.Run("schema-string/uncached", func(b *testing.B) {
		// A string that leaves out the surrogates, as engine/jsonschema
		// writes it: the shortcut must still apply.
		m := mustParse(b, schemaGrammar).NewMatcher(v)
		if err := m.AcceptBytes([]byte(`{"name": "Ada`)); err != nil {
			b.Fatal(err)
		}
		m.FillMask(mask)
		for b.Loop() {
			m.fill(mask)
		}
	})
	b.Run("json-string/cached", func(b *testing.B) {
		m := inString(b, g, v)
		m.FillMask(mask)
		for b.Loop() {
			m.FillMask(mask)
		}
	})
	for _, c := range []struct {
		name, src, text string
	}{
		{"json", jsonGrammar(b), sampleJSON},
		{"schema", schemaGrammar, sampleSchema},
	} {
		g := mustParse(b, c.src)
		toks := greedy(b, v, c.text)
		// A whole generation, a mask at every step: with a grammar shared
		// by earlier requests (warm) and with a new one (cold).
		gen := func(b *testing.B, g *Grammar) {
			m := g.NewMatcher(v)
			for _, id := range toks {
				m.FillMask(mask)
				if err := m.Accept(id); err != nil {
					b.Fatal(err)
				}
			}
		}
		b.Run(c.name+"-generation/warm", func(b *testing.B) {
			gen(b, g)
			for b.Loop() {
				gen(b, g)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(toks)), "ns/token")
		})
		b.Run(c.name+"-generation/cold", func(b *testing.B) {
			for b.Loop() {
				gen(b, fresh(g))
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(toks)), "ns/token")
		})
	}
}

func BenchmarkAllows(b *testing.B) {
	v := vocab32k(b)
	g := mustParse(b, jsonGrammar(b))
	m := inString(b, g, v)
	toks := greedy(b, v, " the first program for Babbage")
	for _, id := range toks {
		m.Allows(id)
	}
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		if !m.Allows(toks[i%len(toks)]) {
			b.Fatal("rejected")
		}
	}
}

func BenchmarkAccept(b *testing.B) {
	v := vocab32k(b)
	g := mustParse(b, jsonGrammar(b))
	toks := greedy(b, v, sampleJSON)
	m := g.NewMatcher(v)
	run := func() {
		m := g.NewMatcher(v)
		for _, id := range toks {
			if err := m.Accept(id); err != nil {
				b.Fatal(err)
			}
		}
	}
	run()
	_ = m
	for b.Loop() {
		run()
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(toks)), "ns/token")
}

func BenchmarkNewVocab(b *testing.B) {
	p := llama2Pieces(b)
	if p == nil {
		p = syntheticPieces(32000, 1)
	}
	var v *Vocab
	for b.Loop() {
		v = NewVocab(p, []int32{2})
	}
	b.ReportMetric(float64(v.nodes()), "trie-nodes")
}

package grammar

import (
	"errors"
	"testing"
	"time"

	"github.com/baton-serving/baton/engine"
)

// FuzzParse: no input panics the parser; errors wrap ErrInvalidInput; a
// grammar that parses can be matched and masked in bounded time.
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		`root ::= "a"`, jsonGrammar(f), schemaGrammar,
		`root ::= ("a" | "b"){2,5} [^x-z]* .`, "root ::= (\n a | b\n)\na ::= \"\\x41\"\nb ::= [\\u00e9]",
		`root ::= x x ::= y`, `root ::= root "a"`, `root ::= "(" root ")" | ""`, `root ::= ("a"?)*`,
		"root ::= [", `root ::= "\U0010FFFF"`, "# c\nroot ::= a # c\na ::= \"\"",
	} {
		f.Add(s)
	}
	v, _ := smallVocab()
	f.Fuzz(func(t *testing.T, src string) {
		start := time.Now()
		g, err := Parse(src)
		if err != nil {
			if !errors.Is(err, engine.ErrInvalidInput) {
				t.Fatalf("error %v does not wrap ErrInvalidInput", err)
			}
			return
		}
		m := g.NewMatcher(v)
		mask := make([]uint64, (v.Size()+63)/64)
		for range 8 {
			m.FillMask(mask)
			next := int32(-1)
			for id := range int32(v.Size()) {
				if mask[id>>6]>>(id&63)&1 != 0 {
					if !m.Allows(id) {
						t.Fatalf("mask allows %d, Allows does not", id)
					}
					if id != 1 {
						next = id
					}
				}
			}
			if next < 0 {
				break
			}
			if err := m.Accept(next); err != nil {
				t.Fatal(err)
			}
		}
		g.MatchString("aaaa")
		if d := time.Since(start); d > 10*time.Second {
			t.Fatalf("took %v", d)
		}
	})
}

// FuzzMatch: for fixed grammars and any text, feeding it in arbitrary
// pieces agrees with matching it whole, and a token mask agrees with
// Allows wherever the walk stops.
func FuzzMatch(f *testing.F) {
	f.Add([]byte(`{"a": [1, 2.5], "b": "é日本"}`), uint64(3))
	f.Add([]byte(`"\u00e9\n"`), uint64(1))
	f.Add([]byte("((()))()"), uint64(5))
	f.Add([]byte("\xe6\x97\xa5\xe6\x9c\xac"), uint64(7))
	v, _ := smallVocab()
	var grammars []*Grammar
	for _, src := range []string{jsonGrammar(f), schemaGrammar, propertyGrammars(f)["parens"], propertyGrammars(f)["utf8"], propertyGrammars(f)["bounded"]} {
		grammars = append(grammars, mustParse(f, src))
	}
	f.Fuzz(func(t *testing.T, text []byte, cuts uint64) {
		for gi, g := range grammars {
			whole := g.MatchString(string(text))
			m := g.NewMatcher(v)
			ok := true
			c := cuts
			for i := 0; i < len(text) && ok; {
				n := 1 + int(c%5)
				c = c/5 + 1
				j := min(len(text), i+n)
				if err := m.AcceptBytes(text[i:j]); err != nil {
					ok = false
					break
				}
				i = j
			}
			if ok && m.Complete() != whole {
				t.Fatalf("grammar %d, %q: in pieces complete=%v, whole=%v", gi, text, m.Complete(), whole)
			}
			if !ok && whole {
				t.Fatalf("grammar %d, %q: in pieces rejected, whole accepted", gi, text)
			}
			mask := make([]uint64, (v.Size()+63)/64)
			m.FillMask(mask)
			for id := range int32(v.Size()) {
				if (mask[id>>6]>>(id&63)&1 != 0) != m.Allows(id) {
					t.Fatalf("grammar %d after %q: mask and Allows differ on %d", gi, text, id)
				}
			}
		}
	})
}

package jsonschema

import (
	"errors"
	"testing"

	"github.com/baton-serving/baton/engine/grammar"
)

// byteVocab is a byte-level vocabulary: token b < 256 appends byte b, a few
// multi-byte tokens follow, and the last id is the end of generation.
type byteVocab struct {
	v      *grammar.Vocab
	pieces [][]byte
	eog    int32
}

var multiTokens = []string{`{"`, `":`, `",`, `"}`, `"]`, `["`, "true", "false", "null", "12", "0.", ", ", "\n  ", "é", "😀", `\u00e9`, `\"`, "-1", "ab"}

func newByteVocab() *byteVocab {
	var pieces [][]byte
	for b := range 256 {
		pieces = append(pieces, []byte{byte(b)})
	}
	for _, s := range multiTokens {
		pieces = append(pieces, []byte(s))
	}
	eog := int32(len(pieces))
	pieces = append(pieces, nil)
	return &byteVocab{v: grammar.NewVocab(pieces, []int32{eog}), pieces: pieces, eog: eog}
}

// matches feeds text byte by byte and reports whether the grammar accepts
// it as a whole sentence.
func (bv *byteVocab) matches(g *grammar.Grammar, text string) bool {
	m := g.NewMatcher(bv.v)
	for i := 0; i < len(text); i++ {
		if err := m.Accept(int32(text[i])); err != nil {
			if !errors.Is(err, grammar.ErrRejected) {
				panic(err)
			}
			return false
		}
	}
	return m.Complete() && m.Allows(bv.eog)
}

// compile runs ToGrammar and engine/grammar's Parse, failing the test on
// either error.
func compile(t testing.TB, schema string) *grammar.Grammar {
	t.Helper()
	src, err := ToGrammar([]byte(schema))
	if err != nil {
		t.Fatalf("ToGrammar(%s): %v", schema, err)
	}
	g, err := grammar.Parse(src)
	if err != nil {
		t.Fatalf("grammar.Parse of the grammar for %s: %v\n%s", schema, err, src)
	}
	return g
}

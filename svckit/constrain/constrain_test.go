package constrain

import (
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/baton-serving/baton/engine"
	"github.com/baton-serving/baton/engine/gguf"
	"github.com/baton-serving/baton/engine/refdata"
	"github.com/baton-serving/baton/engine/tokenizer"
	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
)

func stories(t *testing.T) *tokenizer.Tokenizer {
	t.Helper()
	f, err := gguf.Open(filepath.Join(refdata.Dir(t), "models", "stories260K.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	tok, err := tokenizer.FromGGUF(f)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// TestVocab: the grammar vocabulary of stories260K has the streaming
// decoder's bytes for each token, control tokens cannot be produced, and
// the tokenizer's EOG ids end a sentence.
func TestVocab(t *testing.T) {
	tok := stories(t)
	c := New(tok, tok.VocabSize()+8, 0) // a model padding its vocabulary
	if c.Vocab().Size() != tok.VocabSize()+8 {
		t.Fatalf("vocab size %d, want %d", c.Vocab().Size(), tok.VocabSize()+8)
	}
	if !slices.Equal(c.EOG(), tok.EOGs()) || len(c.EOG()) == 0 {
		t.Fatalf("EOG %v, want the tokenizer's %v", c.EOG(), tok.EOGs())
	}
	// "Once" under a grammar that wants it: the token "▁Once" gives " Once".
	m, err := c.Constraint(&batonv1.SamplingParams{Grammar: `root ::= " Once"`})
	if err != nil {
		t.Fatal(err)
	}
	once, ok := tok.TokenID("▁Once")
	if !ok {
		t.Fatal("no ▁Once in stories260K")
	}
	if !m.Allows(once) || m.Allows(tok.BOS()) || m.Allows(c.EOG()[0]) {
		t.Fatalf("Allows(▁Once) %v, Allows(BOS) %v, Allows(EOG) %v; want true, false, false",
			m.Allows(once), m.Allows(tok.BOS()), m.Allows(c.EOG()[0]))
	}
	if err := m.Accept(once); err != nil || !m.Complete() {
		t.Fatalf("Accept(▁Once) = %v, complete %v", err, m.Complete())
	}
}

// TestCache: a source compiles once and the cache holds at most its size;
// errors name the field and are invalid input.
func TestCache(t *testing.T) {
	tok := stories(t)
	c := New(tok, tok.VocabSize(), 2)
	g1, err := c.Schema(`{"type":"object"}`)
	if err != nil {
		t.Fatal(err)
	}
	g2, err := c.Schema(`{"type":"object"}`)
	if err != nil || g1 != g2 {
		t.Fatalf("the same schema compiled twice (%p, %p, %v)", g1, g2, err)
	}
	for _, src := range []string{`root ::= "a"`, `root ::= "b"`, `root ::= "c"`} {
		if _, err := c.Grammar(src); err != nil {
			t.Fatal(err)
		}
	}
	if c.Len() != 2 {
		t.Fatalf("cache holds %d grammars, want 2", c.Len())
	}
	if m, err := c.Constraint(&batonv1.SamplingParams{}); m != nil || err != nil {
		t.Fatalf("no grammar: %v, %v; want nil, nil", m, err)
	}
	for field, sp := range map[string]*batonv1.SamplingParams{
		"sampling.grammar":     {Grammar: `root ::= (`},
		"sampling.json_schema": {JsonSchema: `{"type": 7}`},
	} {
		_, err := c.Constraint(sp)
		if !errors.Is(err, engine.ErrInvalidInput) || !strings.Contains(err.Error(), field) {
			t.Errorf("%v: %v; want invalid input naming %s", sp, err, field)
		}
	}
}

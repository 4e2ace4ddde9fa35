package constrain

import (
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"sync"
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
	if c.vocab.Size() != tok.VocabSize()+8 {
		t.Fatalf("vocab size %d, want %d", c.vocab.Size(), tok.VocabSize()+8)
	}
	if !slices.Equal(c.eog, tok.EOGs()) || len(c.eog) == 0 {
		t.Fatalf("EOG %v, want the tokenizer's %v", c.eog, tok.EOGs())
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
	if !m.Allows(once) || m.Allows(tok.BOS()) || m.Allows(c.eog[0]) {
		t.Fatalf("Allows(▁Once) %v, Allows(BOS) %v, Allows(EOG) %v; want true, false, false",
			m.Allows(once), m.Allows(tok.BOS()), m.Allows(c.eog[0]))
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
	g1, err := c.compile("j", `{"type":"object"}`)
	if err != nil {
		t.Fatal(err)
	}
	g2, err := c.compile("j", `{"type":"object"}`)
	if err != nil || g1 != g2 {
		t.Fatalf("the same schema compiled twice (%p, %p, %v)", g1, g2, err)
	}
	for _, src := range []string{`root ::= "a"`, `root ::= "b"`, `root ::= "c"`} {
		if _, err := c.compile("g", src); err != nil {
			t.Fatal(err)
		}
	}
	if c.lru.Len() != 2 {
		t.Fatalf("cache holds %d grammars, want 2", c.lru.Len())
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

// TestMaskCacheScales: each kept grammar's mask cache holds about 500
// masks whatever the vocabulary: on a 128000-token one (16 KB masks) 300
// distinct states' masks stay cached, where a fixed 2 MiB held 128 and
// started over.
func TestMaskCacheScales(t *testing.T) {
	tok := stories(t)
	c := New(tok, 128000, 0)
	a := int32(-1)
	for id := range int32(tok.VocabSize()) {
		if string(tok.TokenBytes(id)) == "a" {
			a = id
			break
		}
	}
	if a < 0 {
		t.Fatal(`no token "a" in stories260K`)
	}
	g, err := c.compile("g", `root ::= "a"{0,400}`)
	if err != nil {
		t.Fatal(err)
	}
	m := g.NewMatcher(c.vocab)
	mask := make([]uint64, (c.vocab.Size()+63)/64)
	for i := range 300 {
		m.FillMask(mask)
		if err := m.Accept(a); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
	}
	if _, _, bytes, resets := g.CacheStats(); resets != 0 {
		t.Fatalf("300 masks of a 128000-token vocabulary: the cache started over %d times (%d bytes)", resets, bytes)
	}
}

// TestCompileCollapses: requests missing the cache together for one
// source compile it once.
func TestCompileCollapses(t *testing.T) {
	tok := stories(t)
	c := New(tok, tok.VocabSize(), 0)
	sp := &batonv1.SamplingParams{JsonSchema: `{"type":"object","properties":{"a":{"type":"array","items":{"type":"string","maxLength":30}}}}`}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			if _, err := c.Constraint(sp); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if n := c.compiles.Load(); n != 1 {
		t.Fatalf("8 concurrent requests compiled the schema %d times, want 1", n)
	}
}

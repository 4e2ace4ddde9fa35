// Package constrain turns a request's grammar (sampling.grammar, GBNF) or
// JSON Schema (sampling.json_schema) into the sampler's Constraint on a
// worker. The model's grammar vocabulary (every token's bytes and a token
// trie) is built once when the worker starts; compiled grammars are kept in
// a small cache keyed by their source, so that the same schema sent by many
// requests compiles once.
package constrain

import (
	"container/list"
	"fmt"
	"sync"

	"github.com/baton-serving/baton/engine"
	"github.com/baton-serving/baton/engine/grammar"
	"github.com/baton-serving/baton/engine/jsonschema"
	"github.com/baton-serving/baton/engine/sample"
	"github.com/baton-serving/baton/engine/tokenizer"
	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
)

// DefaultCacheSize is how many compiled grammars a Compiler keeps.
const DefaultCacheSize = 64

// maskCacheBytes bounds each kept grammar's mask cache: about 500 masks of
// a 32000-token vocabulary, more states than one schema's generations
// visit, and with DefaultCacheSize grammars at most 128 MiB in all rather
// than the 512 MiB engine/grammar's default would allow.
const maskCacheBytes = 2 << 20

// Compiler compiles the grammars of one model's requests. It is safe for
// concurrent use.
type Compiler struct {
	vocab *grammar.Vocab
	eog   []int32
	max   int

	mu    sync.Mutex
	byKey map[string]*list.Element // of *entry; most recently used first
	lru   list.List
}

type entry struct {
	key string
	g   *grammar.Grammar
}

// New builds the grammar vocabulary of a model with vocab logits whose
// tokens tok describes: each token's bytes are what the streaming decoder
// appends for it (tokenizer.TokenBytes); control tokens, unknown ones and
// ids beyond the tokenizer can never be produced under a grammar, except
// the tokenizer's end-of-generation ids, allowed where a sentence is
// complete. cacheSize ≤ 0 takes DefaultCacheSize.
func New(tok *tokenizer.Tokenizer, vocab, cacheSize int) *Compiler {
	pieces := make([][]byte, vocab)
	var eog []int32
	if tok != nil {
		for id := range min(vocab, tok.VocabSize()) {
			if b := tok.TokenBytes(int32(id)); len(b) > 0 {
				pieces[id] = b
			}
		}
		for _, id := range tok.EOGs() {
			if int(id) < vocab {
				eog = append(eog, id)
			}
		}
	}
	if cacheSize <= 0 {
		cacheSize = DefaultCacheSize
	}
	return &Compiler{vocab: grammar.NewVocab(pieces, eog), eog: eog, max: cacheSize, byKey: map[string]*list.Element{}}
}

// EOG returns the end-of-generation ids of the vocabulary.
func (c *Compiler) EOG() []int32 { return c.eog }

// Constraint returns a fresh matcher for p's grammar or JSON Schema, or nil
// when p has neither. Errors name the field (sampling.grammar,
// sampling.json_schema) and wrap engine.ErrInvalidInput.
func (c *Compiler) Constraint(p *batonv1.SamplingParams) (sample.Constraint, error) {
	switch {
	case p.GetGrammar() != "" && p.GetJsonSchema() != "":
		return nil, fmt.Errorf("sampling.grammar: set with sampling.json_schema, want at most one: %w", engine.ErrInvalidInput)
	case p.GetGrammar() != "":
		g, err := c.compile("g", p.GetGrammar())
		if err != nil {
			return nil, fmt.Errorf("sampling.grammar: %w", err)
		}
		return g.NewMatcher(c.vocab), nil
	case p.GetJsonSchema() != "":
		g, err := c.compile("j", p.GetJsonSchema())
		if err != nil {
			return nil, fmt.Errorf("sampling.json_schema: %w", err)
		}
		return g.NewMatcher(c.vocab), nil
	}
	return nil, nil
}

// Grammar compiles GBNF source (cached).
func (c *Compiler) Grammar(src string) (*grammar.Grammar, error) { return c.compile("g", src) }

// Schema compiles a JSON Schema (cached).
func (c *Compiler) Schema(src string) (*grammar.Grammar, error) { return c.compile("j", src) }

// Vocab returns the model's grammar vocabulary.
func (c *Compiler) Vocab() *grammar.Vocab { return c.vocab }

// compile returns the cached grammar of (kind, src), compiling it on a
// miss. Two requests missing together both compile; the cache keeps one.
func (c *Compiler) compile(kind, src string) (*grammar.Grammar, error) {
	key := kind + ":" + src
	c.mu.Lock()
	if e, ok := c.byKey[key]; ok {
		c.lru.MoveToFront(e)
		g := e.Value.(*entry).g
		c.mu.Unlock()
		return g, nil
	}
	c.mu.Unlock()

	gbnf := src
	if kind == "j" {
		var err error
		if gbnf, err = jsonschema.ToGrammar([]byte(src)); err != nil {
			return nil, err
		}
	}
	g, err := grammar.Parse(gbnf)
	if err != nil {
		return nil, err
	}
	g.SetCacheLimit(maskCacheBytes)

	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.byKey[key]; ok {
		c.lru.MoveToFront(e)
		return e.Value.(*entry).g, nil
	}
	c.byKey[key] = c.lru.PushFront(&entry{key: key, g: g})
	for c.lru.Len() > c.max {
		last := c.lru.Back()
		c.lru.Remove(last)
		delete(c.byKey, last.Value.(*entry).key)
	}
	return g, nil
}

// Len returns how many grammars the cache holds.
func (c *Compiler) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lru.Len()
}

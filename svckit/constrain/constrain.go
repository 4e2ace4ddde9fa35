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
	"sync/atomic"

	"github.com/baton-serving/baton/engine/grammar"
	"github.com/baton-serving/baton/engine/jsonschema"
	"github.com/baton-serving/baton/engine/sample"
	"github.com/baton-serving/baton/engine/tokenizer"
	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"golang.org/x/sync/singleflight"
)

// DefaultCacheSize is how many compiled grammars a Compiler keeps.
const DefaultCacheSize = 64

// masksPerGrammar sizes each kept grammar's automaton cache: room for
// about this many token masks of the model's vocabulary (vocab/8 bytes
// each: 4 KB at 32000 tokens, 16 KB at 128000), more states than one
// schema's generations visit, so the cache does not start over on large
// vocabularies. With DefaultCacheSize grammars the caches the Compiler
// keeps hold about 64 × 500 masks (128 MiB at 32000 tokens); a grammar
// evicted from the Compiler lives on, with its cache, as long as a
// request's matcher uses it, so that is not a bound on all the memory
// constrained requests use.
const masksPerGrammar = 500

// minCacheBytes is the least cache a grammar gets (small vocabularies).
const minCacheBytes = 2 << 20

// maxConcurrentCompiles bounds the grammars compiled at once (each is
// CPU- and memory-heavy; the decode loop must keep its cores).
const maxConcurrentCompiles = 2

// Compiler compiles the grammars of one model's requests. It is safe for
// concurrent use.
type Compiler struct {
	vocab *grammar.Vocab
	eog   []int32
	max   int

	cacheBytes int64 // each grammar's automaton cache bound

	// Compiles are collapsed per source (inflight) and at most
	// maxConcurrentCompiles run at once (sem).
	inflight singleflight.Group
	sem      chan struct{}
	compiles atomic.Int64 // grammars compiled (for tests)

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
	return &Compiler{vocab: grammar.NewVocab(pieces, eog), eog: eog, max: cacheSize, byKey: map[string]*list.Element{},
		cacheBytes: max(minCacheBytes, masksPerGrammar*(int64(vocab)/8+64)),
		sem:        make(chan struct{}, maxConcurrentCompiles)}
}

// Constraint returns a fresh matcher for p's grammar or JSON Schema, or nil
// when p has neither. Errors name the field (sampling.grammar,
// sampling.json_schema) and wrap engine.ErrInvalidInput.
func (c *Compiler) Constraint(p *batonv1.SamplingParams) (sample.Constraint, error) {
	// apiconv.Sampling refuses both set; grammar is taken first.
	switch {
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

// compile returns the cached grammar of (kind, src), compiling it on a
// miss. Requests missing together for one source share one compile, and
// at most maxConcurrentCompiles compile at once.
func (c *Compiler) compile(kind, src string) (*grammar.Grammar, error) {
	key := kind + ":" + src
	if g := c.cached(key); g != nil {
		return g, nil
	}
	v, err, _ := c.inflight.Do(key, func() (any, error) {
		if g := c.cached(key); g != nil {
			return g, nil
		}
		c.sem <- struct{}{}
		defer func() { <-c.sem }()
		c.compiles.Add(1)
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
		g.SetCacheLimit(c.cacheBytes)
		c.mu.Lock()
		defer c.mu.Unlock()
		c.byKey[key] = c.lru.PushFront(&entry{key: key, g: g})
		for c.lru.Len() > c.max {
			last := c.lru.Back()
			c.lru.Remove(last)
			delete(c.byKey, last.Value.(*entry).key)
		}
		return g, nil
	})
	if err != nil {
		return nil, err
	}
	return v.(*grammar.Grammar), nil
}

// cached returns the kept grammar of key, or nil.
func (c *Compiler) cached(key string) *grammar.Grammar {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.byKey[key]; ok {
		c.lru.MoveToFront(e)
		return e.Value.(*entry).g
	}
	return nil
}

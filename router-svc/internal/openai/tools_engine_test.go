package openai_test

import (
	"github.com/baton-serving/baton/engine/grammar"
	"github.com/baton-serving/baton/engine/sample"
	"github.com/baton-serving/baton/engine/tokenizer"
	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
)

// constrain makes smp follow sp.grammar, as a decode worker does: the
// grammar over the model's vocabulary (each token the bytes it appends to
// the text), end-of-generation allowed where a sentence is complete.
func constrain(smp *sample.Sampler, sp *batonv1.SamplingParams, tok *tokenizer.Tokenizer) error {
	if sp.GetGrammar() == "" {
		return nil
	}
	g, err := grammar.Parse(sp.GetGrammar())
	if err != nil {
		return err
	}
	pieces := make([][]byte, tok.VocabSize())
	for id := range pieces {
		pieces[id] = tok.TokenBytes(int32(id))
	}
	smp.Constrain(g.NewMatcher(grammar.NewVocab(pieces, tok.EOGs())), tok.EOGs(), sp.GetIgnoreEos())
	return nil
}

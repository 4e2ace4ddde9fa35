package openai_test

import (
	"github.com/baton-serving/baton/engine/sample"
	"github.com/baton-serving/baton/engine/tokenizer"
	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	svcconstrain "github.com/baton-serving/baton/svckit/constrain"
)

// constrain makes smp follow sp's grammar or JSON Schema as a decode worker
// does (svckit/constrain: the model's grammar vocabulary, end of generation
// allowed where a sentence is complete).
func constrain(smp *sample.Sampler, sp *batonv1.SamplingParams, tok *tokenizer.Tokenizer) error {
	c := svcconstrain.New(tok, tok.VocabSize(), 1)
	m, err := c.Constraint(sp)
	if err != nil || m == nil {
		return err
	}
	smp.Constrain(m, tok.EOGs(), sp.GetIgnoreEos()) // as engine/sched does
	return nil
}

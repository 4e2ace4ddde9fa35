package openai_test

import (
	"testing"

	"github.com/baton-serving/baton/engine/gguf"
	"github.com/baton-serving/baton/engine/model"
	"github.com/baton-serving/baton/engine/refdata"
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

// newEngineGenCtx is newEngineGen with the model's context window set to
// ctx tokens (as the workers' --context-length sets it): stories260K's own
// 128 tokens cannot hold a tools prompt.
func newEngineGenCtx(t *testing.T, ctx int) *engineGen {
	t.Helper()
	f, err := gguf.Open(refdata.Model(t))
	if err != nil {
		t.Fatal(err)
	}
	tok, err := tokenizer.FromGGUF(f)
	if err != nil {
		t.Fatal(err)
	}
	m, err := model.Load(f, model.Options{Threads: 1, ContextLength: ctx})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		m.Close()
		f.Close()
	})
	return &engineGen{m: m, tok: tok, cfg: m.Config(), inflight: map[string]bool{}, ended: make(chan error, 64)}
}

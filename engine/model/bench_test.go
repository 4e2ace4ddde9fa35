package model

import (
	"testing"

	"github.com/baton-serving/baton/engine/testmodel"
	"github.com/baton-serving/baton/kernels/quant"
)

// benchModel writes the llama-110m preset shape in typ (about 120 MB for
// Q8_0) and loads it; the setup is not timed.
func benchModel(b *testing.B, typ quant.Type) Model {
	s, _ := testmodel.Preset("llama-110m")
	s.Type = typ
	return load(b, writeModel(b, s), Options{})
}

// BenchmarkDecode measures one decode step (a token at position 64) of the
// llama-110m shape.
func BenchmarkDecode(b *testing.B) {
	for _, typ := range []quant.Type{quant.Q8_0, quant.Q4_K} {
		b.Run(typ.String(), func(b *testing.B) {
			m := benchModel(b, typ)
			cache, _ := NewContiguousCache(m.Config(), 128)
			logits := make([]float32, m.Config().Vocab)
			prompt := make([]int32, 64)
			if err := m.Forward(prompt, 0, cache, nil); err != nil {
				b.Fatal(err)
			}
			for b.Loop() {
				if err := m.Forward([]int32{42}, 64, cache, logits); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkPrefill measures a 64-token prefill of the llama-110m shape.
func BenchmarkPrefill(b *testing.B) {
	m := benchModel(b, quant.Q8_0)
	cache, _ := NewContiguousCache(m.Config(), 64)
	logits := make([]float32, m.Config().Vocab)
	prompt := make([]int32, 64)
	for b.Loop() {
		if err := m.Forward(prompt, 0, cache, logits); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(len(prompt)*b.N)/b.Elapsed().Seconds(), "tokens/s")
}

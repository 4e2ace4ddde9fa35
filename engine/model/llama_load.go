package model

import (
	"errors"
	"fmt"

	"github.com/baton-serving/baton/engine"
	"github.com/baton-serving/baton/engine/gguf"
	"github.com/baton-serving/baton/kernels"
)

// loadLlama binds a Llama model's tensors in the file mapping, checking
// each one's name, type and shape, and loads them onto the backend
// (llama_backend.go) unless a numerics mode computes on the host.
func loadLlama(f *gguf.File, c Config, opts Options) (Model, error) {
	b := newBinder(f)
	m := &llama{cfg: c}
	var err error
	if m.tokEmbd, err = b.matrix("token_embd.weight", c.Vocab, c.Dim); err != nil {
		return nil, err
	}
	if m.outNorm, err = b.vector("output_norm.weight", c.Dim); err != nil {
		return nil, err
	}
	if _, ok := f.Tensor("output.weight"); ok {
		if m.output, err = b.matrix("output.weight", c.Vocab, c.Dim); err != nil {
			return nil, err
		}
	} else {
		m.output = m.tokEmbd
		m.cfg.TiedOutput = true
	}
	if m.ropeFreqs, err = b.optionalVector("rope_freqs.weight", c.RopeDim/2); err != nil {
		return nil, err
	}
	for i, ff := range m.ropeFreqs {
		if !(ff > 0) {
			return nil, fmt.Errorf("model: rope_freqs.weight[%d] = %v, want > 0: %w", i, ff, engine.ErrInvalidInput)
		}
	}
	qDim, kvDim := c.QDim(), c.KVDim()
	m.layers = make([]llamaLayer, c.Layers)
	for i := range m.layers {
		l := &m.layers[i]
		name := func(s string) string { return fmt.Sprintf("blk.%d.%s", i, s) }
		steps := []func() error{
			func() (err error) { l.attnNorm, err = b.vector(name("attn_norm.weight"), c.Dim); return },
			func() (err error) { l.wq, err = b.matrix(name("attn_q.weight"), qDim, c.Dim); return },
			func() (err error) { l.wk, err = b.matrix(name("attn_k.weight"), kvDim, c.Dim); return },
			func() (err error) { l.wv, err = b.matrix(name("attn_v.weight"), kvDim, c.Dim); return },
			func() (err error) { l.wo, err = b.matrix(name("attn_output.weight"), c.Dim, qDim); return },
			func() (err error) { l.bq, err = b.optionalVector(name("attn_q.bias"), qDim); return },
			func() (err error) { l.bk, err = b.optionalVector(name("attn_k.bias"), kvDim); return },
			func() (err error) { l.bv, err = b.optionalVector(name("attn_v.bias"), kvDim); return },
			func() (err error) { l.bo, err = b.optionalVector(name("attn_output.bias"), c.Dim); return },
			func() (err error) { l.ffnNorm, err = b.vector(name("ffn_norm.weight"), c.Dim); return },
			func() (err error) { l.ffnGate, err = b.matrix(name("ffn_gate.weight"), c.Hidden, c.Dim); return },
			func() (err error) { l.ffnUp, err = b.matrix(name("ffn_up.weight"), c.Hidden, c.Dim); return },
			func() (err error) { l.ffnDwn, err = b.matrix(name("ffn_down.weight"), c.Dim, c.Hidden); return },
		}
		for _, step := range steps {
			if err := step(); err != nil {
				return nil, err
			}
		}
	}
	if err := b.unused(); err != nil {
		return nil, err
	}
	m.fp = Fingerprint(f, m.cfg)
	if opts.Numerics != NumericsDefault {
		return withNumerics(f, m, opts.Numerics) // compat.go; runs on the host alone
	}
	m.be = opts.Backend
	if m.be == nil {
		m.be, m.ownBE = kernels.NewCPU(opts.Threads), true
	}
	if err := m.upload(); err != nil {
		return nil, errors.Join(err, m.release())
	}
	return m, nil
}

package model

import (
	"fmt"
	"sync"

	"github.com/baton-serving/baton/engine"
	"github.com/baton-serving/baton/engine/gguf"
	"github.com/baton-serving/baton/kernels"
	"github.com/baton-serving/baton/kernels/quant"
)

// llama is the Llama architecture (Llama 2 and 3, TinyLlama, Mistral, SmolLM
// and the llama2.c models): pre-norm blocks of RMSNorm, grouped-query
// attention with RoPE on adjacent pairs, and a SwiGLU feed-forward network;
// a final RMSNorm and an output head that may be tied to the token
// embedding.
type llama struct {
	cfg       Config
	fp        string
	tokEmbd   matrix
	output    matrix
	outNorm   []float32
	ropeFreqs []float32 // per-pair frequency divisors (Llama 3.1), or nil
	layers    []llamaLayer

	pool   *pool
	mu     sync.RWMutex // held shared by Forward, exclusively by Close
	closed bool
	states sync.Pool // *llamaState
}

type llamaLayer struct {
	attnNorm, ffnNorm      []float32
	wq, wk, wv, wo         matrix
	bq, bk, bv, bo         []float32 // optional biases
	ffnGate, ffnUp, ffnDwn matrix
}

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
	m.pool = newPool(opts.Threads)
	return m, nil
}

func (m *llama) Config() Config      { return m.cfg }
func (m *llama) Fingerprint() string { return m.fp }

func (m *llama) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil
	}
	m.closed = true
	m.pool.close()
	return nil
}

// llamaState is the scratch space of one Forward call, sized for n tokens
// and reused through m.states.
type llamaState struct {
	x, xb          []float32 // residual stream and normalized input, n×Dim
	q, att         []float32 // queries and attention output, n×QDim
	k, v           []float32 // new keys and values, n×KVDim
	gate, up       []float32 // feed-forward activations, n×Hidden
	cos, sin       []float32 // RoPE tables, n×RopeDim/2
	scores         [][]float32
	normed, logits []float32
}

func grow(s []float32, n int) []float32 {
	if cap(s) < n {
		return make([]float32, n)
	}
	return s[:n]
}

func (m *llama) state(n, ctx int) *llamaState {
	s, _ := m.states.Get().(*llamaState)
	if s == nil {
		s = &llamaState{}
	}
	c := m.cfg
	s.x = grow(s.x, n*c.Dim)
	s.xb = grow(s.xb, n*c.Dim)
	s.q = grow(s.q, n*c.QDim())
	s.att = grow(s.att, n*c.QDim())
	s.k = grow(s.k, n*c.KVDim())
	s.v = grow(s.v, n*c.KVDim())
	s.gate = grow(s.gate, n*c.Hidden)
	s.up = grow(s.up, n*c.Hidden)
	s.cos = grow(s.cos, n*c.RopeDim/2)
	s.sin = grow(s.sin, n*c.RopeDim/2)
	if len(s.scores) < m.pool.n {
		s.scores = make([][]float32, m.pool.n)
	}
	for i := range s.scores {
		s.scores[i] = grow(s.scores[i], ctx)
	}
	s.normed = grow(s.normed, c.Dim)
	return s
}

// Forward implements Model.
func (m *llama) Forward(tokens []int32, pos int, cache KVCache, logits []float32) error {
	c := m.cfg
	n := len(tokens)
	switch {
	case n == 0:
		return fmt.Errorf("model: no tokens to process: %w", engine.ErrInvalidInput)
	case cache == nil:
		return fmt.Errorf("model: nil KV cache: %w", engine.ErrInvalidInput)
	case cache.Layers() != c.Layers || cache.KVDim() != c.KVDim():
		return fmt.Errorf("model: KV cache of %d layers × %d, model needs %d × %d: %w",
			cache.Layers(), cache.KVDim(), c.Layers, c.KVDim(), engine.ErrInvalidInput)
	case pos < 0 || pos > cache.Len():
		return fmt.Errorf("model: position %d, want [0, %d] (the cache holds %d positions): %w",
			pos, cache.Len(), cache.Len(), engine.ErrInvalidInput)
	case logits != nil && len(logits) != c.Vocab:
		return fmt.Errorf("model: logits buffer of %d, want the vocabulary size %d: %w", len(logits), c.Vocab, engine.ErrInvalidInput)
	case pos+n > c.ContextLength:
		return fmt.Errorf("model: positions %d…%d exceed the context window of %d: %w",
			pos, pos+n-1, c.ContextLength, engine.ErrContextOverflow)
	case pos+n > cache.Cap():
		return fmt.Errorf("model: positions %d…%d exceed the KV cache's %d positions: %w",
			pos, pos+n-1, cache.Cap(), engine.ErrKVCacheFull)
	}
	for i, t := range tokens {
		if t < 0 || int(t) >= c.Vocab {
			return fmt.Errorf("model: token %d (index %d) outside the vocabulary [0, %d): %w", t, i, c.Vocab, engine.ErrInvalidInput)
		}
	}

	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.closed {
		return ErrClosed
	}
	// Forget the positions being overwritten first, so that an error below
	// leaves the cache consistent.
	if err := cache.SetLen(pos); err != nil {
		return err
	}
	s := m.state(n, pos+n)
	defer m.states.Put(s)
	if err := m.forward(s, tokens, pos, cache, logits); err != nil {
		return err
	}
	return cache.SetLen(pos + n)
}

func (m *llama) forward(s *llamaState, tokens []int32, pos int, cache KVCache, logits []float32) error {
	c := m.cfg
	n := len(tokens)
	dim, qDim, kvDim, hd := c.Dim, c.QDim(), c.KVDim(), c.HeadDim
	half := c.RopeDim / 2

	for t, id := range tokens {
		if err := quant.Dequantize(m.tokEmbd.typ, m.tokEmbd.row(int(id)), s.x[t*dim:(t+1)*dim]); err != nil {
			return fmt.Errorf("model: embedding of token %d: %w", id, err)
		}
		kernels.RopeTable(s.cos[t*half:(t+1)*half], s.sin[t*half:(t+1)*half], pos+t, c.RopeBase, c.RopeScale, m.ropeFreqs)
	}

	for li := range m.layers {
		l := &m.layers[li]
		// Tokens t0…n-1 need the full block; the others only their keys
		// and values. In the last layer only the last token's output
		// matters, and nothing at all when no logits are wanted.
		t0 := 0
		if li == len(m.layers)-1 {
			t0 = n
			if logits != nil {
				t0 = n - 1
			}
		}

		for t := range n {
			kernels.RMSNorm(s.xb[t*dim:(t+1)*dim], s.x[t*dim:(t+1)*dim], l.attnNorm, c.NormEps)
		}
		m.matmul(s.q[t0*qDim:n*qDim], &l.wq, l.bq, s.xb[t0*dim:n*dim], n-t0)
		m.matmul(s.k[:n*kvDim], &l.wk, l.bk, s.xb[:n*dim], n)
		m.matmul(s.v[:n*kvDim], &l.wv, l.bv, s.xb[:n*dim], n)
		for t := range n {
			cs, sn := s.cos[t*half:(t+1)*half], s.sin[t*half:(t+1)*half]
			if t >= t0 {
				for h := range c.Heads {
					kernels.Rope(s.q[t*qDim+h*hd:t*qDim+(h+1)*hd], cs, sn, c.RopeLayout)
				}
			}
			for h := range c.KVHeads {
				kernels.Rope(s.k[t*kvDim+h*hd:t*kvDim+(h+1)*hd], cs, sn, c.RopeLayout)
			}
			cache.Put(li, pos+t, s.k[t*kvDim:(t+1)*kvDim], s.v[t*kvDim:(t+1)*kvDim])
		}
		if t0 == n {
			break
		}

		kc, vc := cache.View(li, pos+n)
		group := c.Heads / c.KVHeads
		// Each (token, head) pair costs about 2·positions·HeadDim
		// multiply-adds; keep parts at ≥ 32k of them.
		grain := max(1, (1<<15)/((pos+n)*hd*2))
		m.pool.parallel((n-t0)*c.Heads, grain, func(part, lo, hi int) {
			scores := s.scores[part]
			for i := lo; i < hi; i++ {
				t, h := t0+i/c.Heads, i%c.Heads
				off := (h / group) * hd
				kernels.AttendHead(s.att[t*qDim+h*hd:t*qDim+(h+1)*hd], s.q[t*qDim+h*hd:t*qDim+(h+1)*hd],
					kc[off:], vc[off:], pos+t+1, kvDim, scores)
			}
		})
		m.matmul(s.xb[t0*dim:n*dim], &l.wo, l.bo, s.att[t0*qDim:n*qDim], n-t0)
		kernels.Add(s.x[t0*dim:n*dim], s.x[t0*dim:n*dim], s.xb[t0*dim:n*dim])

		for t := t0; t < n; t++ {
			kernels.RMSNorm(s.xb[t*dim:(t+1)*dim], s.x[t*dim:(t+1)*dim], l.ffnNorm, c.NormEps)
		}
		hid := c.Hidden
		m.matmul(s.gate[t0*hid:n*hid], &l.ffnGate, nil, s.xb[t0*dim:n*dim], n-t0)
		m.matmul(s.up[t0*hid:n*hid], &l.ffnUp, nil, s.xb[t0*dim:n*dim], n-t0)
		kernels.SiLUMul(s.gate[t0*hid:n*hid], s.gate[t0*hid:n*hid], s.up[t0*hid:n*hid])
		m.matmul(s.xb[t0*dim:n*dim], &l.ffnDwn, nil, s.gate[t0*hid:n*hid], n-t0)
		kernels.Add(s.x[t0*dim:n*dim], s.x[t0*dim:n*dim], s.xb[t0*dim:n*dim])
	}

	if logits == nil {
		return nil
	}
	kernels.RMSNorm(s.normed, s.x[(n-1)*dim:n*dim], m.outNorm, c.NormEps)
	m.matmul(logits, &m.output, nil, s.normed, 1)
	return nil
}

// matmulBlock is the number of weight rows a worker multiplies with every
// token of the batch before moving on, so that a prefill batch reuses each
// block of weights from cache instead of streaming the matrix per token.
const matmulBlock = 16

// matmul computes dst[t] = w·x[t] (+ bias) for n tokens, splitting w's rows
// over the pool. x holds n rows of w.cols, dst n rows of w.rows.
func (m *llama) matmul(dst []float32, w *matrix, bias []float32, x []float32, n int) {
	if n == 0 {
		return
	}
	// Aim for ≥ 64k multiply-adds per part: below that, handing work to a
	// goroutine costs more than it saves.
	grain := max(1, (1<<16)/(w.cols*n))
	m.pool.parallel(w.rows, grain, func(_, lo, hi int) {
		for b := lo; b < hi; b += matmulBlock {
			e := min(b+matmulBlock, hi)
			wb := w.data[b*w.rowBytes : e*w.rowBytes]
			for t := range n {
				quant.MatVec(w.typ, dst[t*w.rows+b:t*w.rows+e], wb, e-b, w.cols, x[t*w.cols:(t+1)*w.cols])
			}
		}
	})
	if bias != nil {
		for t := range n {
			kernels.Add(dst[t*w.rows:(t+1)*w.rows], dst[t*w.rows:(t+1)*w.rows], bias)
		}
	}
}

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
	mm     *matmuls
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
	if opts.Numerics != NumericsDefault {
		return withNumerics(f, m, opts.Numerics) // compat.go; runs without the pool
	}
	m.pool = newPool(opts.Threads)
	m.mm = newMatmuls(m.pool)
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

// llamaState is the scratch space of one forward call, sized for its token
// rows and reused through m.states.
type llamaState struct {
	x, xb          []float32 // residual stream and normalized input, rows×Dim
	q, att         []float32 // queries and attention output, rows×QDim
	k, v           []float32 // new keys and values, rows×KVDim
	gate, up       []float32 // feed-forward activations, rows×Hidden
	cos, sin       []float32 // RoPE tables, rows×RopeDim/2
	attn           []attnScratch
	normed, logits []float32 // final norm and logits of the output rows

	rows    []rowInfo // every token row of the step
	act     []rowInfo // the rows going through the current block
	outRows []int     // rows whose next-token logits are wanted
	segs    []segment
	paged   []pagedStore
	contig  contigStore
}

func grow(s []float32, n int) []float32 {
	if cap(s) < n {
		return make([]float32, n)
	}
	return s[:n]
}

// state takes scratch space from the model's free list.
func (m *llama) state() *llamaState {
	s, _ := m.states.Get().(*llamaState)
	if s == nil {
		s = &llamaState{}
	}
	return s
}

// size makes room for n token rows, nOut of them producing logits, with
// attention over at most ctx positions in each of parts worker parts.
func (s *llamaState) size(c Config, parts, n, nOut, ctx int) {
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
	if len(s.attn) < parts {
		s.attn = make([]attnScratch, parts)
	}
	for i := range s.attn {
		s.attn[i].size(ctx, c.HeadDim)
	}
	s.normed = grow(s.normed, nOut*c.Dim)
	s.logits = grow(s.logits, nOut*c.Vocab)
}

// Forward implements Model.
func (m *llama) Forward(tokens []int32, pos int, cache KVCache, logits []float32) error {
	c := m.cfg
	n := len(tokens)
	if err := checkForwardArgs(c, n, pos, cache, logits); err != nil {
		return err
	}
	if err := m.checkTokens(tokens, ""); err != nil {
		return err
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
	s := m.state()
	defer m.states.Put(s)
	s.contig = contigStore{cache: cache, kvDim: c.KVDim()}
	s.segs = append(s.segs[:0], segment{tokens: tokens, pos: pos, kv: &s.contig, logits: logits})
	if err := m.forward(s); err != nil {
		return err
	}
	return cache.SetLen(pos + n)
}

func (m *llama) checkTokens(tokens []int32, what string) error {
	for i, t := range tokens {
		if t < 0 || int(t) >= m.cfg.Vocab {
			return fmt.Errorf("model: %stoken %d (index %d) outside the vocabulary [0, %d): %w", what, t, i, m.cfg.Vocab, engine.ErrInvalidInput)
		}
	}
	return nil
}

// forward runs the segments of s.segs through the model: every token row of
// every segment through each block together, so that each weight matrix is
// read once per call whatever the number of rows. Every operation is local
// to a row (norms, products, RoPE, the residual adds) or to a (row, head)
// pair (attention over the row's own sequence), so a row's results do not
// depend on which other rows share the call.
func (m *llama) forward(s *llamaState) error {
	c := m.cfg
	dim, qDim, kvDim, hd := c.Dim, c.QDim(), c.KVDim(), c.HeadDim
	half := c.RopeDim / 2

	n, ctx := 0, 0
	s.rows, s.outRows = s.rows[:0], s.outRows[:0]
	for si := range s.segs {
		seg := &s.segs[si]
		for t := range seg.tokens {
			s.rows = append(s.rows, rowInfo{seg: si, pos: seg.pos + t, row: n + t})
		}
		n += len(seg.tokens)
		ctx = max(ctx, seg.pos+len(seg.tokens))
		if seg.logits != nil {
			s.outRows = append(s.outRows, n-1)
		}
	}
	nOut := len(s.outRows)
	s.size(c, m.pool.n, n, nOut, ctx)

	for r, ri := range s.rows {
		id := s.segs[ri.seg].tokens[ri.pos-s.segs[ri.seg].pos]
		if err := quant.Dequantize(m.tokEmbd.typ, m.tokEmbd.row(int(id)), s.x[r*dim:(r+1)*dim]); err != nil {
			return fmt.Errorf("model: embedding of token %d: %w", id, err)
		}
		kernels.RopeTable(s.cos[r*half:(r+1)*half], s.sin[r*half:(r+1)*half], ri.pos, c.RopeBase, c.RopeScale, m.ropeFreqs)
	}

	group := c.Heads / c.KVHeads
	for li := range m.layers {
		l := &m.layers[li]
		m.eachRow(n, func(lo, hi int) {
			for r := lo; r < hi; r++ {
				kernels.RMSNorm(s.xb[r*dim:(r+1)*dim], s.x[r*dim:(r+1)*dim], l.attnNorm, c.NormEps)
			}
		})
		// The queries need computing only for the rows that go on (see
		// below): where that is every row, they join the keys and values.
		last := li == len(m.layers)-1
		if last {
			m.mm.products(s.xb[:n*dim], n, prod{s.k[:n*kvDim], &l.wk, l.bk}, prod{s.v[:n*kvDim], &l.wv, l.bv})
		} else {
			m.mm.products(s.xb[:n*dim], n, prod{s.q[:n*qDim], &l.wq, l.bq},
				prod{s.k[:n*kvDim], &l.wk, l.bk}, prod{s.v[:n*kvDim], &l.wv, l.bv})
		}
		for r, ri := range s.rows {
			cs, sn := s.cos[r*half:(r+1)*half], s.sin[r*half:(r+1)*half]
			for h := range c.KVHeads {
				kernels.Rope(s.k[r*kvDim+h*hd:r*kvDim+(h+1)*hd], cs, sn, c.RopeLayout)
			}
			s.segs[ri.seg].kv.put(li, ri.pos, s.k[r*kvDim:(r+1)*kvDim], s.v[r*kvDim:(r+1)*kvDim])
		}

		// Every row needs every block's keys and values, but in the last
		// block only the rows whose logits are wanted need the rest:
		// move them to the front and carry on with those alone.
		s.act = append(s.act[:0], s.rows...)
		if last {
			if nOut == 0 {
				break
			}
			s.act = s.act[:0]
			for i, r := range s.outRows {
				copy(s.xb[i*dim:(i+1)*dim], s.xb[r*dim:(r+1)*dim])
				copy(s.x[i*dim:(i+1)*dim], s.x[r*dim:(r+1)*dim])
				s.act = append(s.act, s.rows[r])
			}
		}
		na := len(s.act)

		if last {
			m.matmul(s.q[:na*qDim], &l.wq, l.bq, s.xb[:na*dim], na)
		}
		m.eachRow(na, func(lo, hi int) {
			for i := lo; i < hi; i++ {
				ri := s.act[i]
				cs, sn := s.cos[ri.row*half:(ri.row+1)*half], s.sin[ri.row*half:(ri.row+1)*half]
				for h := range c.Heads {
					kernels.Rope(s.q[i*qDim+h*hd:i*qDim+(h+1)*hd], cs, sn, c.RopeLayout)
				}
			}
		})
		for si := range s.segs {
			seg := &s.segs[si]
			seg.kv.prepare(li, seg.pos+len(seg.tokens))
		}
		// Each (row, head) pair costs about 2·positions·HeadDim
		// multiply-adds; keep parts at ≥ 32k of them.
		grain := max(1, (1<<15)/(ctx*hd*2))
		m.pool.parallel(na*c.Heads, grain, func(part, lo, hi int) {
			sc := &s.attn[part]
			for j := lo; j < hi; j++ {
				i, h := j/c.Heads, j%c.Heads
				ri := s.act[i]
				s.segs[ri.seg].kv.attend(s.att[i*qDim+h*hd:i*qDim+(h+1)*hd], s.q[i*qDim+h*hd:i*qDim+(h+1)*hd],
					h/group, ri.pos+1, sc)
			}
		})
		m.matmul(s.xb[:na*dim], &l.wo, l.bo, s.att[:na*qDim], na)
		m.eachRow(na, func(lo, hi int) {
			kernels.Add(s.x[lo*dim:hi*dim], s.x[lo*dim:hi*dim], s.xb[lo*dim:hi*dim])
			for i := lo; i < hi; i++ {
				kernels.RMSNorm(s.xb[i*dim:(i+1)*dim], s.x[i*dim:(i+1)*dim], l.ffnNorm, c.NormEps)
			}
		})
		hid := c.Hidden
		m.mm.products(s.xb[:na*dim], na, prod{s.gate[:na*hid], &l.ffnGate, nil}, prod{s.up[:na*hid], &l.ffnUp, nil})
		m.eachRow(na, func(lo, hi int) {
			siluMul(s.gate[lo*hid:hi*hid], s.up[lo*hid:hi*hid], hid)
		})
		m.matmul(s.xb[:na*dim], &l.ffnDwn, nil, s.gate[:na*hid], na)
		m.eachRow(na, func(lo, hi int) {
			kernels.Add(s.x[lo*dim:hi*dim], s.x[lo*dim:hi*dim], s.xb[lo*dim:hi*dim])
		})
	}

	if nOut == 0 {
		return nil
	}
	for i := range nOut {
		kernels.RMSNorm(s.normed[i*dim:(i+1)*dim], s.x[i*dim:(i+1)*dim], m.outNorm, c.NormEps)
	}
	m.matmul(s.logits[:nOut*c.Vocab], &m.output, nil, s.normed[:nOut*dim], nOut)
	i := 0
	for si := range s.segs {
		if lg := s.segs[si].logits; lg != nil {
			copy(lg, s.logits[i*c.Vocab:(i+1)*c.Vocab])
			i++
		}
	}
	return nil
}

// rowGrain is the fewest token rows worth handing to another goroutine
// for the per-row work between the products (norms, rotary embeddings,
// SiLU·mul, residual adds): a prompt's rows are spread over the pool, and
// a decoding step's few rows stay with the caller.
const rowGrain = 8

// eachRow calls fn over [0, n) rows, split across the pool for a prompt.
// Each row's arithmetic is the same however the rows are split.
func (m *llama) eachRow(n int, fn func(lo, hi int)) {
	if n < 2*rowGrain {
		fn(0, n)
		return
	}
	m.pool.parallel(n, rowGrain, func(_, lo, hi int) { fn(lo, hi) })
}

// matmul computes dst[t] = w·x[t] (+ bias) for n tokens, splitting w's rows
// over the pool. x holds n rows of w.cols, dst n rows of w.rows.
//
// It is the model's one seam to the matrix kernels: every product with a
// weight matrix goes through it, so moving to faster kernels is a change
// here alone. Whatever the kernel, each element of dst must be computed
// the same way whatever n is and whichever rows x holds besides its own,
// since a sequence's tokens must not depend on its neighbours in a batch
// (and the thread count must not matter either: work is split by weight
// rows, never inside a sum).
func (m *llama) matmul(dst []float32, w *matrix, bias []float32, x []float32, n int) {
	m.mm.product(dst, w, bias, x, n)
}

// checkForwardArgs checks Forward's arguments against the model's config; it
// is the one argument contract of every numerics mode.
func checkForwardArgs(c Config, n, pos int, cache KVCache, logits []float32) error {
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
	return nil
}

package model

import (
	"errors"
	"fmt"
	"sync"

	"github.com/baton-serving/baton/engine"
	"github.com/baton-serving/baton/engine/gguf"
	"github.com/baton-serving/baton/kernels"
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

	be      kernels.Backend // every operation of the forward pass runs here
	ownBE   bool            // be was made by Load: Close closes it
	outNrmB kernels.Buffer

	mu     sync.RWMutex // held shared by Forward, exclusively by Close
	closed bool
	free   struct {
		sync.Mutex
		states []*llamaState // scratch spaces not in use
	}
}

// llamaLayer is one block's weights: bound in the file mapping (used by
// the llama.cpp numerics mode) and loaded onto the backend (the matrices'
// mat fields, and the buffers below).
type llamaLayer struct {
	attnNorm, ffnNorm      []float32
	wq, wk, wv, wo         matrix
	bq, bk, bv, bo         []float32 // optional biases
	ffnGate, ffnUp, ffnDwn matrix

	attnNormB, ffnNormB kernels.Buffer
	bqB, bkB, bvB, boB  kernels.Buffer // nil without the bias
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

// upload loads the weight matrices and the norms and biases onto the
// backend. On an error, release frees what it loaded.
func (m *llama) upload() error {
	mat := func(w *matrix) error {
		var err error
		if w.mat, err = m.be.LoadMatrix(w.typ, w.rows, w.cols, w.data); err != nil {
			return fmt.Errorf("model: tensor %s on %s: %w", w.name, m.be.Name(), err)
		}
		return nil
	}
	vector := func(dst *kernels.Buffer, v []float32) error {
		if v == nil {
			return nil
		}
		var err error
		if *dst, err = kernels.Upload(m.be, v); err != nil {
			return fmt.Errorf("model: a norm or bias vector on %s: %w", m.be.Name(), err)
		}
		return nil
	}
	if err := mat(&m.tokEmbd); err != nil {
		return err
	}
	if m.cfg.TiedOutput {
		m.output.mat = m.tokEmbd.mat
	} else if err := mat(&m.output); err != nil {
		return err
	}
	if err := vector(&m.outNrmB, m.outNorm); err != nil {
		return err
	}
	for i := range m.layers {
		l := &m.layers[i]
		for _, w := range []*matrix{&l.wq, &l.wk, &l.wv, &l.wo, &l.ffnGate, &l.ffnUp, &l.ffnDwn} {
			if err := mat(w); err != nil {
				return err
			}
		}
		for _, v := range []struct {
			dst *kernels.Buffer
			src []float32
		}{{&l.attnNormB, l.attnNorm}, {&l.ffnNormB, l.ffnNorm}, {&l.bqB, l.bq}, {&l.bkB, l.bk}, {&l.bvB, l.bv}, {&l.boB, l.bo}} {
			if err := vector(v.dst, v.src); err != nil {
				return err
			}
		}
	}
	return nil
}

// release frees everything the model holds on its backend, and the
// backend itself when Load made it.
func (m *llama) release() error {
	if m.be == nil {
		return nil
	}
	var errs []error
	mat := func(w *matrix) {
		if w.mat != nil {
			errs = append(errs, m.be.FreeMatrix(w.mat))
			w.mat = nil
		}
	}
	buf := func(b *kernels.Buffer) {
		if *b != nil {
			errs = append(errs, m.be.Free(*b))
			*b = nil
		}
	}
	if m.cfg.TiedOutput {
		m.output.mat = nil
	}
	mat(&m.tokEmbd)
	mat(&m.output)
	buf(&m.outNrmB)
	for i := range m.layers {
		l := &m.layers[i]
		for _, w := range []*matrix{&l.wq, &l.wk, &l.wv, &l.wo, &l.ffnGate, &l.ffnUp, &l.ffnDwn} {
			mat(w)
		}
		for _, b := range []*kernels.Buffer{&l.attnNormB, &l.ffnNormB, &l.bqB, &l.bkB, &l.bvB, &l.boB} {
			buf(b)
		}
	}
	for _, s := range m.free.states {
		errs = append(errs, s.release(m.be))
	}
	m.free.states = nil
	if m.ownBE {
		errs = append(errs, m.be.Close())
	}
	return errors.Join(errs...)
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
	return m.release()
}

// llamaState is the scratch space of one forward call: buffers on the
// backend sized for its token rows, and the host-side tables that drive
// them. States are reused through m.free, so that the steady state
// allocates nothing on the backend.
type llamaState struct {
	rowsCap, outCap int // token rows and logits rows the buffers hold

	x, xb          kernels.Buffer // residual stream and normalized input, rows×Dim
	q, att         kernels.Buffer // queries and attention output, rows×QDim
	k, v           kernels.Buffer // new keys and values, rows×KVDim
	gate, up       kernels.Buffer // feed-forward activations, rows×Hidden
	cos, sin       kernels.Buffer // RoPE tables, rows×RopeDim/2
	normed, logits kernels.Buffer // final norm and logits of the output rows

	hostCos, hostSin []float32
	ids, slots       []int32
	attnRows         []kernels.AttnRow // of every row, then of the active rows
	pages            []int32           // the block tables of ForwardBatch's chunks
	prods            [3]kernels.Product

	rows    []rowInfo // every token row of the step
	act     []rowInfo // the rows going through the current block
	outRows []int     // rows whose next-token logits are wanted
	segs    []segment
}

func grow[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}

// state takes scratch space from the model's free list.
func (m *llama) state() *llamaState {
	m.free.Lock()
	defer m.free.Unlock()
	if k := len(m.free.states); k > 0 {
		s := m.free.states[k-1]
		m.free.states = m.free.states[:k-1]
		return s
	}
	return &llamaState{}
}

// putState gives scratch space back; Close frees it.
func (m *llama) putState(s *llamaState) {
	for i := range s.segs {
		s.segs[i] = segment{} // drop the references to the caller's slices
	}
	m.free.Lock()
	defer m.free.Unlock()
	m.free.states = append(m.free.states, s)
}

// bufs lists the state's backend buffers.
func (s *llamaState) bufs() []*kernels.Buffer {
	return []*kernels.Buffer{&s.x, &s.xb, &s.q, &s.att, &s.k, &s.v, &s.gate, &s.up, &s.cos, &s.sin, &s.normed, &s.logits}
}

// release frees the state's buffers.
func (s *llamaState) release(be kernels.Backend) error {
	var errs []error
	for _, b := range s.bufs() {
		if *b != nil {
			errs = append(errs, be.Free(*b))
			*b = nil
		}
	}
	s.rowsCap, s.outCap = 0, 0
	return errors.Join(errs...)
}

// size makes room for n token rows, nOut of them producing logits. The
// buffers grow to the next power of two, so that a server's mix of
// prompt lengths settles on a few sizes.
func (s *llamaState) size(be kernels.Backend, c Config, n, nOut int) error {
	s.hostCos = grow(s.hostCos, n*c.RopeDim/2)
	s.hostSin = grow(s.hostSin, n*c.RopeDim/2)
	s.ids = grow(s.ids, n)
	s.slots = grow(s.slots, n)
	s.attnRows = grow(s.attnRows, n)
	if n <= s.rowsCap && nOut <= s.outCap {
		return nil
	}
	if err := s.release(be); err != nil {
		return err
	}
	rows, outs := 1, 1
	for rows < n {
		rows *= 2
	}
	for outs < nOut {
		outs *= 2
	}
	for _, a := range []struct {
		b *kernels.Buffer
		n int
	}{
		{&s.x, rows * c.Dim}, {&s.xb, rows * c.Dim}, {&s.q, rows * c.QDim()}, {&s.att, rows * c.QDim()},
		{&s.k, rows * c.KVDim()}, {&s.v, rows * c.KVDim()}, {&s.gate, rows * c.Hidden}, {&s.up, rows * c.Hidden},
		{&s.cos, rows * c.RopeDim / 2}, {&s.sin, rows * c.RopeDim / 2}, {&s.normed, outs * c.Dim}, {&s.logits, outs * c.Vocab},
	} {
		var err error
		if *a.b, err = be.Alloc(a.n); err != nil {
			return errors.Join(fmt.Errorf("model: scratch space for %d tokens on %s: %w", n, be.Name(), err), s.release(be))
		}
	}
	s.rowsCap, s.outCap = rows, outs
	return nil
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
	cc, ok := cache.(*ContiguousCache)
	if !ok {
		return fmt.Errorf("model: a KV cache of type %T: Forward computes on a *ContiguousCache: %w", cache, engine.ErrInvalidInput)
	}

	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.closed {
		return ErrClosed
	}
	kv, pages, err := cc.kvOn(m.be)
	if err != nil {
		return err
	}
	// Forget the positions being overwritten first, so that an error below
	// leaves the cache consistent.
	if err := cache.SetLen(pos); err != nil {
		return err
	}
	s := m.state()
	defer m.putState(s)
	s.segs = append(s.segs[:0], segment{tokens: tokens, pos: pos, pages: pages, logits: logits})
	if err := m.forward(s, kv, contigPageSize); err != nil {
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

// forward runs the segments of s.segs through the model on the backend,
// with their keys and values in kv (pages of pageSize positions): every
// token row of every segment through each block together, so that each
// weight matrix is read once per call whatever the number of rows. Every
// operation is local to a row (norms, products, RoPE, the residual adds)
// or to a (row, head) pair (attention over the row's own sequence), so a
// row's results do not depend on which other rows share the call.
func (m *llama) forward(s *llamaState, kv kernels.KVCache, pageSize int) error {
	c, be := m.cfg, m.be
	dim, qDim, kvDim, hid := c.Dim, c.QDim(), c.KVDim(), c.Hidden
	half := c.RopeDim / 2

	n := 0
	s.rows, s.outRows = s.rows[:0], s.outRows[:0]
	for si := range s.segs {
		seg := &s.segs[si]
		for t := range seg.tokens {
			s.rows = append(s.rows, rowInfo{seg: si, pos: seg.pos + t, row: n + t})
		}
		n += len(seg.tokens)
		if seg.logits != nil {
			s.outRows = append(s.outRows, n-1)
		}
	}
	nOut := len(s.outRows)
	if err := s.size(be, c, n, nOut); err != nil {
		return err
	}
	for r, ri := range s.rows {
		seg := &s.segs[ri.seg]
		s.ids[r] = seg.tokens[ri.pos-seg.pos]
		s.slots[r] = seg.pages[ri.pos/pageSize]*int32(pageSize) + int32(ri.pos%pageSize)
		s.attnRows[r] = kernels.AttnRow{Pages: seg.pages, Len: ri.pos + 1}
		kernels.RopeTable(s.hostCos[r*half:(r+1)*half], s.hostSin[r*half:(r+1)*half], ri.pos, c.RopeBase, c.RopeScale, m.ropeFreqs)
	}

	// The first error of the backend stops the pass; operations after it
	// are skipped.
	var err error
	do := func(e error) {
		if err == nil && e != nil {
			err = e
		}
	}
	x, xb := s.x.Slice(0, n*dim), s.xb.Slice(0, n*dim)
	q, k, v := s.q.Slice(0, n*qDim), s.k.Slice(0, n*kvDim), s.v.Slice(0, n*kvDim)
	att, gate, up := s.att.Slice(0, n*qDim), s.gate.Slice(0, n*hid), s.up.Slice(0, n*hid)
	cos, sin := s.cos.Slice(0, n*half), s.sin.Slice(0, n*half)
	do(be.Embed(x, m.tokEmbd.mat, s.ids[:n]))
	do(be.Write(cos, s.hostCos[:n*half]))
	do(be.Write(sin, s.hostSin[:n*half]))
	attnRows := s.attnRows[:n]
	na := n

	for li := range m.layers {
		l := &m.layers[li]
		do(be.RMSNorm(xb, x, l.attnNormB, c.NormEps))
		// The queries need computing only for the rows that go on (see
		// below): where that is every row, they join the keys and values.
		last := li == len(m.layers)-1
		s.prods = [3]kernels.Product{{Dst: q, W: l.wq.mat}, {Dst: k, W: l.wk.mat}, {Dst: v, W: l.wv.mat}}
		if last {
			do(kernels.MatMuls(be, xb, s.prods[1:]...))
		} else {
			do(kernels.MatMuls(be, xb, s.prods[:]...))
			m.bias(do, q, l.bqB)
		}
		m.bias(do, k, l.bkB)
		m.bias(do, v, l.bvB)
		do(be.Rope(k, cos, sin, n, c.HeadDim, c.RopeLayout))
		do(be.StoreKV(kv, li, s.slots[:n], k, v))

		// Every row needs every block's keys and values, but in the last
		// block only the rows whose logits are wanted need the rest:
		// move them to the front and carry on with those alone.
		if last {
			if nOut == 0 {
				break
			}
			s.act = s.act[:0]
			for i, r := range s.outRows {
				if i != r {
					do(be.Copy(xb.Slice(i*dim, (i+1)*dim), xb.Slice(r*dim, (r+1)*dim)))
					do(be.Copy(x.Slice(i*dim, (i+1)*dim), x.Slice(r*dim, (r+1)*dim)))
					copy(s.hostCos[i*half:(i+1)*half], s.hostCos[r*half:(r+1)*half])
					copy(s.hostSin[i*half:(i+1)*half], s.hostSin[r*half:(r+1)*half])
					s.attnRows[i] = s.attnRows[r]
				}
				s.act = append(s.act, s.rows[r])
			}
			na = nOut
			x, xb = x.Slice(0, na*dim), xb.Slice(0, na*dim)
			q, att = q.Slice(0, na*qDim), att.Slice(0, na*qDim)
			gate, up = gate.Slice(0, na*hid), up.Slice(0, na*hid)
			cos, sin = cos.Slice(0, na*half), sin.Slice(0, na*half)
			attnRows = s.attnRows[:na]
			do(be.Write(cos, s.hostCos[:na*half]))
			do(be.Write(sin, s.hostSin[:na*half]))
			do(be.MatMul(q, l.wq.mat, xb))
			m.bias(do, q, l.bqB)
		}
		do(be.Rope(q, cos, sin, na, c.HeadDim, c.RopeLayout))
		do(be.Attention(att, q, kv, li, attnRows))
		do(be.MatMul(xb, l.wo.mat, att))
		m.bias(do, xb, l.boB)
		do(be.Add(x, x, xb))
		do(be.RMSNorm(xb, x, l.ffnNormB, c.NormEps))
		s.prods[0], s.prods[1] = kernels.Product{Dst: gate, W: l.ffnGate.mat}, kernels.Product{Dst: up, W: l.ffnUp.mat}
		do(kernels.MatMuls(be, xb, s.prods[:2]...))
		do(be.SiLUMul(gate, gate, up))
		do(be.MatMul(xb, l.ffnDwn.mat, gate))
		do(be.Add(x, x, xb))
		if err != nil {
			return fmt.Errorf("model: block %d on %s: %w", li, be.Name(), err)
		}
	}
	if err != nil {
		return fmt.Errorf("model: last block on %s: %w", be.Name(), err)
	}
	if nOut == 0 {
		return nil
	}
	normed, logits := s.normed.Slice(0, nOut*dim), s.logits.Slice(0, nOut*c.Vocab)
	do(be.RMSNorm(normed, x, m.outNrmB, c.NormEps))
	do(be.MatMul(logits, m.output.mat, normed))
	i := 0
	for si := range s.segs {
		if lg := s.segs[si].logits; lg != nil {
			do(be.Read(lg, logits.Slice(i*c.Vocab, (i+1)*c.Vocab)))
			i++
		}
	}
	if err != nil {
		return fmt.Errorf("model: output head on %s: %w", be.Name(), err)
	}
	return nil
}

// bias adds a bias row to every row of dst, when the model has one.
func (m *llama) bias(do func(error), dst, b kernels.Buffer) {
	if b != nil {
		do(m.be.Add(dst, dst, b))
	}
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

package model

import (
	"fmt"
	"sync"

	"github.com/baton-serving/baton/engine"
	"github.com/baton-serving/baton/engine/model/arch"
	"github.com/baton-serving/baton/kernels"
)

// decoder runs every architecture of package arch: pre-norm blocks of
// RMSNorm, grouped-query attention with RoPE and a gated feed-forward
// network, a final RMSNorm and an output head (tied to the token embedding
// when the file has no output.weight). What varies between architectures
// is data: which roles its tensor table binds (biases, q/k norms,
// post-attention and post-FFN norms, FFN biases, rope frequency factors)
// switches the matching operations on, and arch.Arch and Config carry the
// rest (the RoPE layout, the activation, and the operations that need the
// backend's ExtendedOps, which loadDecoder refuses on a backend without
// them).
type decoder struct {
	cfg    Config
	a      *arch.Arch
	fp     string
	g      weights   // the global roles
	layers []weights // each block's roles

	factors []float32 // the rope frequency factors in use (ropeFactors), or nil

	be    kernels.Backend // every operation of the forward pass runs here
	ownBE bool            // be was made by Load: Close closes it

	ext kernels.ExtendedOps // be's extended operations, when the model needs them (else nil)

	mu     sync.RWMutex // held shared by Forward, exclusively by Close
	closed bool
	free   struct {
		sync.Mutex
		states []*scratch // scratch spaces not in use
	}
}

func (m *decoder) Config() Config      { return m.cfg }
func (m *decoder) Fingerprint() string { return m.fp }

// Forward implements Model.
func (m *decoder) Forward(tokens []int32, pos int, cache KVCache, logits []float32) error {
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

func (m *decoder) checkTokens(tokens []int32, what string) error {
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
func (m *decoder) forward(s *scratch, kv kernels.KVCache, pageSize int) error {
	c, be := m.cfg, m.be
	dim, qDim, kvDim, hid := c.Dim, c.QDim(), c.KVDim(), c.Hidden
	half := c.RopeDim / 2

	n := 0
	s.rows, s.outRows, s.outs = s.rows[:0], s.outRows[:0], s.outs[:0]
	every := false // a segment wants every row's logits
	for si := range s.segs {
		seg := &s.segs[si]
		for t := range seg.tokens {
			s.rows = append(s.rows, rowInfo{seg: si, pos: seg.pos + t, row: n + t})
		}
		switch {
		case seg.rowLogits != nil:
			every = true
			for t := range seg.tokens {
				s.outRows = append(s.outRows, n+t)
				s.outs = append(s.outs, outRow{seg: si, tok: t})
			}
		case seg.logits != nil:
			s.outRows = append(s.outRows, n+len(seg.tokens)-1)
			s.outs = append(s.outs, outRow{seg: si, tok: len(seg.tokens) - 1})
		}
		n += len(seg.tokens)
	}
	nOut := len(s.outRows)
	// The output head's rows at once: all of them, unless a segment asks
	// for every row (then a bounded group at a time, see headGroupRows).
	nHead := nOut
	if every {
		nHead = min(nOut, headGroupRows)
	}
	if err := s.size(be, c, n, nOut, nHead); err != nil {
		return err
	}
	// Local layers rotate with their own base and no position scaling
	// (Gemma 3).
	local := c
	local.RopeBase, local.RopeScale = c.RopeBaseLocal, 1
	for r, ri := range s.rows {
		seg := &s.segs[ri.seg]
		s.ids[r] = seg.tokens[ri.pos-seg.pos]
		s.slots[r] = seg.pages[ri.pos/pageSize]*int32(pageSize) + int32(ri.pos%pageSize)
		s.attnRows[r] = kernels.AttnRow{Pages: seg.pages, Len: ri.pos + 1}
		ropeTable(s.hostCos[r*half:(r+1)*half], s.hostSin[r*half:(r+1)*half], ri.pos, c, m.factors)
		if c.RopeBaseLocal != 0 {
			ropeTable(s.hostLCos[r*half:(r+1)*half], s.hostLSin[r*half:(r+1)*half], ri.pos, local, m.factors)
		}
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
	do(be.Embed(x, m.g[arch.TokEmbd].m.mat, s.ids[:n]))
	if c.EmbedScale != 0 {
		do(m.ext.Scale(x, x, c.EmbedScale))
	}
	do(be.Write(cos, s.hostCos[:n*half]))
	do(be.Write(sin, s.hostSin[:n*half]))
	// Local layers' RoPE tables (Gemma 3), beside the global ones.
	lcos, lsin := cos, sin
	if c.RopeBaseLocal != 0 {
		lcos, lsin = s.lcos.Slice(0, n*half), s.lsin.Slice(0, n*half)
		do(be.Write(lcos, s.hostLCos[:n*half]))
		do(be.Write(lsin, s.hostLSin[:n*half]))
	}
	attnRows := s.attnRows[:n]
	na := n

	for li := range m.layers {
		l := &m.layers[li]
		do(be.RMSNorm(xb, x, l[arch.AttnNorm].buf, c.NormEps))
		// The queries need computing only for the rows that go on (see
		// below): where that is every row, they join the keys and values.
		last := li == len(m.layers)-1
		s.prods = [3]kernels.Product{{Dst: q, W: l[arch.Wq].m.mat}, {Dst: k, W: l[arch.Wk].m.mat}, {Dst: v, W: l[arch.Wv].m.mat}}
		if last {
			do(kernels.MatMuls(be, xb, s.prods[1:]...))
		} else {
			do(kernels.MatMuls(be, xb, s.prods[:]...))
			m.queries(do, l, q)
		}
		m.bias(do, k, l[arch.Bk].buf)
		m.norm(do, k, l[arch.KNorm].buf)
		m.bias(do, v, l[arch.Bv].buf)
		rcos, rsin := cos, sin
		if c.Local(li) {
			rcos, rsin = lcos, lsin
		}
		do(be.Rope(k, rcos, rsin, n, c.HeadDim, c.RopeLayout))
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
					if c.RopeBaseLocal != 0 {
						copy(s.hostLCos[i*half:(i+1)*half], s.hostLCos[r*half:(r+1)*half])
						copy(s.hostLSin[i*half:(i+1)*half], s.hostLSin[r*half:(r+1)*half])
					}
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
			rcos, rsin = cos, sin
			if c.RopeBaseLocal != 0 && c.Local(li) {
				rcos, rsin = lcos.Slice(0, na*half), lsin.Slice(0, na*half)
				do(be.Write(rcos, s.hostLCos[:na*half]))
				do(be.Write(rsin, s.hostLSin[:na*half]))
			}
			do(be.MatMul(q, l[arch.Wq].m.mat, xb))
			m.queries(do, l, q)
		}
		do(be.Rope(q, rcos, rsin, na, c.HeadDim, c.RopeLayout))
		m.attention(do, att, q, kv, li, attnRows)
		do(be.MatMul(xb, l[arch.Wo].m.mat, att))
		m.bias(do, xb, l[arch.Bo].buf)
		m.norm(do, xb, l[arch.PostAttnNorm].buf)
		do(be.Add(x, x, xb))
		do(be.RMSNorm(xb, x, l[arch.FFNNorm].buf, c.NormEps))
		s.prods[0], s.prods[1] = kernels.Product{Dst: gate, W: l[arch.Gate].m.mat}, kernels.Product{Dst: up, W: l[arch.Up].m.mat}
		do(kernels.MatMuls(be, xb, s.prods[:2]...))
		m.bias(do, gate, l[arch.BGate].buf)
		m.bias(do, up, l[arch.BUp].buf)
		if m.a.Act == arch.GELU {
			do(m.ext.GELUMul(gate, gate, up))
		} else {
			do(be.SiLUMul(gate, gate, up))
		}
		do(be.MatMul(xb, l[arch.Down].m.mat, gate))
		m.bias(do, xb, l[arch.BDown].buf)
		m.norm(do, xb, l[arch.PostFFNNorm].buf)
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
	normed := s.normed.Slice(0, nOut*dim)
	do(be.RMSNorm(normed, x, m.g[arch.OutputNorm].buf, c.NormEps))
	for g := 0; g < nOut && err == nil; g += nHead {
		e := min(g+nHead, nOut)
		logits := s.logits.Slice(0, (e-g)*c.Vocab)
		do(be.MatMul(logits, m.g[arch.Output].m.mat, normed.Slice(g*dim, e*dim)))
		if c.FinalSoftCap != 0 {
			do(m.ext.SoftCap(logits, c.FinalSoftCap))
		}
		for i := g; i < e && err == nil; i++ {
			o := s.outs[i]
			seg := &s.segs[o.seg]
			row := logits.Slice((i-g)*c.Vocab, (i-g+1)*c.Vocab)
			if seg.rowLogits == nil {
				do(be.Read(seg.logits, row))
				continue
			}
			s.hostRow = grow(s.hostRow, c.Vocab)
			do(be.Read(s.hostRow, row))
			if err != nil {
				break
			}
			if seg.logits != nil && o.tok == len(seg.tokens)-1 {
				copy(seg.logits, s.hostRow)
			}
			seg.rowLogits(o.tok, s.hostRow)
		}
	}
	if err != nil {
		return fmt.Errorf("model: output head on %s: %w", be.Name(), err)
	}
	return nil
}

// attention runs layer li's attention of the rows of q into att: with the
// model's score scale, soft-cap and the layer's sliding window
// (Config.LayerWindow: Gemma's local layers, every phi3 layer) through the
// backend's ExtendedOps when it has any, else plain Attention. Queries are scaled first when the model says so (Gemma 2
// scales q after RoPE and scores with scale 1, as llama.cpp does, so that
// the soft-cap sees the same numbers).
func (m *decoder) attention(do func(error), att, q kernels.Buffer, kv kernels.KVCache, li int, rows []kernels.AttnRow) {
	c := m.cfg
	if c.QueryScale != 0 {
		do(m.ext.Scale(q, q, c.QueryScale))
	}
	o := kernels.AttnOptions{Scale: c.AttnScale, SoftCap: c.AttnSoftCap, Window: c.LayerWindow(li)}
	if o == (kernels.AttnOptions{}) {
		do(m.be.Attention(att, q, kv, li, rows))
		return
	}
	do(m.ext.AttentionWith(att, q, kv, li, rows, o))
}

// bias adds a bias row to every row of dst, when the model has one.
func (m *decoder) bias(do func(error), dst, b kernels.Buffer) {
	if b != nil {
		do(m.be.Add(dst, dst, b))
	}
}

// norm applies an RMSNorm in place to every row of w.Len() elements of
// dst (a whole row, or each head of one), when the model has the weight w.
func (m *decoder) norm(do func(error), dst, w kernels.Buffer) {
	if w != nil {
		do(m.be.RMSNorm(dst, dst, w, m.cfg.NormEps))
	}
}

// queries finishes the query projection q: its bias, then the per-head
// norm (Qwen3), before RoPE.
func (m *decoder) queries(do func(error), l *weights, q kernels.Buffer) {
	m.bias(do, q, l[arch.Bq].buf)
	m.norm(do, q, l[arch.QNorm].buf)
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

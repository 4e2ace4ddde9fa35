package model

import (
	"fmt"
	"sync"

	"github.com/baton-serving/baton/engine"
	"github.com/baton-serving/baton/engine/gguf"
	"github.com/baton-serving/baton/engine/kvcache"
	"github.com/baton-serving/baton/engine/model/arch"
	"github.com/baton-serving/baton/kernels"
	"github.com/baton-serving/baton/kernels/quant"
)

// llamaCppUbatch is llama.cpp's default micro-batch (n_ubatch): the most
// tokens it runs through the graph at once, and so the unit whose size
// decides between its single-token and its batched matrix kernels.
const llamaCppUbatch = 512

// llamaCppKVPad is the multiple llama.cpp rounds the number of KV cache positions an
// attention step reads up to (without flash attention). The padded
// positions are masked out, so they change nothing but which elements the
// vector code handles together.
const llamaCppKVPad = 32

// llamaCpp is a llama model run with NumericsLlamaCpp; see there for what it
// reproduces. It takes the configuration, norms and biases bound by
// loadDecoder, keeps a float32 copy of the weight matrices (the mode is meant
// for models small enough that doubling their memory does not matter, and
// decoding the mapping on every use would dominate its time), and computes
// on the calling goroutine.
type llamaCpp struct {
	w            *decoder
	tokEmbd, out f32Matrix
	layers       []cppLayer
	thetaScale   float32 // powf(rope base, −2/RopeDim), as ggml's rope computes it

	mu     sync.RWMutex // held shared by Forward, exclusively by Close
	closed bool
}

func newLlamaCpp(f *gguf.File, m *decoder) (*llamaCpp, error) {
	for _, t := range f.Tensors {
		if t.Type != quant.F32 {
			return nil, fmt.Errorf("model: numerics %s supports F32 models only, and tensor %s is %s: %w",
				NumericsLlamaCpp, t.Name, t.Type, engine.ErrUnsupported)
		}
	}
	c := m.cfg
	if !m.a.LlamaCppNumerics {
		return nil, fmt.Errorf("model: numerics %s supports the llama architecture only, not %s: %w",
			NumericsLlamaCpp, m.a.Name, engine.ErrUnsupported)
	}
	for _, l := range m.layers {
		for _, r := range []arch.Role{arch.QNorm, arch.KNorm, arch.PostAttnNorm, arch.PostFFNNorm, arch.BGate, arch.BUp, arch.BDown} {
			if l[r].bound() {
				return nil, fmt.Errorf("model: numerics %s does not emulate the %s weight: %w", NumericsLlamaCpp, r, engine.ErrUnsupported)
			}
		}
	}
	if c.RopeYarnOrigCtx > 0 || (c.RopeAttnFactor != 0 && c.RopeAttnFactor != 1) {
		return nil, fmt.Errorf("model: numerics %s does not emulate YaRN or rope attention factors: %w", NumericsLlamaCpp, engine.ErrUnsupported)
	}
	if c.RopeLayout != kernels.RopeNormal {
		return nil, fmt.Errorf("model: numerics %s supports the normal (adjacent-pair) RoPE layout only: %w",
			NumericsLlamaCpp, engine.ErrUnsupported)
	}
	cm := &llamaCpp{
		w:          m,
		tokEmbd:    decodeMatrix(&m.g[arch.TokEmbd].m),
		layers:     make([]cppLayer, len(m.layers)),
		thetaScale: libmPowf(c.RopeBase, -2/float32(c.RopeDim)),
	}
	cm.out = cm.tokEmbd
	if !c.TiedOutput {
		cm.out = decodeMatrix(&m.g[arch.Output].m)
	}
	for i := range m.layers {
		l := &m.layers[i]
		cm.layers[i] = cppLayer{
			wq: decodeMatrix(&l[arch.Wq].m), wk: decodeMatrix(&l[arch.Wk].m), wv: decodeMatrix(&l[arch.Wv].m), wo: decodeMatrix(&l[arch.Wo].m),
			gate: decodeMatrix(&l[arch.Gate].m), up: decodeMatrix(&l[arch.Up].m), down: decodeMatrix(&l[arch.Down].m),
		}
	}
	return cm, nil
}

// f32Matrix is a rows×cols weight matrix, row-major.
type f32Matrix struct {
	rows, cols int
	data       []float32
}

func (m *f32Matrix) row(r int) []float32 { return m.data[r*m.cols : (r+1)*m.cols] }

// decodeMatrix copies an F32 matrix out of the file mapping.
func decodeMatrix(m *matrix) f32Matrix {
	d := make([]float32, m.rows*m.cols)
	readF32LE(d, m.data)
	return f32Matrix{rows: m.rows, cols: m.cols, data: d}
}

type cppLayer struct {
	wq, wk, wv, wo, gate, up, down f32Matrix
}

func (m *llamaCpp) Config() Config      { return m.w.cfg }
func (m *llamaCpp) Fingerprint() string { return m.w.fp }

func (m *llamaCpp) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.closed = true
	return nil
}

// ForwardBatch implements Model; the mode runs one sequence at a time.
func (m *llamaCpp) ForwardBatch(*kvcache.Pool, []Chunk) error {
	return fmt.Errorf("model: numerics %s supports single-sequence Forward only, not ForwardBatch over a paged KV cache: %w",
		NumericsLlamaCpp, engine.ErrUnsupported)
}

// Forward implements Model. Its contract, and the errors for bad arguments,
// are those of the default mode.
func (m *llamaCpp) Forward(tokens []int32, pos int, cache KVCache, logits []float32) error {
	c := m.w.cfg
	n := len(tokens)
	if err := checkForwardArgs(c, n, pos, cache, logits); err != nil {
		return err
	}
	if err := m.w.checkTokens(tokens, ""); err != nil {
		return err
	}

	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.closed {
		return ErrClosed
	}
	if err := cache.SetLen(pos); err != nil {
		return err
	}
	s := newCppState(c, min(n, llamaCppUbatch))
	for lo := 0; lo < n; lo += llamaCppUbatch {
		hi := min(lo+llamaCppUbatch, n)
		var out []float32
		if hi == n {
			out = logits
		}
		m.ubatch(s, tokens[lo:hi], pos+lo, cache, out)
		if err := cache.SetLen(pos + hi); err != nil {
			return err
		}
	}
	return nil
}

// cppState is the scratch space of one Forward call.
type cppState struct {
	x, xb, tmp []float32 // residual stream, normalized input, a product; rows×Dim
	q, att     []float32 // queries and attention output, rows×QDim
	k, v       []float32 // new keys and values, rows×KVDim
	gate, up   []float32 // feed-forward activations, rows×Hidden
	cos, sin   []float32 // RoPE tables, rows×RopeDim/2
	keys, vals []float32 // one KV head: keys position-major, values transposed
	probs      []float32 // one head's attention weights
}

func newCppState(c Config, rows int) *cppState {
	return &cppState{
		x: make([]float32, rows*c.Dim), xb: make([]float32, rows*c.Dim), tmp: make([]float32, rows*c.Dim),
		q: make([]float32, rows*c.QDim()), att: make([]float32, rows*c.QDim()),
		k: make([]float32, rows*c.KVDim()), v: make([]float32, rows*c.KVDim()),
		gate: make([]float32, rows*c.Hidden), up: make([]float32, rows*c.Hidden),
		cos: make([]float32, rows*c.RopeDim/2), sin: make([]float32, rows*c.RopeDim/2),
	}
}

// ubatch runs tokens, at positions pos…, through the model as one llama.cpp
// micro-batch, and writes the last token's logits when logits is not nil.
//
// Rows are computed independently, so computing only the rows whose results
// are needed gives what llama.cpp gives for them; what must follow llama.cpp
// is the kernel choice, which depends on how many rows an operation has
// there: all of the micro-batch's up to the last layer's attention output
// projection, then only the output row.
func (m *llamaCpp) ubatch(s *cppState, tokens []int32, pos int, cache KVCache, logits []float32) {
	c := m.w.cfg
	n := len(tokens)
	dim, qDim, kvDim, hd, hid := c.Dim, c.QDim(), c.KVDim(), c.HeadDim, c.Hidden
	half := c.RopeDim / 2
	for r, id := range tokens {
		copy(s.x[r*dim:(r+1)*dim], m.tokEmbd.row(int(id)))
		ropeCacheGGML(s.cos[r*half:(r+1)*half], s.sin[r*half:(r+1)*half], pos+r, m.thetaScale, c.RopeScale, m.w.g[arch.RopeFreqs].v)
	}

	for li := range m.layers {
		l, b := &m.layers[li], &m.w.layers[li]
		for r := range n {
			rmsNormGGML(s.xb[r*dim:(r+1)*dim], s.x[r*dim:(r+1)*dim], b[arch.AttnNorm].v, c.NormEps)
		}
		matmulGGML(s.k[:n*kvDim], &l.wk, b[arch.Bk].v, s.xb[:n*dim], n, n)
		matmulGGML(s.v[:n*kvDim], &l.wv, b[arch.Bv].v, s.xb[:n*dim], n, n)
		for r := range n {
			k := s.k[r*kvDim : (r+1)*kvDim]
			for h := range c.KVHeads {
				ropeGGML(k[h*hd:(h+1)*hd], s.cos[r*half:(r+1)*half], s.sin[r*half:(r+1)*half])
			}
			roundF16s(k)
			roundF16s(s.v[r*kvDim : (r+1)*kvDim])
			cache.Put(li, pos+r, k, s.v[r*kvDim:(r+1)*kvDim])
		}

		// Rows [lo, n) continue through the block: all of them, or in the
		// last block only the one whose logits are wanted.
		lo := 0
		if li == len(m.layers)-1 {
			if logits == nil {
				break
			}
			lo = n - 1
		}
		na := n - lo
		matmulGGML(s.q[:na*qDim], &l.wq, b[arch.Bq].v, s.xb[lo*dim:n*dim], na, n)
		for i := range na {
			r := lo + i
			q := s.q[i*qDim : (i+1)*qDim]
			for h := range c.Heads {
				ropeGGML(q[h*hd:(h+1)*hd], s.cos[r*half:(r+1)*half], s.sin[r*half:(r+1)*half])
			}
			roundF16s(q)
		}
		m.attention(s, cache, li, pos, n, lo)
		matmulGGML(s.tmp[:na*dim], &l.wo, b[arch.Bo].v, s.att[:na*qDim], na, n)
		cppAdd(s.x[lo*dim:n*dim], s.tmp[:na*dim])

		for i := range na {
			rmsNormGGML(s.xb[i*dim:(i+1)*dim], s.x[(lo+i)*dim:(lo+i+1)*dim], b[arch.FFNNorm].v, c.NormEps)
		}
		matmulGGML(s.gate[:na*hid], &l.gate, nil, s.xb[:na*dim], na, na)
		matmulGGML(s.up[:na*hid], &l.up, nil, s.xb[:na*dim], na, na)
		for i := range na {
			siluGGML(s.gate[i*hid : (i+1)*hid])
		}
		for i, u := range s.up[:na*hid] {
			s.gate[i] *= u
		}
		matmulGGML(s.tmp[:na*dim], &l.down, nil, s.gate[:na*hid], na, na)
		cppAdd(s.x[lo*dim:n*dim], s.tmp[:na*dim])
	}
	if logits == nil {
		return
	}
	rmsNormGGML(s.xb[:dim], s.x[(n-1)*dim:n*dim], m.w.g[arch.OutputNorm].v, c.NormEps)
	matmulGGML(logits, &m.out, nil, s.xb[:dim], 1, 1)
}

func cppAdd(x, y []float32) {
	for i, v := range y {
		x[i] += v
	}
}

// attention computes s.att for the rows [lo, n) of a micro-batch of n
// tokens at positions pos…, from their queries in s.q and the keys and
// values of positions 0…pos+n-1 in layer li of the cache.
func (m *llamaCpp) attention(s *cppState, cache KVCache, li, pos, n, lo int) {
	c := m.w.cfg
	hd, kvDim, qDim := c.HeadDim, c.KVDim(), c.QDim()
	end := pos + n
	// llama.cpp's attention reads nkv positions, the causal mask hiding
	// those past each row's own; values and weights there are zero here.
	nkv := (end + llamaCppKVPad - 1) / llamaCppKVPad * llamaCppKVPad
	scale := 1 / libmSqrtf(float32(hd))
	// Both attention products are F16 by F16 matrix products: tinyBLAS
	// orders them for a batch where its shape conditions hold (KQ has nkv
	// rows over HeadDim, KQV HeadDim rows over nkv), ggml_vec_dot_f16
	// otherwise.
	qkTiny, kqvTiny := useTiny(nkv, n, hd), useTiny(hd, n, nkv)
	keysAll, valsAll := cache.View(li, end)
	s.keys = grow(s.keys, end*hd)
	s.vals = grow(s.vals, hd*nkv)
	s.probs = grow(s.probs, nkv)
	group := c.Heads / c.KVHeads
	for kh := range c.KVHeads {
		// Gather the head's keys and its values transposed (as llama.cpp's
		// V cache is laid out), rounded to F16 in case the cache was
		// written by another mode.
		clear(s.vals)
		for t := range end {
			src := keysAll[t*kvDim+kh*hd : t*kvDim+(kh+1)*hd]
			for i, v := range src {
				s.keys[t*hd+i] = roundF16(v)
				s.vals[i*nkv+t] = roundF16(valsAll[t*kvDim+kh*hd+i])
			}
		}
		for r := lo; r < n; r++ {
			live := pos + r + 1
			for h := kh * group; h < (kh+1)*group; h++ {
				off := (r-lo)*qDim + h*hd
				q, out := s.q[off:off+hd], s.att[off:off+hd]
				p := s.probs[:nkv]
				for t := range live {
					k := s.keys[t*hd : (t+1)*hd]
					if qkTiny {
						p[t] = dotTiny(q, k) * scale
					} else {
						p[t] = dotVecF16(q, k) * scale
					}
				}
				softmaxGGML(p, live)
				roundF16s(p[:live])
				for i := range out {
					col := s.vals[i*nkv : (i+1)*nkv]
					if kqvTiny {
						out[i] = dotTiny(col, p)
					} else {
						out[i] = dotVecF16(col, p)
					}
				}
			}
		}
	}
}

// matmulGGML sets dst[t] = w·x[t] (+ bias) for the n token rows of x, each
// in the summation order llama.cpp uses for this matrix when its operation
// has batch rows: tinyBLAS's where useTiny allows, ggml_vec_dot_f32's
// otherwise. The bias is added afterwards, as ggml adds it.
func matmulGGML(dst []float32, w *f32Matrix, bias []float32, x []float32, n, batch int) {
	tiny := useTiny(w.rows, batch, w.cols)
	for r := range w.rows {
		row := w.row(r)
		for t := range n {
			xt := x[t*w.cols : (t+1)*w.cols]
			if tiny {
				dst[t*w.rows+r] = dotTiny(row, xt)
			} else {
				dst[t*w.rows+r] = dotVecF32(row, xt)
			}
		}
	}
	if bias != nil {
		for t := range n {
			cppAdd(dst[t*w.rows:(t+1)*w.rows], bias)
		}
	}
}

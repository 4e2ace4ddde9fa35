package kernels

import (
	"sync"

	"github.com/baton-serving/baton/kernels/quant"
	"github.com/baton-serving/baton/kernels/vec"
)

// Weight products run on the kernels of kernels/vec: F32 weights multiply
// the float activations directly, F16 and BF16 weights the activations
// rounded to their type (cpu_round.go); quantized weights
// multiply activations quantized once per call (Q8_0 blocks for Q8_0,
// Q4_0, Q5_0 and IQ4_NL weights, Q8_1 for Q4_1 and Q5_1, Q8_K blocks for
// the K-quants and IQ4_XS), with integer block dot
// products, as llama.cpp does.
//
// A token's results must not depend on the batch it is computed in, nor
// on the thread count: decode (one token) must reproduce prefill (many)
// bit for bit, and a sequence must not notice its neighbours. The vec
// kernels sum each output element in the same order whatever the tile it
// falls in (one-token tiles included), with one exception that this file
// works around, and which TestMatmulBatchInvariance pins down on every
// implementation the CPU runs: the widest register tiles (4 rows, AVX-512)
// reduce their sums in another order than the narrower edge tiles. So the
// rows are split into chunks at multiples of rowAlign, which every tile
// height divides: each row then falls in the same tile whatever the split.
const (
	// mmTokens is the token width of vec's matrix-matrix register tiles.
	mmTokens = 4
	// rowAlign is a multiple of every register tile height of vec (1 to 4).
	rowAlign = 16
	// chunkBytes is the target size of the weights in one chunk of rows: a
	// piece that stays in L2 while a prompt's tokens move across it, and
	// small enough that idle participants can take over the rest of a
	// product from a stalled one.
	chunkBytes = 256 << 10
	// floatChunkBytes is chunkBytes for float weights and one or two
	// tokens.
	floatChunkBytes = 1 << 20
	// floatChunkRows is the least number of rows in a chunk of a float
	// product of more tokens that is split into more chunks than
	// participants.
	floatChunkRows = 512
	// minChunkMACs is the least work worth handing to another goroutine.
	minChunkMACs = 1 << 16
)

// matmuls is the CPU backend's weight-product machinery: per-call scratch
// space, recycled so that the steady state allocates nothing.
type matmuls struct {
	pool    *pool
	scratch sync.Pool // *mmCall
}

func newMatmuls(p *pool) *matmuls {
	return &matmuls{pool: p}
}

// mmCall is one product in flight: the operands, and the buffers that
// outlive it for the next call. It is the task the pool runs over rows.
type mmCall struct {
	w   *cpuMatrix
	dst []float32 // n rows of ldd = w.rows outputs
	x   []float32 // float activations, n rows
	xq  []byte    // quantized activations, n rows
	xp  []float32 // float activations packed for the kernels (vec.Pack), or nil
	n   int

	// Buffers kept across calls.
	qbuf  []byte
	pbuf  []float32
	rbuf  []float32 // activations rounded for F16 or BF16 weights
	round roundTask
	quan  quantizeTask
	group groupTask
}

// quantizeTask quantizes token rows of activations.
type quantizeTask struct {
	x     []float32
	xq    []byte
	cols  int
	xRow  int // bytes per quantized row
	kquan bool
	q81   bool // Q8_1 blocks (Q4_1 and Q5_1 weights)
}

func (q *quantizeTask) run(_, lo, hi int) {
	x, xq := q.x[lo*q.cols:hi*q.cols], q.xq[lo*q.xRow:hi*q.xRow]
	var err error
	if q.kquan {
		err = vec.QuantizeQ8_K(x, xq)
	} else if q.q81 {
		err = vec.QuantizeQ8_1(x, xq)
	} else {
		err = vec.QuantizeQ8_0(x, xq)
	}
	if err != nil {
		// Unreachable: the weight types guarantee the block multiple. Poison
		// the output rather than compute with stale activations.
		clear(xq)
	}
}

func (c *mmCall) run(_, lo, hi int) {
	w := c.w
	rows := hi - lo
	dst := c.dst[lo:]
	wd := w.data[lo*w.rowBytes : hi*w.rowBytes]
	switch w.typ {
	case quant.F32:
		vec.MatMulF32Packed(dst, w.rows, w.f32[lo*w.cols:hi*w.cols], c.x, c.xp, rows, w.cols, c.n)
	case quant.F16:
		vec.MatMulF16Packed(dst, w.rows, wd, c.x, c.xp, rows, w.cols, c.n)
	case quant.BF16:
		vec.MatMulBF16Packed(dst, w.rows, wd, c.x, c.xp, rows, w.cols, c.n)
	case quant.Q8_0:
		vec.MatMulQ8_0(dst, w.rows, wd, c.xq, rows, w.cols, c.n)
	case quant.Q4_0:
		vec.MatMulQ4_0(dst, w.rows, wd, c.xq, rows, w.cols, c.n)
	case quant.Q4_K:
		vec.MatMulQ4_K(dst, w.rows, wd, c.xq, rows, w.cols, c.n)
	case quant.Q6_K:
		vec.MatMulQ6_K(dst, w.rows, wd, c.xq, rows, w.cols, c.n)
	case quant.Q4_1:
		vec.MatMulQ4_1(dst, w.rows, wd, c.xq, rows, w.cols, c.n)
	case quant.Q5_0:
		vec.MatMulQ5_0(dst, w.rows, wd, c.xq, rows, w.cols, c.n)
	case quant.Q5_1:
		vec.MatMulQ5_1(dst, w.rows, wd, c.xq, rows, w.cols, c.n)
	case quant.IQ4_NL:
		vec.MatMulIQ4_NL(dst, w.rows, wd, c.xq, rows, w.cols, c.n)
	case quant.Q2_K:
		vec.MatMulQ2_K(dst, w.rows, wd, c.xq, rows, w.cols, c.n)
	case quant.Q3_K:
		vec.MatMulQ3_K(dst, w.rows, wd, c.xq, rows, w.cols, c.n)
	case quant.Q5_K:
		vec.MatMulQ5_K(dst, w.rows, wd, c.xq, rows, w.cols, c.n)
	case quant.IQ4_XS:
		vec.MatMulIQ4_XS(dst, w.rows, wd, c.xq, rows, w.cols, c.n)
	default:
		// Types without a vec kernel: the reference dot products, a token
		// at a time (the same arithmetic for any n).
		for t := range c.n {
			quant.MatVec(w.typ, c.dst[t*w.rows+lo:t*w.rows+hi], wd, rows, w.cols, c.x[t*w.cols:(t+1)*w.cols])
		}
	}
}

// chunkRows picks the rows per chunk of a product of n tokens with w.
func (mm *matmuls) chunkRows(w *cpuMatrix, n int) int {
	threads := mm.pool.n
	var c int
	if _, _, q := quantized(w); q {
		// Cache-sized pieces, and enough of them for the participants to
		// balance their shares.
		c = min(chunkBytes/max(w.rowBytes, 1), (w.rows+4*threads-1)/(4*threads))
	} else if n <= mmTokens {
		// Decoding float weights: the same, in larger pieces (pieces of
		// 128 KiB to 1 MiB decoded the 110M F32 shape equally fast).
		c = min(floatChunkBytes/max(w.rowBytes, 1), (w.rows+2*threads-1)/(2*threads))
	} else {
		// A prompt: one chunk per participant, or a few of at least
		// floatChunkRows rows. Each chunk streams every packed token
		// past its rows; finer splits (4 per participant) measured no
		// faster on the 1.1B F16 shape, with the tokens packed once.
		per := max(1, w.rows/(threads*floatChunkRows))
		c = (w.rows + threads*per - 1) / (threads * per)
	}
	// Enough work in each to pay for the hand-off.
	c = max(c, minChunkMACs/max(w.cols*n, 1))
	return (c + rowAlign - 1) / rowAlign * rowAlign
}

// quantized returns the activation block type that w's kernels take:
// (kquant, bytes per row of cols activations), ok false for float weights.
func quantized(w *cpuMatrix) (kquant bool, xRow int, ok bool) {
	switch w.typ {
	case quant.Q8_0, quant.Q4_0, quant.Q5_0, quant.IQ4_NL:
		return false, w.cols / vec.Q8_0Values * vec.Q8_0Bytes, true
	case quant.Q4_1, quant.Q5_1:
		return false, w.cols / vec.Q8_1Values * vec.Q8_1Bytes, true
	case quant.Q4_K, quant.Q6_K, quant.Q2_K, quant.Q3_K, quant.Q5_K, quant.IQ4_XS:
		return true, w.cols / vec.Q8_KValues * vec.Q8_KBytes, true
	}
	return false, 0, false
}

func growBytes(b []byte, n int) []byte {
	if cap(b) < n {
		return make([]byte, n)
	}
	return b[:n]
}

// product computes dst[t·w.rows + r] = w_r · x_t for n tokens:
// x holds n rows of w.cols, dst n rows of w.rows.
func (mm *matmuls) product(dst []float32, w *cpuMatrix, x []float32, n int) {
	if n == 0 {
		return
	}
	c := mm.prepare(dst, w, x, n, nil)
	mm.pool.run(w.rows, mm.chunkRows(w, c.n), c)
	mm.finish(c)
}

// prod is one weight product of a group that shares its activations.
type prod struct {
	dst []float32
	w   *cpuMatrix
}

// maxGroup is the most products one loop takes (queries, keys, values).
const maxGroup = 3

// products computes up to maxGroup products of the same activations x (n
// rows), as product does for each: a block's queries, keys and values, or
// its gate and up projections. The activations are quantized (or packed)
// once, and the rows of every matrix are one loop for the pool, which cuts
// the hand-offs of a decoding step. Each output is computed exactly as
// product computes it.
func (mm *matmuls) products(x []float32, n int, ps ...prod) {
	if n == 0 || len(ps) == 0 {
		return
	}
	same := len(ps) <= maxGroup && mm.pool.n > 1
	for _, p := range ps[1:] {
		same = same && p.w.typ == ps[0].w.typ && p.w.cols == ps[0].w.cols
	}
	if !same {
		for _, p := range ps {
			mm.product(p.dst, p.w, x, n)
		}
		return
	}
	var cs [maxGroup]*mmCall
	for i, p := range ps {
		var shared *mmCall
		if i > 0 {
			shared = cs[0]
		}
		cs[i] = mm.prepare(p.dst, p.w, x, n, shared)
	}
	g := &cs[0].group // concurrent forward calls each have their own
	total := 0
	for i, c := range cs[:len(ps)] {
		g.c[i] = c
		g.chunk[i] = mm.chunkRows(c.w, c.n)
		total += (c.w.rows + g.chunk[i] - 1) / g.chunk[i]
		g.end[i] = total
	}
	mm.pool.run(total, 1, g)
	// g lives in cs[0]: clear it before cs[0] goes back to the scratch pool.
	g.c = [maxGroup]*mmCall{}
	for i := range ps {
		mm.finish(cs[i])
	}
}

// groupTask runs the row chunks of several products as one loop: items
// [end[i-1], end[i]) are product i's chunks.
type groupTask struct {
	c     [maxGroup]*mmCall
	chunk [maxGroup]int
	end   [maxGroup]int
}

func (g *groupTask) run(part, lo, hi int) {
	k := 0
	for i := lo; i < hi; i++ {
		for i >= g.end[k] {
			k++
		}
		j := i
		if k > 0 {
			j -= g.end[k-1]
		}
		c := g.c[k]
		c.run(part, j*g.chunk[k], min((j+1)*g.chunk[k], c.w.rows))
	}
}

// prepare readies a product for the pool: the quantized activations (or,
// given shared, those of another product of the same activations and
// weight type) and the view of float32 weights.
func (mm *matmuls) prepare(dst []float32, w *cpuMatrix, x []float32, n int, shared *mmCall) *mmCall {
	c, _ := mm.scratch.Get().(*mmCall)
	if c == nil {
		c = new(mmCall)
	}
	c.w, c.dst, c.x, c.xq, c.n = w, dst[:n*w.rows], x[:n*w.cols], nil, n

	if kq, xRow, ok := quantized(w); ok {
		if shared != nil {
			c.xq = shared.xq
		} else {
			// Quantize every token's activations once, before the rows
			// are split, in parallel by tokens for a long prompt.
			c.qbuf = growBytes(c.qbuf, n*xRow)
			act, _ := vec.ActivationType(w.typ)
			c.quan = quantizeTask{x: c.x, xq: c.qbuf, cols: w.cols, xRow: xRow, kquan: kq, q81: act == quant.Q8_1}
			mm.pool.run(n, max(1, (n+mm.pool.n-1)/mm.pool.n), &c.quan)
			c.quan.x = nil
			c.xq = c.qbuf
		}
	} else if w.typ == quant.F32 || w.typ == quant.F16 || w.typ == quant.BF16 {
		if halfRounding(w.typ) {
			mm.roundActivations(c, shared)
		}
		// Pack the tokens for the kernels once, not once per row chunk.
		if shared != nil && shared.xp != nil {
			c.xp = shared.xp
		} else if l := vec.PackLen(w.cols, n); l > 0 {
			c.pbuf = growF32(c.pbuf, l)
			vec.Pack(c.pbuf, c.x, w.cols, n)
			c.xp = c.pbuf
		}
	}
	return c
}

// finish recycles the call's scratch space.
func (mm *matmuls) finish(c *mmCall) {
	c.w, c.dst, c.x, c.xq, c.xp = nil, nil, nil, nil, nil
	mm.scratch.Put(c)
}

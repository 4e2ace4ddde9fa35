package kernels

import (
	"github.com/baton-serving/baton/kernels/quant"
	"github.com/baton-serving/baton/kernels/vec"
)

// Products with F16 and BF16 weights multiply the activations rounded to
// the weights' type, as llama.cpp does: ggml's CPU backend converts the
// float32 activations to the vec_dot_type of the weights before a product
// (F16 for F16 weights, BF16 for BF16 weights; ggml_compute_forward_mul_mat
// and llamafile's tinyBLAS alike), rounding to nearest even. Computing
// with the unrounded activations is slightly more accurate, but it made
// greedy generations of random-weight F16 files part from llama.cpp's
// within a few tokens; F16 and BF16 files are common among the published
// ones, and giving their users llama.cpp's tokens matters more than the
// 11th (8th) bit of each activation.
//
// The rounding is elementwise and done once per product (or group of
// products of the same activations), before the rows are split, so a
// token's result still does not depend on its batch or the thread count.

// halfRounding reports whether products with weights of type typ take
// rounded activations.
func halfRounding(typ quant.Type) bool { return typ == quant.F16 || typ == quant.BF16 }

// roundTask rounds token rows of activations to F16 or BF16 precision.
type roundTask struct {
	x, dst []float32
	cols   int
	bf16   bool
}

func (r *roundTask) run(_, lo, hi int) {
	x, dst := r.x[lo*r.cols:hi*r.cols], r.dst[lo*r.cols:hi*r.cols]
	if r.bf16 {
		vec.RoundBF16(dst, x)
	} else {
		vec.RoundF16(dst, x)
	}
}

// roundActivations points c.x at c's n rows of activations rounded for
// c.w's type, computed in parallel by tokens for a long prompt, or taken
// from shared (another product of the same activations and weight type).
func (mm *matmuls) roundActivations(c *mmCall, shared *mmCall) {
	if shared != nil {
		c.x = shared.x
		return
	}
	c.rbuf = growF32(c.rbuf, len(c.x))
	c.round = roundTask{x: c.x, dst: c.rbuf, cols: c.w.cols, bf16: c.w.typ == quant.BF16}
	mm.pool.run(c.n, max(1, (c.n+mm.pool.n-1)/mm.pool.n), &c.round)
	c.round = roundTask{}
	c.x = c.rbuf
}

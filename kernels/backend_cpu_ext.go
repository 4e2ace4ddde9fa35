package kernels

import (
	"fmt"
)

// The CPU backend's ExtendedOps: the element-wise operations are this
// package's reference operations (ops_ext.go) split over the pool in
// blocks; AttentionWith is Attention's kernel with the options.

// extBlock is the number of elements of an element-wise operation that
// stand in for a row when it is split over the pool.
const extBlock = 1024

// eachBlock calls fn over [0, n) in blocks of extBlock elements, split
// across the pool when there are many.
func (c *CPU) eachBlock(n int, fn func(lo, hi int)) {
	c.eachRow((n+extBlock-1)/extBlock, func(lo, hi int) {
		fn(lo*extBlock, min(hi*extBlock, n))
	})
}

// aliasOrApart reports whether an element-wise operation that writes d
// while reading x, split over the pool in blocks, may run: d is x, or the
// two do not overlap. At an offset, one block would read what another
// block had already written, or was writing at the same time.
func aliasOrApart(d, x []float32) bool {
	return !overlap(d, x) || (len(d) == len(x) && &d[0] == &x[0])
}

// GELUMul implements ExtendedOps with [GELUMul]: ggml's binary16 table.
func (c *CPU) GELUMul(dst, gate, up Buffer) error {
	if err := c.enter(); err != nil {
		return err
	}
	defer c.leave()
	ops, err := c.bufs("gelu·mul", dst, gate, up)
	if err != nil {
		return err
	}
	d, g, u := ops[0], ops[1], ops[2]
	if err := CheckGELUMul(len(d), len(g), len(u)); err != nil {
		return err
	}
	if !aliasOrApart(d, g) || !aliasOrApart(d, u) {
		return fmt.Errorf("%w: gelu·mul output overlaps an input without being it", ErrShape)
	}
	c.eachBlock(len(d), func(lo, hi int) { GELUMul(d[lo:hi], g[lo:hi], u[lo:hi]) })
	return nil
}

// Scale implements ExtendedOps.
func (c *CPU) Scale(dst, x Buffer, s float32) error {
	if err := c.enter(); err != nil {
		return err
	}
	defer c.leave()
	ops, err := c.bufs("scale", dst, x)
	if err != nil {
		return err
	}
	d, xs := ops[0], ops[1]
	if err := CheckScale(len(d), len(xs)); err != nil {
		return err
	}
	if !aliasOrApart(d, xs) {
		return fmt.Errorf("%w: scale output overlaps its input without being it", ErrShape)
	}
	c.eachBlock(len(d), func(lo, hi int) {
		for i, v := range xs[lo:hi] {
			d[lo+i] = s * v
		}
	})
	return nil
}

// SoftCap implements ExtendedOps with [SoftCap].
func (c *CPU) SoftCap(x Buffer, cap float32) error {
	if err := c.enter(); err != nil {
		return err
	}
	defer c.leave()
	xs, err := c.buf(x, "soft-cap operand")
	if err != nil {
		return err
	}
	if err := CheckSoftCap(cap); err != nil {
		return err
	}
	c.eachBlock(len(xs), func(lo, hi int) { SoftCap(xs[lo:hi], cap) })
	return nil
}

var _ ExtendedOps = (*CPU)(nil)

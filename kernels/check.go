package kernels

import (
	"fmt"
	"math"

	"github.com/baton-serving/baton/kernels/quant"
)

// The Check functions below validate the operands of Backend methods by
// their sizes alone, so that every backend rejects the same calls with the
// same errors. Each returns nil or an error wrapping ErrShape (or
// ErrUnsupported).

// CheckMatMul checks a MatMul of a rows×cols matrix with x and dst of the
// given lengths, and returns the token count.
func CheckMatMul(rows, cols, dstLen, xLen int) (tokens int, err error) {
	if cols <= 0 || xLen%cols != 0 {
		return 0, fmt.Errorf("%w: matmul activations of %d elements are not rows of %d", ErrShape, xLen, cols)
	}
	tokens = xLen / cols
	if want, ok := mulOK(tokens, rows); !ok || dstLen != want {
		return 0, fmt.Errorf("%w: matmul of %d×%d by %d tokens writes %d elements, dst has %d", ErrShape, rows, cols, tokens, tokens*rows, dstLen)
	}
	return tokens, nil
}

// CheckMatrix checks a weight matrix of rows×cols elements of typ stored
// in n bytes, and returns the bytes per row.
func CheckMatrix(typ quant.Type, rows, cols, n int) (rowBytes int, err error) {
	if !typ.Supported() {
		return 0, fmt.Errorf("%w: weight type %s", ErrUnsupported, typ)
	}
	if rows <= 0 || cols <= 0 {
		return 0, fmt.Errorf("%w: weight matrix of %d×%d", ErrShape, rows, cols)
	}
	rb, err := quant.RowBytes(typ, uint64(cols))
	if err != nil {
		return 0, fmt.Errorf("%w: %w", ErrShape, err)
	}
	if rb > math.MaxInt32 {
		return 0, fmt.Errorf("%w: %s rows of %d elements are too long", ErrShape, typ, cols)
	}
	if want, ok := mulOK(rows, int(rb)); !ok || n != want {
		return 0, fmt.Errorf("%w: %d×%d %s weights take %d bytes, got %d", ErrShape, rows, cols, typ, uint64(rows)*rb, n)
	}
	return int(rb), nil
}

// CheckEmbed checks an Embed of len(ids) rows from a matrix of rows×cols.
func CheckEmbed(rows, cols, dstLen int, ids []int32) error {
	if want, ok := mulOK(len(ids), cols); !ok || dstLen != want {
		return fmt.Errorf("%w: embedding %d tokens of %d elements into %d", ErrShape, len(ids), cols, dstLen)
	}
	for i, id := range ids {
		if id < 0 || int(id) >= rows {
			return fmt.Errorf("%w: token id %d (index %d) outside [0, %d)", ErrShape, id, i, rows)
		}
	}
	return nil
}

// CheckRMSNorm checks an RMSNorm of x with weight into dst.
func CheckRMSNorm(dstLen, xLen, wLen int) error {
	if wLen <= 0 || xLen%wLen != 0 || dstLen != xLen {
		return fmt.Errorf("%w: rmsnorm of %d elements in rows of %d into %d", ErrShape, xLen, wLen, dstLen)
	}
	return nil
}

// CheckRope checks a Rope over x with tables cos and sin, and returns the
// heads per row and the rotated pairs per head.
func CheckRope(xLen, cosLen, sinLen, rows, headDim int) (heads, half int, err error) {
	if rows <= 0 || headDim <= 0 || cosLen != sinLen || cosLen%rows != 0 {
		return 0, 0, fmt.Errorf("%w: rope of %d rows with tables of %d and %d", ErrShape, rows, cosLen, sinLen)
	}
	half = cosLen / rows
	rowLen, ok := mulOK(rows, headDim)
	if !ok || half == 0 || 2*half > headDim || xLen%rowLen != 0 || xLen == 0 {
		return 0, 0, fmt.Errorf("%w: rope of %d pairs on %d elements in %d rows of heads of %d", ErrShape, half, xLen, rows, headDim)
	}
	return xLen / rowLen, half, nil
}

// CheckSoftmax checks a Softmax of x in rows rows, and returns the row
// length.
func CheckSoftmax(xLen, rows int) (cols int, err error) {
	if rows <= 0 || xLen%rows != 0 {
		return 0, fmt.Errorf("%w: softmax of %d elements in %d rows", ErrShape, xLen, rows)
	}
	return xLen / rows, nil
}

// CheckSiLUMul checks a SiLUMul.
func CheckSiLUMul(dstLen, gateLen, upLen int) error {
	if gateLen != dstLen || upLen != dstLen {
		return fmt.Errorf("%w: silu·mul of %d and %d elements into %d", ErrShape, gateLen, upLen, dstLen)
	}
	return nil
}

// CheckAdd checks an Add.
func CheckAdd(dstLen, aLen, bLen int) error {
	if dstLen != aLen || (aLen > 0 && (bLen <= 0 || aLen%bLen != 0)) {
		return fmt.Errorf("%w: add of %d and %d elements into %d", ErrShape, aLen, bLen, dstLen)
	}
	return nil
}

// CheckStoreKV checks a StoreKV into a cache of pages pages of layout l.
func CheckStoreKV(l KVLayout, pages, layer int, slots []int32, kLen, vLen int) error {
	if layer < 0 || layer >= l.Layers {
		return fmt.Errorf("%w: layer %d of %d", ErrShape, layer, l.Layers)
	}
	if want := len(slots) * l.RowElems(); kLen != want || vLen != want {
		return fmt.Errorf("%w: storing %d KV rows of %d needs %d keys and values, got %d and %d",
			ErrShape, len(slots), l.RowElems(), want, kLen, vLen)
	}
	limit := int64(pages) * int64(l.PageSize)
	for i, s := range slots {
		if s < 0 || int64(s) >= limit {
			return fmt.Errorf("%w: KV slot %d (row %d) outside [0, %d)", ErrShape, s, i, limit)
		}
	}
	return nil
}

// CheckAttention checks an Attention over a cache of pages pages of
// layout l, and returns the query heads per row.
func CheckAttention(l KVLayout, pages, layer, outLen, qLen int, rows []AttnRow) (heads int, err error) {
	return CheckAttentionWith(l, pages, layer, outLen, qLen, rows, AttnOptions{})
}

// CheckAttnOptions checks the options of an AttentionWith: a finite
// Scale, a SoftCap that is 0 (off) or a valid [CheckSoftCap] cap, a Window
// that is not negative (0 is off).
func CheckAttnOptions(o AttnOptions) error {
	if !finite(o.Scale) || (o.SoftCap != 0 && CheckSoftCap(o.SoftCap) != nil) || o.Window < 0 {
		return fmt.Errorf("%w: attention options scale %v, soft-cap %v, window %d", ErrShape, o.Scale, o.SoftCap, o.Window)
	}
	return nil
}

// WindowStart is the first position a row of n positions attends to with
// a sliding window of w positions (0: no window).
func WindowStart(n, w int) int {
	if w <= 0 {
		return 0
	}
	return max(0, n-w)
}

// CheckAttentionWith checks an AttentionWith over a cache of pages pages
// of layout l, and returns the query heads per row. Only the pages that
// hold a row's window need to be valid: those wholly before it are not
// read, so their ids are not checked.
func CheckAttentionWith(l KVLayout, pages, layer, outLen, qLen int, rows []AttnRow, o AttnOptions) (heads int, err error) {
	if err := CheckAttnOptions(o); err != nil {
		return 0, err
	}
	if layer < 0 || layer >= l.Layers {
		return 0, fmt.Errorf("%w: layer %d of %d", ErrShape, layer, l.Layers)
	}
	if len(rows) == 0 {
		if qLen != 0 || outLen != 0 {
			return 0, fmt.Errorf("%w: attention of no rows with %d queries", ErrShape, qLen)
		}
		return 0, nil
	}
	per, ok := mulOK(len(rows), l.HeadDim)
	if !ok || qLen%per != 0 || outLen != qLen {
		return 0, fmt.Errorf("%w: attention of %d rows of heads of %d with %d queries into %d", ErrShape, len(rows), l.HeadDim, qLen, outLen)
	}
	heads = qLen / per
	if heads == 0 || heads%l.KVHeads != 0 {
		return 0, fmt.Errorf("%w: %d query heads for %d KV heads", ErrShape, heads, l.KVHeads)
	}
	for i, r := range rows {
		if r.Len <= 0 || r.Len > len(r.Pages)*l.PageSize {
			return 0, fmt.Errorf("%w: attention row %d over %d positions with %d pages of %d", ErrShape, i, r.Len, len(r.Pages), l.PageSize)
		}
		for _, p := range r.Pages[WindowStart(r.Len, o.Window)/l.PageSize : (r.Len+l.PageSize-1)/l.PageSize] {
			if p < 0 || int(p) >= pages {
				return 0, fmt.Errorf("%w: attention row %d reads page %d of %d", ErrShape, i, p, pages)
			}
		}
	}
	return heads, nil
}

// CheckGELUMul checks a GELUMul.
func CheckGELUMul(dstLen, gateLen, upLen int) error {
	if gateLen != dstLen || upLen != dstLen {
		return fmt.Errorf("%w: gelu·mul of %d and %d elements into %d", ErrShape, gateLen, upLen, dstLen)
	}
	return nil
}

// CheckScale checks a Scale.
func CheckScale(dstLen, xLen int) error {
	if dstLen != xLen {
		return fmt.Errorf("%w: scaling %d elements into %d", ErrShape, xLen, dstLen)
	}
	return nil
}

// CheckSoftCap checks a SoftCap's cap, which must be finite and > 0, with
// a finite float32 reciprocal (c ≥ about 2.9e-39): c·tanh(x·(1/c)) would
// otherwise turn x = 0 into 0·Inf = NaN.
func CheckSoftCap(c float32) error {
	if !finite(c) || c <= 0 || !finite(1/c) {
		return fmt.Errorf("%w: soft-cap %v, want a finite value > 0 with a finite reciprocal", ErrShape, c)
	}
	return nil
}

func finite(x float32) bool { return !math.IsNaN(float64(x)) && !math.IsInf(float64(x), 0) }

// CheckKVPageIO checks an ExportKV or ImportKV of n bytes.
func CheckKVPageIO(l KVLayout, pages, page, layer, n int) error {
	switch {
	case page < 0 || page >= pages:
		return fmt.Errorf("%w: KV page %d of %d", ErrShape, page, pages)
	case layer < 0 || layer >= l.Layers:
		return fmt.Errorf("%w: layer %d of %d", ErrShape, layer, l.Layers)
	case n != 2*l.BlockBytes():
		return fmt.Errorf("%w: one layer of a KV page is %d bytes, got %d", ErrShape, 2*l.BlockBytes(), n)
	}
	return nil
}

// mulOK returns a·b for non-negative a and b, or false when either is
// negative or the product overflows.
func mulOK(a, b int) (int, bool) {
	if a < 0 || b < 0 || (b != 0 && a > math.MaxInt/b) {
		return 0, false
	}
	return a * b, true
}

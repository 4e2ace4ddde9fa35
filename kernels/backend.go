package kernels

import (
	"errors"
	"fmt"
	"math"
	"sync"

	"github.com/baton-serving/baton/kernels/quant"
)

// Backend is one implementation of the operations of a transformer forward
// pass: weight products for every weight type, RMSNorm, RoPE, softmax,
// SiLU·mul, residual adds, and attention over a paged KV cache with the
// copies into and out of it. [CPU] runs them on this machine's cores; the
// kernels/cuda module runs them on an NVIDIA GPU.
//
// Operands live in the backend's own memory: activations in [Buffer]s of
// float32, weights in [Matrix] values uploaded once, keys and values in a
// [KVCache]. A forward pass moves the token embeddings in and the logits
// out ([Backend.Write], [Backend.Read]); everything between stays where
// the backend keeps it, which for a GPU is what makes it fast.
//
// Every method checks its operands' shapes and ownership and returns an
// error wrapping [ErrShape] or [ErrForeign] instead of touching memory
// outside them; none panics on a bad shape. A backend may run operations
// asynchronously: an error from the execution of an operation (not from
// its arguments) may then be returned by a later call, at the latest by
// [Backend.Sync] or [Backend.Read]. Buffers written by an operation may be
// passed to the next one at once; the backend orders them.
//
// A Backend is safe for concurrent use by several goroutines as long as
// concurrent operations do not write memory that another of them reads or
// writes.
type Backend interface {
	// Name describes the backend and its device, e.g. "cpu (avx512, 2
	// threads)".
	Name() string

	// Alloc returns a zeroed buffer of n float32s.
	Alloc(n int) (Buffer, error)
	// Free releases a buffer returned by Alloc. Slices of it must not be
	// used afterwards; freeing a slice rather than the buffer is an error.
	Free(b Buffer) error
	// Write copies src into dst; len(src) must be dst.Len().
	Write(dst Buffer, src []float32) error
	// Read copies src into dst once every operation before it that writes
	// src is done; len(dst) must be src.Len().
	Read(dst []float32, src Buffer) error
	// Copy copies src into dst, which must have the same length; the two
	// may overlap.
	Copy(dst, src Buffer) error

	// LoadMatrix makes a weight matrix of rows×cols elements of type typ
	// from data, stored row-major in ggml's byte layout
	// (quant.RowBytes(typ, cols) bytes per row). The backend may keep
	// data (the CPU backend computes from it in place) or copy it (a GPU
	// uploads it): the caller must leave data unchanged while the matrix
	// is in use. Types the backend cannot compute with give an error
	// wrapping [ErrUnsupported].
	LoadMatrix(typ quant.Type, rows, cols int, data []byte) (Matrix, error)
	// FreeMatrix releases a matrix from LoadMatrix.
	FreeMatrix(m Matrix) error

	// MatMul multiplies w by the tokens = x.Len()/w.Cols() activation rows
	// of x: dst[t·w.Rows() + r] = Σ_k w[r][k]·x[t·w.Cols() + k]. dst has
	// tokens·w.Rows() elements. A token's result does not depend on how
	// many tokens are multiplied together.
	MatMul(dst Buffer, w Matrix, x Buffer) error
	// Embed writes row ids[i] of w, converted to float32, to row i of dst
	// (len(ids) rows of w.Cols()): the token embedding lookup. An id
	// outside [0, w.Rows()) is an error.
	Embed(dst Buffer, w Matrix, ids []int32) error
	// RMSNorm normalizes each row of x (rows of weight.Len() elements) as
	// [RMSNorm] does, writing dst; dst may be x.
	RMSNorm(dst, x, weight Buffer, eps float32) error
	// Rope rotates rows rows of heads of headDim elements in x, in place,
	// as [Rope] does: row r uses the r-th row of cos and sin, each
	// cos.Len()/rows elements, from [RopeTable]; heads is
	// x.Len()/(rows·headDim).
	Rope(x, cos, sin Buffer, rows, headDim int, layout RopeLayout) error
	// Softmax replaces each of the rows rows of x by its softmax.
	Softmax(x Buffer, rows int) error
	// SiLUMul writes silu(gate[i])·up[i] to dst; dst may be gate or up.
	SiLUMul(dst, gate, up Buffer) error
	// Add writes a[i] + b[i mod b.Len()] to dst: a residual add when b is
	// as long as a, a bias added to every row when b is one row.
	// a.Len() must be a multiple of b.Len(); dst may be a or b.
	Add(dst, a, b Buffer) error

	// NewKVCache allocates a paged KV cache of pages pages of layout l,
	// zeroed.
	NewKVCache(l KVLayout, pages int) (KVCache, error)
	// FreeKVCache releases a cache from NewKVCache.
	FreeKVCache(kv KVCache) error
	// StoreKV writes len(slots) rows of keys and values (each
	// Layout().RowElems() elements of k and v, converted to the cache's
	// element type) into layer of kv: row i goes to position slot
	// slots[i] % PageSize of page slots[i] / PageSize.
	StoreKV(kv KVCache, layer int, slots []int32, k, v Buffer) error
	// Attention computes causal attention of len(rows) query rows. Row i
	// of q holds heads heads of HeadDim elements (heads =
	// q.Len()/(len(rows)·HeadDim), a multiple of KVHeads), and attends to
	// positions 0…rows[i].Len-1 of its sequence, whose pages in position
	// order are rows[i].Pages, in layer of kv; query head h reads KV head
	// h/(heads/KVHeads). Scores are scaled by 1/√HeadDim. out has q's
	// shape.
	Attention(out, q Buffer, kv KVCache, layer int, rows []AttnRow) error
	// ExportKV copies one layer of page page to dst: the page's keys then
	// its values in that layer, 2·Layout().BlockBytes() bytes laid out as
	// [KVLayout] describes.
	ExportKV(dst []byte, kv KVCache, page, layer int) error
	// ImportKV is the reverse of ExportKV: it overwrites one layer of a
	// page with src.
	ImportKV(kv KVCache, page, layer int, src []byte) error
	// CopyKVPage copies every layer of page src to page dst.
	CopyKVPage(kv KVCache, dst, src int) error

	// Sync waits for every operation issued so far and returns the first
	// error of their execution, if any.
	Sync() error
	// Close releases everything the backend allocated. Nothing may be
	// used afterwards.
	Close() error
}

// Buffer is a run of float32 values in a backend's memory: an allocation
// or a slice of one.
type Buffer interface {
	// Len is the number of elements.
	Len() int
	// Slice returns elements lo…hi-1, sharing memory with the buffer.
	// Like a slice expression, it panics unless 0 ≤ lo ≤ hi ≤ Len(): the
	// bounds come from the model's shapes, never from input.
	Slice(lo, hi int) Buffer
}

// Matrix is a weight matrix in a backend's memory.
type Matrix interface {
	Type() quant.Type
	Rows() int
	Cols() int
}

// KVCache is a paged KV cache in a backend's memory.
type KVCache interface {
	Layout() KVLayout
	Pages() int
}

// AttnRow is what one query row attends to in [Backend.Attention].
type AttnRow struct {
	// Pages is the row's sequence's block table: the ids of its pages in
	// position order. Rows of one sequence share it.
	Pages []int32
	// Len is the number of positions attended to, 0…Len-1; the pages must
	// cover them.
	Len int
}

// Errors that backends wrap.
var (
	// ErrShape reports operands whose sizes do not fit together, or
	// indices (token ids, pages, slots, layers) outside their range.
	ErrShape = errors.New("kernels: shape mismatch")
	// ErrForeign reports an operand that another backend (or another
	// instance) allocated, or one already freed.
	ErrForeign = errors.New("kernels: operand not owned by this backend")
	// ErrUnsupported reports a type or layout the backend cannot compute
	// with.
	ErrUnsupported = errors.New("kernels: unsupported by this backend")
	// ErrClosed reports use of a closed backend.
	ErrClosed = errors.New("kernels: backend closed")
)

// Upload allocates a buffer on b holding a copy of src.
func Upload(b Backend, src []float32) (Buffer, error) {
	buf, err := b.Alloc(len(src))
	if err != nil {
		return nil, err
	}
	if err := b.Write(buf, src); err != nil {
		return nil, errors.Join(err, b.Free(buf))
	}
	return buf, nil
}

// KVLayout is the shape of a paged KV cache's pages. A page is one
// contiguous byte range of PageBytes() bytes holding, layer by layer, the
// keys and then the values of PageSize consecutive positions:
//
//	page = K(layer 0) V(layer 0) K(layer 1) V(layer 1) … K(L-1) V(L-1)
//
// and each K or V block (BlockBytes() bytes) is
// [position 0…PageSize-1][kv head 0…KVHeads-1][0…HeadDim-1] elements of
// DType (F32 or F16), little-endian. It is the layout of engine/kvcache,
// so that pages move between a backend and the KV transfer unchanged.
type KVLayout struct {
	Layers   int
	KVHeads  int
	HeadDim  int
	PageSize int        // positions per page
	DType    quant.Type // quant.F32 or quant.F16
}

// maxKVDim bounds every dimension of a KVLayout.
const maxKVDim = 1 << 16

// Validate checks that every dimension is in [1, 65536], that DType is F32
// or F16 and that a page fits in 2 GiB; the error wraps ErrShape.
func (l KVLayout) Validate() error {
	for _, d := range [...]struct {
		name string
		v    int
	}{{"layers", l.Layers}, {"KV heads", l.KVHeads}, {"head dimension", l.HeadDim}, {"page size", l.PageSize}} {
		if d.v <= 0 || d.v > maxKVDim {
			return fmt.Errorf("%w: KV layout with %s %d, want [1, %d]", ErrShape, d.name, d.v, maxKVDim)
		}
	}
	if KVElemSize(l.DType) == 0 {
		return fmt.Errorf("%w: KV element type %s, want F32 or F16", ErrUnsupported, l.DType)
	}
	if uint64(l.PageSize)*uint64(l.Layers)*uint64(l.KVHeads)*uint64(l.HeadDim)*8 > math.MaxInt32 {
		return fmt.Errorf("%w: a page of %d positions × %d layers × %d KV heads × %d would exceed 2 GiB",
			ErrShape, l.PageSize, l.Layers, l.KVHeads, l.HeadDim)
	}
	return nil
}

// RowElems is the number of elements of one position's keys (or values)
// in one layer: every KV head side by side.
func (l KVLayout) RowElems() int { return l.KVHeads * l.HeadDim }

// RowBytes is the byte size of one position's keys (or values) in one
// layer.
func (l KVLayout) RowBytes() int { return l.RowElems() * KVElemSize(l.DType) }

// BlockBytes is the byte size of one page's keys (or values) in one layer.
func (l KVLayout) BlockBytes() int { return l.PageSize * l.RowBytes() }

// PageBytes is the byte size of a whole page.
func (l KVLayout) PageBytes() int { return 2 * l.Layers * l.BlockBytes() }

// LayerOffset is the offset of layer's keys in a page; its values follow
// BlockBytes() later.
func (l KVLayout) LayerOffset(layer int) int { return 2 * layer * l.BlockBytes() }

// CheckKVPages checks that a cache of pages pages of layout l can be
// addressed: l is valid and pages·PageBytes() fits in an int64 and in
// the int32 slot numbers of [Backend.StoreKV].
func CheckKVPages(l KVLayout, pages int) error {
	if err := l.Validate(); err != nil {
		return err
	}
	if pages <= 0 || pages > math.MaxInt32/l.PageSize || int64(pages) > math.MaxInt64/int64(l.PageBytes()) {
		return fmt.Errorf("%w: %d KV pages of %d positions, want [1, %d]", ErrShape, pages, l.PageSize, math.MaxInt32/l.PageSize)
	}
	return nil
}

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
		for _, p := range r.Pages[:(r.Len+l.PageSize-1)/l.PageSize] {
			if p < 0 || int(p) >= pages {
				return 0, fmt.Errorf("%w: attention row %d reads page %d of %d", ErrShape, i, p, pages)
			}
		}
	}
	return heads, nil
}

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

// Product is one weight product of [MatMuls]: Dst = W·x.
type Product struct {
	Dst Buffer
	W   Matrix
}

// ProductGrouper is implemented by backends that run several products of
// the same activations together, faster than one by one.
type ProductGrouper interface {
	// MatMuls computes each product as [Backend.MatMul] does, with the
	// same results.
	MatMuls(x Buffer, ps ...Product) error
}

// MatMuls computes Dst = W·x for each product on b: together where b is
// a [ProductGrouper], else one [Backend.MatMul] at a time. The results
// are the same either way.
func MatMuls(b Backend, x Buffer, ps ...Product) error {
	if g, ok := b.(ProductGrouper); ok {
		return g.MatMuls(x, ps...)
	}
	for _, p := range ps {
		if err := b.MatMul(p.Dst, p.W, x); err != nil {
			return err
		}
	}
	return nil
}

// HostKV is implemented by backends that compute on host memory, and so
// can work on a KV cache's pages where they already are (an engine page
// pool, a contiguous cache) instead of a copy.
type HostKV interface {
	// WrapKV returns a KV cache over data itself, whole pages of layout
	// l: operations on it read and write data.
	WrapKV(l KVLayout, data []byte) (KVCache, error)
}

// HostView keeps one backend's handle on KV pages in host memory, so
// that asking again costs a comparison: the engine's page pool and its
// contiguous cache each hold one. It is safe for concurrent use.
type HostView struct {
	mu sync.Mutex
	b  Backend
	kv KVCache
}

// On returns b's handle on data, whole pages of layout l, wrapping it on
// first use and again when another backend asks. A backend that is not a
// [HostKV] gives an error wrapping ErrUnsupported.
func (v *HostView) On(b Backend, l KVLayout, data []byte) (KVCache, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.b == b && v.kv != nil {
		return v.kv, nil
	}
	h, ok := b.(HostKV)
	if !ok {
		return nil, fmt.Errorf("%w: backend %s cannot compute on KV pages in host memory", ErrUnsupported, b.Name())
	}
	kv, err := h.WrapKV(l, data)
	if err != nil {
		return nil, err
	}
	v.b, v.kv = b, kv
	return kv, nil
}

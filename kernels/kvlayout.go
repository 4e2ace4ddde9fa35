package kernels

import (
	"fmt"
	"math"

	"github.com/baton-serving/baton/kernels/quant"
)

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

// ElemSize is the byte size of one stored element: 4 for F32, 2 for F16,
// 0 for a type a KV cache cannot hold.
func (l KVLayout) ElemSize() int { return KVElemSize(l.DType) }

// RowElems is the number of elements of one position's keys (or values)
// in one layer: every KV head side by side.
func (l KVLayout) RowElems() int { return l.KVHeads * l.HeadDim }

// RowBytes is the byte size of one position's keys (or values) in one
// layer.
func (l KVLayout) RowBytes() int { return l.RowElems() * l.ElemSize() }

// BlockBytes is the byte size of one page's keys (or values) in one layer.
func (l KVLayout) BlockBytes() int { return l.PageSize * l.RowBytes() }

// PageBytes is the byte size of a whole page.
func (l KVLayout) PageBytes() int { return 2 * l.Layers * l.BlockBytes() }

// LayerOffset is the offset of layer's keys in a page; its values follow
// BlockBytes() later.
func (l KVLayout) LayerOffset(layer int) int { return 2 * layer * l.BlockBytes() }

// PagesFor returns the number of pages that hold positions 0 … tokens-1.
func (l KVLayout) PagesFor(tokens int) int {
	if tokens <= 0 || l.PageSize <= 0 {
		return 0
	}
	return (tokens + l.PageSize - 1) / l.PageSize
}

// String describes the layout completely, e.g. "F16 pages of 16 positions ×
// 12 layers × K,V × [12 kv heads × 64] (page 294912 bytes)": both ends of
// a KV transfer must agree on it.
func (l KVLayout) String() string {
	return fmt.Sprintf("%s pages of %d positions × %d layers × K,V × [%d kv heads × %d] (page %d bytes)",
		l.DType, l.PageSize, l.Layers, l.KVHeads, l.HeadDim, l.PageBytes())
}

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

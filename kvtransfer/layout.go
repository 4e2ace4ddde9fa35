package kvtransfer

import (
	"fmt"
	"hash/crc32"

	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
)

// Layout is how a worker stores its KV cache. Both ends of a transfer must
// hold the same layout, field for field.
type Layout struct {
	DType      batonv1.KVDataType
	PageTokens int
	Layers     int
	KVHeads    int
	HeadDim    int
}

// LayoutFromProto converts and validates a wire layout.
func LayoutFromProto(p *batonv1.KVLayout) (Layout, error) {
	l := Layout{
		DType:      p.GetDtype(),
		PageTokens: int(p.GetPageSizeTokens()),
		Layers:     int(p.GetNumLayers()),
		KVHeads:    int(p.GetNumKvHeads()),
		HeadDim:    int(p.GetHeadDim()),
	}
	return l, l.Validate()
}

// Proto is the wire form of l.
func (l Layout) Proto() *batonv1.KVLayout {
	return &batonv1.KVLayout{
		Dtype:          l.DType,
		PageSizeTokens: uint32(l.PageTokens),
		NumLayers:      uint32(l.Layers),
		NumKvHeads:     uint32(l.KVHeads),
		HeadDim:        uint32(l.HeadDim),
	}
}

// Validate checks that every field is set and sane.
func (l Layout) Validate() error {
	switch {
	case l.ElemBytes() == 0:
		return fmt.Errorf("kv_layout.dtype: %v is not a KV element type", l.DType)
	case l.PageTokens <= 0 || l.PageTokens > 4096:
		return fmt.Errorf("kv_layout.page_size_tokens: %d, want 1-4096", l.PageTokens)
	case l.Layers <= 0 || l.Layers > 1024:
		return fmt.Errorf("kv_layout.num_layers: %d, want 1-1024", l.Layers)
	case l.KVHeads <= 0 || l.KVHeads > 1024:
		return fmt.Errorf("kv_layout.num_kv_heads: %d, want 1-1024", l.KVHeads)
	case l.HeadDim <= 0 || l.HeadDim > 1024:
		return fmt.Errorf("kv_layout.head_dim: %d, want 1-1024", l.HeadDim)
	}
	return nil
}

// Mismatch names the first field in which other differs from l, or returns
// "" when they are equal. The message is meant for FAILED_PRECONDITION.
func (l Layout) Mismatch(other Layout) string {
	switch {
	case l.DType != other.DType:
		return fmt.Sprintf("kv_layout.dtype: this worker stores %v, the peer %v", l.DType, other.DType)
	case l.PageTokens != other.PageTokens:
		return fmt.Sprintf("kv_layout.page_size_tokens: this worker uses %d, the peer %d", l.PageTokens, other.PageTokens)
	case l.Layers != other.Layers:
		return fmt.Sprintf("kv_layout.num_layers: this worker has %d, the peer %d", l.Layers, other.Layers)
	case l.KVHeads != other.KVHeads:
		return fmt.Sprintf("kv_layout.num_kv_heads: this worker has %d, the peer %d", l.KVHeads, other.KVHeads)
	case l.HeadDim != other.HeadDim:
		return fmt.Sprintf("kv_layout.head_dim: this worker has %d, the peer %d", l.HeadDim, other.HeadDim)
	}
	return ""
}

// ElemBytes is the size of one element (0 for an invalid dtype).
func (l Layout) ElemBytes() int {
	switch l.DType {
	case batonv1.KVDataType_KV_DATA_TYPE_F32:
		return 4
	case batonv1.KVDataType_KV_DATA_TYPE_F16:
		return 2
	}
	return 0
}

// TokenBytes is the size of one token's keys (or values) in one layer.
func (l Layout) TokenBytes() int { return l.KVHeads * l.HeadDim * l.ElemBytes() }

// PagesFor is the number of pages that hold n tokens.
func (l Layout) PagesFor(n int) int { return (n + l.PageTokens - 1) / l.PageTokens }

// LayersPerChunk is how many layers of one page go into a chunk so that a
// chunk's K and V together stay within maxBytes (at least one layer). Chunks
// of a few hundred KiB keep gRPC's per-message cost small without holding
// large buffers.
func (l Layout) LayersPerChunk(maxBytes int) int {
	per := 2 * l.PageTokens * l.TokenBytes()
	n := maxBytes / per
	if n < 1 {
		n = 1
	}
	if n > l.Layers {
		n = l.Layers
	}
	return n
}

// castagnoli is CRC-32C, computed with the CPU's CRC instruction where present.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Checksum is the KVChunk checksum: CRC-32C of k followed by v.
func Checksum(k, v []byte) uint32 {
	return crc32.Update(crc32.Checksum(k, castagnoli), castagnoli, v)
}

package kvtransfer

import (
	"fmt"
	"hash/crc32"

	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"github.com/baton-serving/baton/kernels"
	"github.com/baton-serving/baton/kernels/quant"
)

// A transfer's page layout is the engine's own, kernels.KVLayout: both ends
// of a transfer must hold the same layout, field for field, so that pages
// cross unchanged. This file holds only its wire form and the checks the
// wire needs.

// Wire bounds of a layout. They are tighter than the engine's own bounds
// (kernels.KVLayout.Validate): a peer's handshake must not make this worker
// size buffers for absurd pages.
const (
	maxWirePageTokens = 4096
	maxWireDim        = 1024
)

// LayoutFromProto converts and validates a wire layout. Errors name the
// wire field.
func LayoutFromProto(p *batonv1.KVLayout) (kernels.KVLayout, error) {
	dtype, ok := dtypeFromProto(p.GetDtype())
	if !ok {
		return kernels.KVLayout{}, fmt.Errorf("kv_layout.dtype: %v is not a KV element type", p.GetDtype())
	}
	l := kernels.KVLayout{
		DType:    dtype,
		PageSize: int(p.GetPageSizeTokens()),
		Layers:   int(p.GetNumLayers()),
		KVHeads:  int(p.GetNumKvHeads()),
		HeadDim:  int(p.GetHeadDim()),
	}
	switch {
	case l.PageSize <= 0 || l.PageSize > maxWirePageTokens:
		return l, fmt.Errorf("kv_layout.page_size_tokens: %d, want 1-%d", l.PageSize, maxWirePageTokens)
	case l.Layers <= 0 || l.Layers > maxWireDim:
		return l, fmt.Errorf("kv_layout.num_layers: %d, want 1-%d", l.Layers, maxWireDim)
	case l.KVHeads <= 0 || l.KVHeads > maxWireDim:
		return l, fmt.Errorf("kv_layout.num_kv_heads: %d, want 1-%d", l.KVHeads, maxWireDim)
	case l.HeadDim <= 0 || l.HeadDim > maxWireDim:
		return l, fmt.Errorf("kv_layout.head_dim: %d, want 1-%d", l.HeadDim, maxWireDim)
	}
	return l, nil
}

// LayoutProto is the wire form of l.
func LayoutProto(l kernels.KVLayout) *batonv1.KVLayout {
	return &batonv1.KVLayout{
		Dtype:          dtypeProto(l.DType),
		PageSizeTokens: uint32(l.PageSize),
		NumLayers:      uint32(l.Layers),
		NumKvHeads:     uint32(l.KVHeads),
		HeadDim:        uint32(l.HeadDim),
	}
}

// Mismatch names the first field in which peer differs from local, or
// returns "" when they are equal. The message, in wire terms, is meant for
// FAILED_PRECONDITION.
func Mismatch(local, peer kernels.KVLayout) string {
	switch {
	case local.DType != peer.DType:
		return fmt.Sprintf("kv_layout.dtype: this worker stores %v, the peer %v", dtypeProto(local.DType), dtypeProto(peer.DType))
	case local.PageSize != peer.PageSize:
		return fmt.Sprintf("kv_layout.page_size_tokens: this worker uses %d, the peer %d", local.PageSize, peer.PageSize)
	case local.Layers != peer.Layers:
		return fmt.Sprintf("kv_layout.num_layers: this worker has %d, the peer %d", local.Layers, peer.Layers)
	case local.KVHeads != peer.KVHeads:
		return fmt.Sprintf("kv_layout.num_kv_heads: this worker has %d, the peer %d", local.KVHeads, peer.KVHeads)
	case local.HeadDim != peer.HeadDim:
		return fmt.Sprintf("kv_layout.head_dim: this worker has %d, the peer %d", local.HeadDim, peer.HeadDim)
	}
	return ""
}

// dtypeFromProto is the element type of a wire dtype, if a KV cache can
// hold it.
func dtypeFromProto(d batonv1.KVDataType) (quant.Type, bool) {
	switch d {
	case batonv1.KVDataType_KV_DATA_TYPE_F32:
		return quant.F32, true
	case batonv1.KVDataType_KV_DATA_TYPE_F16:
		return quant.F16, true
	}
	return 0, false
}

// dtypeProto is the wire form of a KV element type.
func dtypeProto(t quant.Type) batonv1.KVDataType {
	switch t {
	case quant.F32:
		return batonv1.KVDataType_KV_DATA_TYPE_F32
	case quant.F16:
		return batonv1.KVDataType_KV_DATA_TYPE_F16
	}
	return batonv1.KVDataType_KV_DATA_TYPE_UNSPECIFIED
}

// LayersPerChunk is how many layers of one page go into a chunk of layout l
// so that a chunk's K and V together stay within maxBytes (at least one
// layer). Chunks of a few hundred KiB keep gRPC's per-message cost small
// without holding large buffers.
func LayersPerChunk(l kernels.KVLayout, maxBytes int) int {
	return min(max(maxBytes/(2*l.BlockBytes()), 1), l.Layers)
}

// castagnoli is CRC-32C, computed with the CPU's CRC instruction where present.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Checksum is the KVChunk checksum: CRC-32C of k followed by v.
func Checksum(k, v []byte) uint32 {
	return crc32.Update(crc32.Checksum(k, castagnoli), castagnoli, v)
}

// Package quant describes the tensor storage types of the GGUF/ggml world —
// their ids, block shapes and byte sizes — and converts rows of them to and
// from float32 in plain Go. The plain-Go code is the reference that faster
// kernels are tested against.
package quant

import "fmt"

// Type is a ggml tensor type id as stored in GGUF tensor infos.
type Type uint32

// The ggml type ids. The numbering is part of the GGUF format; ids that ggml
// has retired (4, 5, 31–33, 36–38) are absent.
const (
	F32     Type = 0
	F16     Type = 1
	Q4_0    Type = 2
	Q4_1    Type = 3
	Q5_0    Type = 6
	Q5_1    Type = 7
	Q8_0    Type = 8
	Q8_1    Type = 9
	Q2_K    Type = 10
	Q3_K    Type = 11
	Q4_K    Type = 12
	Q5_K    Type = 13
	Q6_K    Type = 14
	Q8_K    Type = 15
	IQ2_XXS Type = 16
	IQ2_XS  Type = 17
	IQ3_XXS Type = 18
	IQ1_S   Type = 19
	IQ4_NL  Type = 20
	IQ3_S   Type = 21
	IQ2_S   Type = 22
	IQ4_XS  Type = 23
	I8      Type = 24
	I16     Type = 25
	I32     Type = 26
	I64     Type = 27
	F64     Type = 28
	IQ1_M   Type = 29
	BF16    Type = 30
	TQ1_0   Type = 34
	TQ2_0   Type = 35
	MXFP4   Type = 39
)

type typeInfo struct {
	name       string
	blockSize  int // elements per block
	blockBytes int // bytes per block
	supported  bool
}

// types lists every id a GGUF file may carry, so that a reader can validate the
// sizes of tensors it will never compute with. supported marks the ones Baton's
// kernels implement.
var types = map[Type]typeInfo{
	F32:     {"F32", 1, 4, true},
	F16:     {"F16", 1, 2, true},
	Q4_0:    {"Q4_0", 32, 18, true},
	Q4_1:    {"Q4_1", 32, 20, true},
	Q5_0:    {"Q5_0", 32, 22, true},
	Q5_1:    {"Q5_1", 32, 24, true},
	Q8_0:    {"Q8_0", 32, 34, true},
	Q8_1:    {"Q8_1", 32, 36, false},
	Q2_K:    {"Q2_K", 256, 84, true},
	Q3_K:    {"Q3_K", 256, 110, true},
	Q4_K:    {"Q4_K", 256, 144, true},
	Q5_K:    {"Q5_K", 256, 176, true},
	Q6_K:    {"Q6_K", 256, 210, true},
	Q8_K:    {"Q8_K", 256, 292, false},
	IQ2_XXS: {"IQ2_XXS", 256, 66, false},
	IQ2_XS:  {"IQ2_XS", 256, 74, false},
	IQ3_XXS: {"IQ3_XXS", 256, 98, false},
	IQ1_S:   {"IQ1_S", 256, 50, false},
	IQ4_NL:  {"IQ4_NL", 32, 18, true},
	IQ3_S:   {"IQ3_S", 256, 110, false},
	IQ2_S:   {"IQ2_S", 256, 82, false},
	IQ4_XS:  {"IQ4_XS", 256, 136, true},
	I8:      {"I8", 1, 1, false},
	I16:     {"I16", 1, 2, false},
	I32:     {"I32", 1, 4, false},
	I64:     {"I64", 1, 8, false},
	F64:     {"F64", 1, 8, false},
	IQ1_M:   {"IQ1_M", 256, 56, false},
	BF16:    {"BF16", 1, 2, true},
	TQ1_0:   {"TQ1_0", 256, 54, false},
	TQ2_0:   {"TQ2_0", 256, 66, false},
	MXFP4:   {"MXFP4", 32, 17, false},
}

// Known reports whether t is a ggml type id this package can size.
func (t Type) Known() bool { _, ok := types[t]; return ok }

// Supported reports whether Baton's kernels can compute with t.
func (t Type) Supported() bool { return types[t].supported }

// String returns ggml's name for t, or "type(N)" for an unknown id.
func (t Type) String() string {
	if ti, ok := types[t]; ok {
		return ti.name
	}
	return fmt.Sprintf("type(%d)", uint32(t))
}

// BlockSize is the number of elements in one block of t (1 for plain types);
// 0 for an unknown type.
func (t Type) BlockSize() int { return types[t].blockSize }

// BlockBytes is the size in bytes of one block of t; 0 for an unknown type.
func (t Type) BlockBytes() int { return types[t].blockBytes }

// SupportedTypes lists the types Baton computes with, in id order.
func SupportedTypes() []Type {
	return []Type{F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, BF16}
}

// RowBytes returns the bytes needed to store n elements of type t. n must be a
// multiple of the block size. The result is checked for overflow so a hostile
// file header cannot make a caller allocate or slice with a wrapped size.
func RowBytes(t Type, n uint64) (uint64, error) {
	ti, ok := types[t]
	if !ok {
		return 0, fmt.Errorf("quant: unknown tensor type %d", uint32(t))
	}
	bs := uint64(ti.blockSize)
	if n%bs != 0 {
		return 0, fmt.Errorf("quant: %d elements of %s is not a whole number of %d-element blocks", n, ti.name, bs)
	}
	blocks := n / bs
	bb := uint64(ti.blockBytes)
	if blocks != 0 && blocks > ^uint64(0)/bb {
		return 0, fmt.Errorf("quant: %d elements of %s overflow a 64-bit size", n, ti.name)
	}
	return blocks * bb, nil
}

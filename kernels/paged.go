package kernels

import (
	"encoding/binary"
	"math"

	"github.com/baton-serving/baton/kernels/quant"
	"github.com/baton-serving/baton/kernels/vec"
)

// The operations below work on a paged KV cache: keys and values stored as
// little-endian bytes of F32 or F16 elements, in pages of a fixed number of
// positions, each position a row of every KV head side by side. They read
// and write the bytes with encoding/binary, which the compiler turns into
// plain loads and stores on little-endian machines, so the layout is the
// same on every platform and a page can be sent over the network as it is.

// KVElemSize returns the byte size of one element of a KV cache of type typ,
// or 0 when typ is not a KV cache type (only F32 and F16 are).
func KVElemSize(typ quant.Type) int {
	switch typ {
	case quant.F32:
		return 4
	case quant.F16:
		return 2
	}
	return 0
}

// EncodeKV stores src in dst as elements of type typ (F32 or F16, little
// endian); F16 rounds to nearest even. len(dst) must be
// len(src)·KVElemSize(typ), which is the caller's contract. Another typ
// leaves dst unchanged.
func EncodeKV(dst []byte, src []float32, typ quant.Type) {
	switch typ {
	case quant.F32:
		dst = dst[:4*len(src)]
		for i, v := range src {
			binary.LittleEndian.PutUint32(dst[4*i:], math.Float32bits(v))
		}
	case quant.F16:
		// vcvtps2ph where the CPU has it (4% of a serving worker in the
		// scalar conversion); the same bits as quant.F32ToF16.
		vec.EncodeF16(dst, src)
	}
}

// DecodeKV widens len(dst) elements of type typ from src into dst; it is
// exact for both types. Another typ fills dst with NaN.
func DecodeKV(dst []float32, src []byte, typ quant.Type) {
	switch typ {
	case quant.F32:
		src = src[:4*len(dst)]
		for i := range dst {
			dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
		}
	case quant.F16:
		src = src[:2*len(dst)]
		for i := range dst {
			dst[i] = quant.F16ToF32(binary.LittleEndian.Uint16(src[2*i:]))
		}
	default:
		fillNaN(dst)
	}
}

func fillNaN(x []float32) {
	nan := float32(math.NaN())
	for i := range x {
		x[i] = nan
	}
}

// AttendHeadPaged is AttendHead over a paged cache. kPages[i] and vPages[i]
// hold the keys and values of positions i·pageSize … (i+1)·pageSize-1 of
// one layer as rows of stride elements of type typ; this head's elements
// start off elements into each row. n is the number of positions attended
// to, so the pages must cover them: len(kPages) ≥ ⌈n/pageSize⌉.
//
// With F32 elements the arithmetic is AttendHead's, operation for
// operation, so the two give bit-identical results on the same values; F16
// elements are widened exactly before use. scores is scratch space of at
// least n elements. A typ other than F32 or F16 fills out with NaN.
func AttendHeadPaged(out, q []float32, kPages, vPages [][]byte, n, pageSize, stride, off int, typ quant.Type, scores []float32) {
	d := len(q)
	out = out[:d]
	es := KVElemSize(typ)
	if es == 0 || pageSize <= 0 {
		fillNaN(out)
		return
	}
	scale := float32(1 / math.Sqrt(float64(d)))
	scores = scores[:n]
	for t := range n {
		start := ((t%pageSize)*stride + off) * es
		row := kPages[t/pageSize][start : start+d*es]
		if typ == quant.F32 {
			scores[t] = dotF32Bytes(q, row) * scale
		} else {
			scores[t] = dotF16Bytes(q, row) * scale
		}
	}
	Softmax(scores)
	clear(out)
	for t, w := range scores {
		start := ((t%pageSize)*stride + off) * es
		row := vPages[t/pageSize][start : start+d*es]
		if typ == quant.F32 {
			for i := range out {
				out[i] += w * math.Float32frombits(binary.LittleEndian.Uint32(row[4*i:]))
			}
		} else {
			for i := range out {
				out[i] += w * quant.F16ToF32(binary.LittleEndian.Uint16(row[2*i:]))
			}
		}
	}
}

// dotF32Bytes is Dot with b stored as little-endian F32 bytes: the same
// sequential sum, so the result is bit-identical to Dot on the same values.
func dotF32Bytes(a []float32, b []byte) float32 {
	b = b[:4*len(a)]
	var s float32
	for i, v := range a {
		s += v * math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return s
}

// dotF16Bytes is Dot with b stored as little-endian F16 bytes.
func dotF16Bytes(a []float32, b []byte) float32 {
	b = b[:2*len(a)]
	var s float32
	for i, v := range a {
		s += v * quant.F16ToF32(binary.LittleEndian.Uint16(b[2*i:]))
	}
	return s
}

package kernels

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/baton-serving/baton/kernels/quant"
)

func TestEncodeDecodeKV(t *testing.T) {
	src := []float32{1, -2.5, 0, float32(math.Inf(1)), 65504, 1e-8, 3.14159}
	tests := []struct {
		typ  quant.Type
		size int
		want func(float32) float32 // the value that must come back
	}{
		{quant.F32, 4, func(v float32) float32 { return v }},
		{quant.F16, 2, func(v float32) float32 { return quant.F16ToF32(quant.F32ToF16(v)) }},
	}
	for _, tc := range tests {
		t.Run(tc.typ.String(), func(t *testing.T) {
			if got := KVElemSize(tc.typ); got != tc.size {
				t.Fatalf("KVElemSize = %d, want %d", got, tc.size)
			}
			b := make([]byte, len(src)*tc.size)
			EncodeKV(b, src, tc.typ)
			// Little-endian bytes of the type, element after element.
			for i, v := range src {
				var bits uint32
				if tc.typ == quant.F32 {
					bits = binary.LittleEndian.Uint32(b[4*i:])
					if bits != math.Float32bits(v) {
						t.Fatalf("element %d stored as %#x, want %#x", i, bits, math.Float32bits(v))
					}
				} else if h := binary.LittleEndian.Uint16(b[2*i:]); h != quant.F32ToF16(v) {
					t.Fatalf("element %d stored as %#x, want %#x", i, h, quant.F32ToF16(v))
				}
			}
			got := make([]float32, len(src))
			DecodeKV(got, b, tc.typ)
			for i, v := range src {
				if w := tc.want(v); got[i] != w {
					t.Fatalf("element %d decoded as %v, want %v", i, got[i], w)
				}
			}
		})
	}
	if KVElemSize(quant.Q8_0) != 0 {
		t.Error("Q8_0 is not a KV cache type")
	}
	got := []float32{1, 2}
	DecodeKV(got, make([]byte, 8), quant.Q8_0)
	if !math.IsNaN(float64(got[0])) || !math.IsNaN(float64(got[1])) {
		t.Errorf("DecodeKV of an unsupported type gave %v, want NaN", got)
	}
}

// paginate copies n rows of stride float32s into pages of pageSize rows of
// type typ, as a paged KV cache stores them.
func paginate(rows []float32, n, stride, pageSize int, typ quant.Type) [][]byte {
	es := KVElemSize(typ)
	var pages [][]byte
	for p := 0; p*pageSize < n; p++ {
		page := make([]byte, pageSize*stride*es)
		// Garbage in unused slots must not be read.
		for i := range page {
			page[i] = 0xff
		}
		for s := 0; s < pageSize && p*pageSize+s < n; s++ {
			r := p*pageSize + s
			EncodeKV(page[s*stride*es:(s+1)*stride*es], rows[r*stride:(r+1)*stride], typ)
		}
		pages = append(pages, page)
	}
	return pages
}

// TestAttendHeadPagedMatchesContiguous checks the paged kernel against
// AttendHead bit for bit: for F32 on the same values, for F16 on values that
// F16 represents exactly (so that only the storage differs).
func TestAttendHeadPagedMatchesContiguous(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	const headDim, kvHeads = 8, 3
	stride := headDim * kvHeads
	for _, typ := range []quant.Type{quant.F32, quant.F16} {
		for _, pageSize := range []int{1, 3, 16} {
			for _, n := range []int{1, 2, 15, 16, 17, 40} {
				k := make([]float32, n*stride)
				v := make([]float32, n*stride)
				for i := range k {
					k[i] = float32(rng.NormFloat64())
					v[i] = float32(rng.NormFloat64())
					if typ == quant.F16 {
						k[i] = quant.F16ToF32(quant.F32ToF16(k[i]))
						v[i] = quant.F16ToF32(quant.F32ToF16(v[i]))
					}
				}
				kp := paginate(k, n, stride, pageSize, typ)
				vp := paginate(v, n, stride, pageSize, typ)
				q := make([]float32, headDim)
				for i := range q {
					q[i] = float32(rng.NormFloat64())
				}
				for h := range kvHeads {
					off := h * headDim
					want := make([]float32, headDim)
					AttendHead(want, q, k[off:], v[off:], n, stride, make([]float32, n))
					got := make([]float32, headDim)
					AttendHeadPaged(got, q, kp, vp, n, pageSize, stride, off, typ, make([]float32, n))
					if !slices.Equal(got, want) {
						t.Fatalf("%s page %d n %d head %d: paged %v, contiguous %v", typ, pageSize, n, h, got, want)
					}
				}
			}
		}
	}
}

func TestAttendHeadPagedBadType(t *testing.T) {
	out := make([]float32, 2)
	AttendHeadPaged(out, []float32{1, 2}, [][]byte{make([]byte, 64)}, [][]byte{make([]byte, 64)}, 1, 1, 2, 0, quant.Q4_0, make([]float32, 1))
	for _, v := range out {
		if !math.IsNaN(float64(v)) {
			t.Fatalf("unsupported type gave %v, want NaN", out)
		}
	}
}

func BenchmarkAttendHeadPaged(b *testing.B) {
	const headDim, n, pageSize = 64, 512, 16
	for _, typ := range []quant.Type{quant.F32, quant.F16} {
		b.Run(typ.String(), func(b *testing.B) {
			k := make([]float32, n*headDim)
			for i := range k {
				k[i] = float32(i%7) * 0.1
			}
			kp := paginate(k, n, headDim, pageSize, typ)
			q, out, scores := make([]float32, headDim), make([]float32, headDim), make([]float32, n)
			for b.Loop() {
				AttendHeadPaged(out, q, kp, kp, n, pageSize, headDim, 0, typ, scores)
			}
		})
	}
}

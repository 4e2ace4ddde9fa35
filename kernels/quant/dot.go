package quant

import (
	"encoding/binary"
	"math"
)

// Dot returns the dot product of one stored row of type t with x, whose
// length is the row's element count. It works block by block on the stored
// bytes, never materialising the dequantized row, so it can serve as the
// inner loop of a matrix-vector product.
//
// The caller guarantees the shapes: RowBytes(t, len(x)) == len(row), checked
// once (for a weight matrix, when the model is loaded). Dot itself only makes
// an O(1) guard: for an unsupported type, a len(x) that is not a whole number
// of blocks, or a row of the wrong length it returns NaN, which poisons
// whatever it feeds instead of panicking or reading out of bounds.
func Dot(t Type, row []byte, x []float32) float32 {
	switch t {
	case F32:
		if len(row) != 4*len(x) {
			return nan32()
		}
		return dotF32(row, x)
	case F16:
		if len(row) != 2*len(x) {
			return nan32()
		}
		return dotF16(row, x)
	case BF16:
		if len(row) != 2*len(x) {
			return nan32()
		}
		return dotBF16(row, x)
	case Q8_0:
		if len(x)%qk != 0 || len(row) != len(x)/qk*q80Sz {
			return nan32()
		}
		return dotQ80(row, x)
	case Q4_0:
		if len(x)%qk != 0 || len(row) != len(x)/qk*q40Sz {
			return nan32()
		}
		return dotQ40(row, x)
	case Q4_K:
		if len(x)%qkK != 0 || len(row) != len(x)/qkK*q4KSz {
			return nan32()
		}
		return dotQ4K(row, x)
	case Q6_K:
		if len(x)%qkK != 0 || len(row) != len(x)/qkK*q6KSz {
			return nan32()
		}
		return dotQ6K(row, x)
	case Q2_K, Q3_K, Q5_K, IQ4_XS:
		return dotKQ2(t, row, x)
	case Q4_1, Q5_0, Q5_1, IQ4_NL:
		if len(x)%qk != 0 || len(row) != len(x)/qk*t.BlockBytes() {
			return nan32()
		}
		return dotLegacy(t, row, x)
	}
	return nan32()
}

// MatVec sets dst[r] to Dot(t, row r of w, x) for each of the rows rows of
// the row-major matrix w, whose rows each hold cols elements of type t.
//
// As with [Dot], the caller guarantees the shapes: len(x) == cols,
// len(dst) == rows and len(w) == rows·RowBytes(t, cols). If they do not
// hold, or t is unsupported, MatVec sets every element of dst to NaN instead
// of panicking.
func MatVec(t Type, dst []float32, w []byte, rows, cols int, x []float32) {
	rb, ok := rowBytes(t, cols)
	if !ok || rows < 0 || len(x) != cols || len(dst) != rows ||
		(rb != 0 && rows > math.MaxInt/rb) || len(w) != rows*rb {
		nan := nan32()
		for i := range dst {
			dst[i] = nan
		}
		return
	}
	for r := range dst {
		dst[r] = Dot(t, w[r*rb:(r+1)*rb], x)
	}
}

// rowBytes is RowBytes for int sizes, reporting false instead of an error.
func rowBytes(t Type, n int) (int, bool) {
	if n < 0 || !t.Supported() {
		return 0, false
	}
	bs := t.BlockSize()
	if n%bs != 0 {
		return 0, false
	}
	blocks, bb := n/bs, t.BlockBytes()
	if blocks != 0 && blocks > math.MaxInt/bb {
		return 0, false
	}
	return blocks * bb, true
}

func nan32() float32 { return float32(math.NaN()) }

// The loops below keep four partial sums to shorten the floating-point
// dependency chain, and reslice to fixed-size arrays so the compiler can drop
// bounds checks inside a block.

func dotF32(row []byte, x []float32) float32 {
	var s0, s1, s2, s3 float32
	for len(x) >= 4 {
		r := (*[16]byte)(row)
		v := (*[4]float32)(x)
		s0 += math.Float32frombits(binary.LittleEndian.Uint32(r[0:])) * v[0]
		s1 += math.Float32frombits(binary.LittleEndian.Uint32(r[4:])) * v[1]
		s2 += math.Float32frombits(binary.LittleEndian.Uint32(r[8:])) * v[2]
		s3 += math.Float32frombits(binary.LittleEndian.Uint32(r[12:])) * v[3]
		row, x = row[16:], x[4:]
	}
	for i, v := range x {
		s0 += math.Float32frombits(binary.LittleEndian.Uint32(row[4*i:])) * v
	}
	return (s0 + s1) + (s2 + s3)
}

func dotF16(row []byte, x []float32) float32 {
	var s0, s1, s2, s3 float32
	for len(x) >= 4 {
		r := (*[8]byte)(row)
		v := (*[4]float32)(x)
		s0 += F16ToF32(binary.LittleEndian.Uint16(r[0:])) * v[0]
		s1 += F16ToF32(binary.LittleEndian.Uint16(r[2:])) * v[1]
		s2 += F16ToF32(binary.LittleEndian.Uint16(r[4:])) * v[2]
		s3 += F16ToF32(binary.LittleEndian.Uint16(r[6:])) * v[3]
		row, x = row[8:], x[4:]
	}
	for i, v := range x {
		s0 += F16ToF32(binary.LittleEndian.Uint16(row[2*i:])) * v
	}
	return (s0 + s1) + (s2 + s3)
}

func dotBF16(row []byte, x []float32) float32 {
	var s0, s1, s2, s3 float32
	for len(x) >= 4 {
		r := (*[8]byte)(row)
		v := (*[4]float32)(x)
		s0 += BF16ToF32(binary.LittleEndian.Uint16(r[0:])) * v[0]
		s1 += BF16ToF32(binary.LittleEndian.Uint16(r[2:])) * v[1]
		s2 += BF16ToF32(binary.LittleEndian.Uint16(r[4:])) * v[2]
		s3 += BF16ToF32(binary.LittleEndian.Uint16(r[6:])) * v[3]
		row, x = row[8:], x[4:]
	}
	for i, v := range x {
		s0 += BF16ToF32(binary.LittleEndian.Uint16(row[2*i:])) * v
	}
	return (s0 + s1) + (s2 + s3)
}

func dotQ80(row []byte, x []float32) float32 {
	var sum float32
	for ; len(x) > 0; row, x = row[q80Sz:], x[qk:] {
		b := (*[q80Sz]byte)(row)
		v := (*[qk]float32)(x)
		var s0, s1, s2, s3 float32
		for j := 0; j < qk; j += 4 {
			s0 += float32(int8(b[2+j])) * v[j]
			s1 += float32(int8(b[3+j])) * v[j+1]
			s2 += float32(int8(b[4+j])) * v[j+2]
			s3 += float32(int8(b[5+j])) * v[j+3]
		}
		sum += f16At(b[:], 0) * ((s0 + s1) + (s2 + s3))
	}
	return sum
}

func dotQ40(row []byte, x []float32) float32 {
	var sum float32
	for ; len(x) > 0; row, x = row[q40Sz:], x[qk:] {
		b := (*[q40Sz]byte)(row)
		v := (*[qk]float32)(x)
		// Σ(q−8)·x = Σq·x − 8·Σx: the offset is applied once per block.
		var s0, s1, sx0, sx1 float32
		for j := range qk / 2 {
			q := b[2+j]
			lo, hi := v[j], v[j+qk/2]
			s0 += float32(q&0xf) * lo
			s1 += float32(q>>4) * hi
			sx0 += lo
			sx1 += hi
		}
		sum += f16At(b[:], 0) * ((s0 + s1) - 8*(sx0+sx1))
	}
	return sum
}

func dotQ4K(row []byte, x []float32) float32 {
	var sum float32
	for ; len(x) > 0; row, x = row[q4KSz:], x[qkK:] {
		b := (*[q4KSz]byte)(row)
		scales := (*[12]byte)(b[4:16])
		// Σ(d·sc·q − dmin·m)·x = d·Σ sc·(Σq·x) − dmin·Σ m·(Σx), so the
		// two super-block scales multiply once per block.
		var sq, sm float32
		for c := range 4 {
			qs := (*[32]byte)(b[16+32*c:])
			v := (*[64]float32)(x[64*c:])
			var q1, q2, x1, x2 float32
			for l, q := range qs {
				lo, hi := v[l], v[l+32]
				q1 += float32(q&0xf) * lo
				q2 += float32(q>>4) * hi
				x1 += lo
				x2 += hi
			}
			sc1, m1 := scaleMinK4(2*c, scales)
			sc2, m2 := scaleMinK4(2*c+1, scales)
			sq += float32(sc1)*q1 + float32(sc2)*q2
			sm += float32(m1)*x1 + float32(m2)*x2
		}
		sum += f16At(b[:], 0)*sq - f16At(b[:], 2)*sm
	}
	return sum
}

func dotQ6K(row []byte, x []float32) float32 {
	var sum float32
	for ; len(x) > 0; row, x = row[q6KSz:], x[qkK:] {
		b := (*[q6KSz]byte)(row)
		var s float32
		for h := range 2 {
			ql := (*[64]byte)(b[64*h:])
			qh := (*[32]byte)(b[128+32*h:])
			sc := (*[8]byte)(b[192+8*h:])
			v := (*[128]float32)(x[128*h:])
			// Sub-block g of each 32-value quarter k has scale sc[g+2k].
			for g := range 2 {
				var a0, a1, a2, a3 float32
				for l := 16 * g; l < 16*g+16; l++ {
					lo, hi, bits := ql[l], ql[l+32], qh[l]
					a0 += float32(int(lo&0xf|bits&3<<4)-32) * v[l]
					a1 += float32(int(hi&0xf|bits>>2&3<<4)-32) * v[l+32]
					a2 += float32(int(lo>>4|bits>>4&3<<4)-32) * v[l+64]
					a3 += float32(int(hi>>4|bits>>6<<4)-32) * v[l+96]
				}
				s += float32(int8(sc[g]))*a0 + float32(int8(sc[g+2]))*a1 +
					float32(int8(sc[g+4]))*a2 + float32(int8(sc[g+6]))*a3
			}
		}
		sum += f16At(b[:], 208) * s
	}
	return sum
}

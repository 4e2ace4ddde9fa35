package vec

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/baton-serving/baton/kernels/quant"
)

// forEachImpl runs f as a subtest for every implementation this CPU can
// run, so that each assembly variant is checked, not only the one chosen.
func forEachImpl(t *testing.T, f func(t *testing.T, im *impl)) {
	t.Helper()
	for _, im := range impls() {
		t.Run(im.name, func(t *testing.T) { f(t, im) })
	}
}

// guardLen is how many sentinel elements surround every buffer under test.
const guardLen = 67

// guarded returns a slice of n elements that sits between guardLen sentinel
// elements on each side, and a function that fails the test if a kernel
// wrote to any of them. The slice's capacity ends at its length.
func guarded[T comparable](n int, sentinel T) ([]T, func(t *testing.T, what string)) {
	buf := make([]T, n+2*guardLen)
	for i := range buf {
		buf[i] = sentinel
	}
	s := buf[guardLen : guardLen+n : guardLen+n]
	check := func(t *testing.T, what string) {
		t.Helper()
		for i := range guardLen {
			if buf[i] != sentinel || buf[guardLen+n+i] != sentinel {
				t.Fatalf("%s: a guard element next to the %d-element buffer was overwritten", what, n)
			}
		}
	}
	return s, check
}

// Read-only inputs are guarded by values that wreck any result computed
// from them: a kernel that reads past its slice fails the numeric checks.
const (
	f32Sentinel  = float32(1e30)
	byteSentinel = byte(0x7f) // 0x7f7f is a binary16 NaN
	outSentinel  = float32(-7777)
)

func randF32(r *rand.Rand, n int, scale float64) []float32 {
	s, _ := guarded(n, f32Sentinel)
	for i := range s {
		s[i] = float32(r.NormFloat64() * scale)
	}
	return s
}

func toBytes(r *rand.Rand, t quant.Type, x []float32) []byte {
	nb, err := quant.RowBytes(t, uint64(len(x)))
	if err != nil {
		panic(err)
	}
	b, _ := guarded(int(nb), byteSentinel)
	if err := quant.Quantize(t, x, b); err != nil {
		panic(err)
	}
	return b
}

// relClose reports whether got is within tol·mag (plus a hair for
// underflow) of want.
func relClose(got float32, want, mag, tol float64) bool {
	return math.Abs(float64(got)-want) <= tol*mag+1e-30
}

// dotRef returns Σ w·x in float64 and Σ|w·x|.
func dotRef(w, x []float32) (sum, mag float64) {
	for i := range w {
		p := float64(w[i]) * float64(x[i])
		sum += p
		mag += math.Abs(p)
	}
	return sum, mag
}

func dequant(t quant.Type, b []byte, n int) []float32 {
	out := make([]float32, n)
	if err := quant.Dequantize(t, b, out); err != nil {
		panic(err)
	}
	return out
}

// refScalesK4 unpacks the eight 6-bit scales and mins of a Q4_K or Q5_K
// block from its 12 scale bytes s (ggml's get_scale_min_k4): sub-blocks
// 0–3 in the low 6 bits of bytes j and j+4, sub-blocks 4–7 with their low
// 4 bits in the nibbles of byte j+4 and their top 2 in the top bits of
// bytes j−4 and j.
func refScalesK4(s []byte) (sc, mn [8]int64) {
	for j := range 8 {
		if j < 4 {
			sc[j], mn[j] = int64(s[j]&63), int64(s[j+4]&63)
		} else {
			sc[j] = int64(s[j+4]&15) | int64(s[j-4]>>6)<<4
			mn[j] = int64(s[j+4]>>4) | int64(s[j]>>6)<<4
		}
	}
	return sc, mn
}

func f16(b []byte) float64 { return float64(quant.F16ToF32(binary.LittleEndian.Uint16(b))) }

func f32le(b []byte) float64 {
	return float64(math.Float32frombits(binary.LittleEndian.Uint32(b)))
}

// exactDot computes the dot product of one quantized weight row with
// quantized activations the way the kernels define it: an exact integer
// per block, times the block scales, summed in float64. It decodes the
// ggml layouts independently of the package's code. It also returns the
// scale for tolerances, Σ over blocks of |scale|·Σ|integer products|: the
// kernels add partial products in float32 vector lanes, and partial sums
// can be far larger than a block's total when its terms cancel.
func exactDot(q qtype, w, xq []byte, nb int) (sum, mag float64) {
	add := func(scale float64, isum, iabs int64) {
		sum += scale * float64(isum)
		mag += math.Abs(scale) * float64(iabs)
	}
	abs := func(v int64) int64 { return max(v, -v) }
	if legacyQ(q) {
		return exactDotLegacy(q, w, xq, nb)
	}
	for b := range nb {
		switch q {
		case q8_0, q4_0:
			xb := xq[34*b : 34*b+34]
			var isum, iabs int64
			for j := range 32 {
				var wv int64
				if q == q8_0 {
					wv = int64(int8(w[34*b+2+j]))
				} else {
					byt := w[18*b+2+j%16]
					if j < 16 {
						wv = int64(byt&15) - 8
					} else {
						wv = int64(byt>>4) - 8
					}
				}
				p := wv * int64(int8(xb[2+j]))
				isum += p
				iabs += abs(p)
			}
			var wd float64
			if q == q8_0 {
				wd = f16(w[34*b:])
			} else {
				wd = f16(w[18*b:])
			}
			add(wd*f16(xb), isum, iabs)
		case q4_K:
			wb := w[144*b : 144*b+144]
			xb := xq[292*b : 292*b+292]
			sc, mn := refScalesK4(wb[4:16])
			var isum, iabs, msum, mabs int64
			for i := range 256 {
				c, l := i/64, i%64
				byt := wb[16+32*c+l%32]
				qv := int64(byt & 15)
				if l >= 32 {
					qv = int64(byt >> 4)
				}
				x := int64(int8(xb[4+i]))
				isum += sc[i/32] * qv * x
				iabs += abs(sc[i/32] * qv * x)
				msum += mn[i/32] * x
				mabs += abs(mn[i/32] * x)
			}
			xd := f32le(xb)
			add(f16(wb)*xd, isum, iabs)
			add(-f16(wb[2:])*xd, msum, mabs)
		case q6_K:
			wb := w[210*b : 210*b+210]
			xb := xq[292*b : 292*b+292]
			var isum, iabs int64
			for i := range 256 {
				h, l := i/128, i%128
				k, j := l/32, l%32
				byt := wb[64*h+j+32*(k%2)]
				lo := byt & 15
				if k >= 2 {
					lo = byt >> 4
				}
				hi := wb[128+32*h+j] >> (2 * k) & 3
				qv := int64(lo|hi<<4) - 32
				p := int64(int8(wb[192+i/16])) * qv * int64(int8(xb[4+i]))
				isum += p
				// The kernels add the unsigned 6-bit products and take the
				// offset off separately, so both enter the partial sums.
				iabs += abs(p) + abs(int64(int8(wb[192+i/16]))*32*int64(int8(xb[4+i])))
			}
			add(f16(wb[208:])*f32le(xb), isum, iabs)
		case q2_K, q3_K, q5_K, iq4_XS:
			exactKQ2(q, w[b*qinfo[q].wBytes:], xq[292*b:292*b+292], add)
		}
	}
	return sum, mag
}

// qtypeOf maps the package's quantized types to quant's.
var qtypeOf = [numQ]quant.Type{q8_0: quant.Q8_0, q4_0: quant.Q4_0, q4_K: quant.Q4_K, q6_K: quant.Q6_K,
	q4_1: quant.Q4_1, q5_0: quant.Q5_0, q5_1: quant.Q5_1, iq4_nl: quant.IQ4_NL,
	q2_K: quant.Q2_K, q3_K: quant.Q3_K, q5_K: quant.Q5_K, iq4_XS: quant.IQ4_XS}

// actType is the activation type each quantized weight type pairs with.
func actType(q qtype) quant.Type {
	if a, _ := ActivationType(qtypeOf[q]); a == quant.Q8_1 {
		return a
	}
	if qinfo[q].xBytes == Q8_KBytes {
		return quant.Q8_K
	}
	return quant.Q8_0
}

// quantizeActs quantizes x with the pure-Go quantizer of q's activation
// type into a guarded buffer.
func quantizeActs(q qtype, x []float32) []byte {
	qi := &qinfo[q]
	b, _ := guarded(len(x)/qi.values*qi.xBytes, byteSentinel)
	if actType(q) == quant.Q8_K {
		quantQ8_KGo(x, b)
	} else if actType(q) == quant.Q8_1 {
		quantQ8_1Go(x, b)
	} else {
		quantQ8_0Go(x, b)
	}
	return b
}

// randWeights returns a row of nb blocks of type q. With raw, the bytes are
// random apart from finite scales, which covers every bit pattern of the
// packed values; otherwise the row is quantized from normal floats.
func randWeights(r *rand.Rand, q qtype, nb int, raw bool) []byte {
	qi := &qinfo[q]
	if !raw {
		return toBytes(r, qtypeOf[q], randF32(r, nb*qi.values, 1))
	}
	b, _ := guarded(nb*qi.wBytes, byteSentinel)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	// Scales: binary16 values of modest size, so that sums stay finite.
	scale := func(off int) {
		binary.LittleEndian.PutUint16(b[off:], quant.F32ToF16(float32(r.NormFloat64()*0.01)))
	}
	for blk := range nb {
		base := blk * qi.wBytes
		switch q {
		case q8_0, q4_0, q5_0, iq4_nl:
			scale(base)
		case q4_1, q5_1:
			scale(base)
			scale(base + 2)
		case q4_K:
			scale(base)
			scale(base + 2)
		case q6_K:
			scale(base + 208)
		case q2_K, q3_K, q5_K, iq4_XS:
			kq2Scales(q, base, scale)
		}
	}
	return b
}

func shapeName(dims ...int) string {
	s := ""
	for i, d := range dims {
		if i > 0 {
			s += "x"
		}
		s += fmt.Sprint(d)
	}
	return s
}

package quant

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// knownBlock is a hand-built stored row and the values ggml's layout says it
// holds. All values are small dyadic fractions, so they are exact whatever
// the order of the arithmetic.
type knownBlock struct {
	name string
	t    Type
	src  []byte
	want []float32
}

// Binary16 encodings of the block scales used below.
const (
	f16One    = 0x3c00
	f16Half   = 0x3800
	f16Quart  = 0x3400
	f16Eighth = 0x3000
)

func put16(b []byte, off int, v uint16) { binary.LittleEndian.PutUint16(b[off:], v) }

// Q4_K sub-block scales and mins for the hand-made blocks, with the 12 bytes
// that pack them, worked out by hand from ggml's get_scale_min_k4: bytes 0–3
// hold sc[0..3] in their low 6 bits and sc[4..7]>>4 in their top 2; bytes 4–7
// the same for the mins; bytes 8–11 hold sc[4..7]&15 | (m[4..7]&15)<<4.
var (
	q4kSc     = [8]int{1, 2, 3, 63, 17, 33, 48, 5}
	q4kMin    = [8]int{0, 4, 62, 7, 20, 1, 35, 63}
	q4kPacked = [12]byte{
		1 | 1<<6, 2 | 2<<6, 3 | 3<<6, 63 | 0<<6, // 17>>4=1, 33>>4=2, 48>>4=3, 5>>4=0
		0 | 1<<6, 4 | 0<<6, 62 | 2<<6, 7 | 3<<6, // 20>>4=1, 1>>4=0, 35>>4=2, 63>>4=3
		0x41, 0x11, 0x30, 0xf5,
	}
)

// packQ4K lays 256 4-bit quants out as ggml's block_q4_K.qs: value 64c+l
// (l < 32) is the low nibble of qs[32c+l], value 64c+32+l the high nibble.
func packQ4K(q *[256]uint8) [128]byte {
	var qs [128]byte
	for e, v := range q {
		c, l := e/64, e%64
		if l < 32 {
			qs[32*c+l] |= v & 0xf
		} else {
			qs[32*c+l-32] |= v << 4
		}
	}
	return qs
}

// packQ6K lays 256 6-bit quants out as ggml's block_q6_K.ql and qh: in half
// h, quarter k, position l, the low nibble goes to ql[64h+l+32(k%2)] (low
// nibble for k < 2, high for k ≥ 2) and the top two bits to bits 2k, 2k+1 of
// qh[32h+l].
func packQ6K(q *[256]uint8) (ql [128]byte, qh [64]byte) {
	for e, v := range q {
		h, r := e/128, e%128
		k, l := r/32, r%32
		i := 64*h + l + 32*(k%2)
		if k < 2 {
			ql[i] |= v & 0xf
		} else {
			ql[i] |= v << 4
		}
		qh[32*h+l] |= (v >> 4) << (2 * k)
	}
	return ql, qh
}

func knownBlocks() []knownBlock {
	var blocks []knownBlock

	f32 := make([]byte, 12)
	for i, v := range []float32{1.5, -2, 0x1p-149} {
		binary.LittleEndian.PutUint32(f32[4*i:], math.Float32bits(v))
	}
	blocks = append(blocks, knownBlock{"F32", F32, f32, []float32{1.5, -2, 0x1p-149}})

	f16 := make([]byte, 8)
	for i, v := range []uint16{0x3c00, 0xc000, 0x0001, 0x7bff} {
		put16(f16, 2*i, v)
	}
	blocks = append(blocks, knownBlock{"F16", F16, f16, []float32{1, -2, 0x1p-24, 65504}})

	bf16 := make([]byte, 8)
	for i, v := range []uint16{0x3f80, 0xc040, 0x0001, 0x4049} {
		put16(bf16, 2*i, v)
	}
	blocks = append(blocks, knownBlock{"BF16", BF16, bf16, []float32{1, -3, 0x1p-133, 3.140625}})

	// Q8_0: d = 0.5, qs = −128, −120, …, 120.
	q8 := make([]byte, 34)
	put16(q8, 0, f16Half)
	q8want := make([]float32, 32)
	for j := range 32 {
		q8[2+j] = byte(int8(-128 + 8*j))
		q8want[j] = 0.5 * float32(-128+8*j)
	}
	blocks = append(blocks, knownBlock{"Q8_0", Q8_0, q8, q8want})

	// Q4_0: d = 0.25, byte j = j | (15−j)<<4, so value j is (j−8)/4 and
	// value 16+j is (7−j)/4.
	q4 := make([]byte, 18)
	put16(q4, 0, f16Quart)
	q4want := make([]float32, 32)
	for j := range 16 {
		q4[2+j] = byte(j) | byte(15-j)<<4
		q4want[j] = float32(j-8) / 4
		q4want[16+j] = float32(7-j) / 4
	}
	blocks = append(blocks, knownBlock{"Q4_0", Q4_0, q4, q4want})

	// Q4_K, a few literal bytes: d = dmin = 1, qs[0] = 0x5a, qs[32] = 0x0f.
	q4k := make([]byte, 144)
	put16(q4k, 0, f16One)
	put16(q4k, 2, f16One)
	copy(q4k[4:], q4kPacked[:])
	q4k[16+0] = 0x5a
	q4k[16+32] = 0x0f
	q4kwant := make([]float32, 256)
	for e := range q4kwant {
		q4kwant[e] = -float32(q4kMin[e/32]) // q = 0: −dmin·m
	}
	q4kwant[0] = 1*10 - 0   // low nibble of qs[0], sub-block 0
	q4kwant[32] = 2*5 - 4   // high nibble of qs[0], sub-block 1
	q4kwant[64] = 3*15 - 62 // low nibble of qs[32], sub-block 2
	q4kwant[96] = 63*0 - 7  // high nibble of qs[32], sub-block 3
	blocks = append(blocks, knownBlock{"Q4_K literal", Q4_K, q4k, q4kwant})

	// Q4_K, every value: d = 0.5, dmin = 0.25, q(e) = (7e+3) mod 16.
	var q4kq [256]uint8
	q4kfull := make([]byte, 144)
	put16(q4kfull, 0, f16Half)
	put16(q4kfull, 2, f16Quart)
	copy(q4kfull[4:], q4kPacked[:])
	q4kfullWant := make([]float32, 256)
	for e := range q4kq {
		q4kq[e] = uint8((7*e + 3) % 16)
		q4kfullWant[e] = 0.5*float32(q4kSc[e/32])*float32(q4kq[e]) - 0.25*float32(q4kMin[e/32])
	}
	qs := packQ4K(&q4kq)
	copy(q4kfull[16:], qs[:])
	blocks = append(blocks, knownBlock{"Q4_K full", Q4_K, q4kfull, q4kfullWant})

	// Q6_K, a few literal bytes: d = 1, every scale 1 except scales[8] = −2;
	// ql[0] = 0x21, ql[32] = 0x43, qh[0] = 0b11_10_01_00, ql[64] = 0x0f,
	// qh[32] = 0b11. Every other quant is 0, i.e. −32.
	q6 := make([]byte, 210)
	put16(q6, 208, f16One)
	for s := range 16 {
		q6[192+s] = 1
	}
	q6[192+8] = byte(0xfe) // −2
	q6[0], q6[32], q6[128] = 0x21, 0x43, 0xe4
	q6[64], q6[128+32] = 0x0f, 0x03
	q6want := make([]float32, 256)
	for e := range q6want {
		q6want[e] = -32
	}
	for e := 128; e < 144; e++ {
		q6want[e] = 64 // scale −2
	}
	q6want[0] = (1 | 0<<4) - 32           // ql[0] low nibble 1, qh[0] bits 0–1 = 0
	q6want[32] = (3 | 1<<4) - 32          // ql[32] low nibble 3, qh[0] bits 2–3 = 1
	q6want[64] = (2 | 2<<4) - 32          // ql[0] high nibble 2, qh[0] bits 4–5 = 2
	q6want[96] = (4 | 3<<4) - 32          // ql[32] high nibble 4, qh[0] bits 6–7 = 3
	q6want[128] = -2 * ((15 | 3<<4) - 32) // ql[64] low 15, qh[32] bits 0–1 = 3, scale −2
	blocks = append(blocks, knownBlock{"Q6_K literal", Q6_K, q6, q6want})

	// Q6_K, every value: d = 0.125, q(e) = (5e+3) mod 64, signed scales.
	q6sc := [16]int8{1, -1, 2, -2, 4, -4, 8, -8, 16, -16, 32, -32, 64, -64, 127, -128}
	var q6q [256]uint8
	q6full := make([]byte, 210)
	q6fullWant := make([]float32, 256)
	for e := range q6q {
		q6q[e] = uint8((5*e + 3) % 64)
		q6fullWant[e] = 0.125 * float32(q6sc[e/16]) * float32(int(q6q[e])-32)
	}
	ql, qh := packQ6K(&q6q)
	copy(q6full[0:], ql[:])
	copy(q6full[128:], qh[:])
	for s, v := range q6sc {
		q6full[192+s] = byte(v)
	}
	put16(q6full, 208, f16Eighth)
	blocks = append(blocks, knownBlock{"Q6_K full", Q6_K, q6full, q6fullWant})
	return blocks
}

func TestDequantizeKnownBlocks(t *testing.T) {
	for _, kb := range knownBlocks() {
		t.Run(kb.name, func(t *testing.T) {
			got := make([]float32, len(kb.want))
			if err := Dequantize(kb.t, kb.src, got); err != nil {
				t.Fatal(err)
			}
			for i := range got {
				if got[i] != kb.want[i] {
					t.Errorf("value %d = %g, want %g", i, got[i], kb.want[i])
				}
			}
		})
	}
}

// Several blocks in a row must decode independently, each at its offset.
func TestDequantizeMultiBlockRow(t *testing.T) {
	var row []byte
	var want []float32
	kbs := knownBlocks()
	for _, i := range []int{6, 5, 6} { // Q4_K full, Q4_K literal, Q4_K full
		if kbs[i].t != Q4_K {
			t.Fatalf("knownBlocks()[%d] is %s, want Q4_K", i, kbs[i].t)
		}
		row = append(row, kbs[i].src...)
		want = append(want, kbs[i].want...)
	}
	got := make([]float32, len(want))
	if err := Dequantize(Q4_K, row, got); err != nil {
		t.Fatal(err)
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("value %d = %g, want %g", i, got[i], want[i])
		}
	}
}

func readFloats(t *testing.T, path string) []float32 {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	x := make([]float32, len(raw)/4)
	for i := range x {
		x[i] = math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:]))
	}
	return x
}

// The encodings must be byte-identical to ggml's reference quantizers (see
// testdata/ggml/README.md), for every block type with a recorded encoding
// of input.f32. For Q8_0, Q4_0 and the legacy types that is the
// specification; for the K-quants and the IQ4 types it guards an exact port
// of ggml's searches, operation order included.
func TestQuantizeMatchesGGML(t *testing.T) {
	x := readFloats(t, filepath.Join("testdata", "ggml", "input.f32"))
	files := []struct {
		t    Type
		file string
	}{{Q8_0, "q8_0"}, {Q4_0, "q4_0"}, {Q4_K, "q4_K"}, {Q6_K, "q6_K"}}
	files = append(files, kq2Types...)
	for i, typ := range legacyTypes {
		files = append(files, struct {
			t    Type
			file string
		}{typ, strings.TrimSuffix(legacyFiles[i], ".bin")})
	}
	for _, c := range files {
		t.Run(c.t.String(), func(t *testing.T) {
			want := ggmlFile(t, c.file+".bin")
			got := make([]byte, len(want))
			if err := Quantize(c.t, x, got); err != nil {
				t.Fatal(err)
			}
			if i := mismatch(got, want); i >= 0 {
				bb := c.t.BlockBytes()
				t.Fatalf("byte %d (block %d, offset %d) = %#02x, ggml wrote %#02x",
					i, i/bb, i%bb, got[i], want[i])
			}
		})
	}
}

func mismatch(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	if len(a) != len(b) {
		return min(len(a), len(b))
	}
	return -1
}

type dataset struct {
	name string
	x    []float32
}

func testData(n int) []dataset {
	r := rand.New(rand.NewPCG(11, 12))
	gauss := func(sigma float64) []float32 {
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(r.NormFloat64() * sigma)
		}
		return x
	}
	outliers := gauss(0.02)
	for i := range outliers {
		if r.IntN(50) == 0 {
			outliers[i] *= 40
		}
	}
	positive := make([]float32, n)
	for i := range positive {
		positive[i] = float32(r.Float64() + 0.25)
	}
	return []dataset{
		{"gauss σ=1", gauss(1)},
		{"gauss σ=1e-3", gauss(1e-3)},
		{"gauss σ=100", gauss(100)},
		{"outliers", outliers},
		{"positive", positive},
	}
}

func roundTrip(t *testing.T, typ Type, x []float32) ([]byte, []float32) {
	t.Helper()
	rb, err := RowBytes(typ, uint64(len(x)))
	if err != nil {
		t.Fatal(err)
	}
	q := make([]byte, rb)
	if err := Quantize(typ, x, q); err != nil {
		t.Fatal(err)
	}
	y := make([]float32, len(x))
	if err := Dequantize(typ, q, y); err != nil {
		t.Fatal(err)
	}
	return q, y
}

// Q8_0 bound, per element: rounding x/d to an integer costs at most d/2 with
// d = amax/127, and storing d as binary16 (d16) moves each value by
// |q|·|d−d16| ≤ 127·|d−d16|. A millionth of amax covers float32 rounding.
func TestQ80ErrorBound(t *testing.T) {
	for _, ds := range testData(4096) {
		t.Run(ds.name, func(t *testing.T) {
			q, y := roundTrip(t, Q8_0, ds.x)
			for b := 0; b < len(ds.x)/32; b++ {
				var amax float32
				for _, v := range ds.x[32*b : 32*b+32] {
					amax = max(amax, abs32(v))
				}
				d := float64(amax) / 127
				d16 := float64(f16At(q, 34*b))
				bound := d/2 + 127*math.Abs(d-d16) + 1e-6*float64(amax)
				for i := 32 * b; i < 32*b+32; i++ {
					if e := math.Abs(float64(y[i] - ds.x[i])); e > bound {
						t.Fatalf("value %d: |%g − %g| = %g > bound %g", i, y[i], ds.x[i], e, bound)
					}
				}
			}
		})
	}
}

// Q4_0 bound, per element: with d = vmax/−8, x/d lies in [−8, 8]; rounding
// costs at most |d|/2, except that levels above 7.5 are clamped to 7 and may
// cost up to |d|. Storing d as binary16 adds at most 8·|d−d16|.
func TestQ40ErrorBound(t *testing.T) {
	for _, ds := range testData(4096) {
		t.Run(ds.name, func(t *testing.T) {
			q, y := roundTrip(t, Q4_0, ds.x)
			for b := 0; b < len(ds.x)/32; b++ {
				var amax, vmax float32
				for _, v := range ds.x[32*b : 32*b+32] {
					if abs32(v) > amax {
						amax, vmax = abs32(v), v
					}
				}
				d := float64(vmax) / -8
				d16 := float64(f16At(q, 18*b))
				for i := 32 * b; i < 32*b+32; i++ {
					step := math.Abs(d) / 2
					if float64(ds.x[i])/d > 7.5 {
						step = math.Abs(d)
					}
					bound := step + 8*math.Abs(d-d16) + 1e-6*float64(amax)
					if e := math.Abs(float64(y[i] - ds.x[i])); e > bound {
						t.Fatalf("value %d: |%g − %g| = %g > bound %g", i, y[i], ds.x[i], e, bound)
					}
				}
			}
		})
	}
}

// The RMS of the round-trip error, relative to the RMS of the data, must
// stay below a per-type limit: one for the Gaussian data sets and a looser
// one for the skewed ones (rare large outliers, all-positive values). The
// limits sit a little above what ggml's reference quantizers reach here —
// Gaussian: Q8_0 0.0054, Q4_0 0.086, Q4_K 0.072, Q6_K 0.017, Q2_K
// 0.29–0.30, Q3_K 0.15, Q5_K 0.035–0.037, IQ4_XS 0.076–0.081, Q4_1 0.079,
// Q5_0 0.043, Q5_1 0.039, IQ4_NL 0.077, the K-quants' most at σ=1e-3 where
// the binary16 super-block scale is subnormal and coarse (Q6_K 0.021);
// outliers: Q4_1 0.117, Q5_0 0.075, Q5_1 0.054, IQ4_NL 0.093. Binary16 and
// bfloat16 are bounded by half an ulp (2⁻¹¹ and 2⁻⁸ relative); F32 is
// exact.
func TestRoundTripRelativeRMS(t *testing.T) {
	limits := []struct {
		t            Type
		gauss, other float64
	}{
		{F32, 0, 0},
		{F16, 0x1p-11, 0x1p-11},
		{BF16, 0x1p-8, 0x1p-8},
		{Q8_0, 0.0065, 0.015},
		{Q4_0, 0.095, 0.12},
		{Q4_K, 0.08, 0.10},
		{Q6_K, 0.024, 0.04},
		{Q2_K, 0.32, 0.25},
		{Q3_K, 0.17, 0.12},
		{Q5_K, 0.042, 0.06},
		{IQ4_XS, 0.088, 0.11},
		{Q4_1, 0.09, 0.13},
		{Q5_0, 0.05, 0.085},
		{Q5_1, 0.045, 0.065},
		{IQ4_NL, 0.085, 0.11},
	}
	for _, lim := range limits {
		for _, ds := range testData(4096) {
			limit := lim.other
			if strings.HasPrefix(ds.name, "gauss") {
				limit = lim.gauss
			}
			t.Run(fmt.Sprintf("%s/%s", lim.t, ds.name), func(t *testing.T) {
				_, y := roundTrip(t, lim.t, ds.x)
				var se, ss float64
				for i, v := range ds.x {
					e := float64(y[i]) - float64(v)
					se += e * e
					ss += float64(v) * float64(v)
				}
				rel := math.Sqrt(se / ss)
				t.Logf("relative RMS error %.5f (limit %g)", rel, limit)
				if rel > limit {
					t.Errorf("relative RMS error %.5f > %g", rel, limit)
				}
			})
		}
	}
}

func TestQuantizeZerosAndEmpty(t *testing.T) {
	for _, typ := range SupportedTypes() {
		t.Run(typ.String(), func(t *testing.T) {
			x := make([]float32, 512)
			_, y := roundTrip(t, typ, x)
			for i, v := range y {
				if v != 0 {
					t.Fatalf("value %d of a zero row = %g", i, v)
				}
			}
			if err := Quantize(typ, nil, nil); err != nil {
				t.Errorf("Quantize of an empty row: %v", err)
			}
			if err := Dequantize(typ, nil, nil); err != nil {
				t.Errorf("Dequantize of an empty row: %v", err)
			}
		})
	}
}

// blockTypes are the supported types with blocks of more than one value:
// the ones Quantize searches scales for.
func blockTypes() []Type {
	var ts []Type
	for _, typ := range SupportedTypes() {
		if typ.BlockSize() > 1 {
			ts = append(ts, typ)
		}
	}
	return ts
}

// The block types refuse a non-finite value, naming the element, wherever
// in the row it stands.
func TestQuantizeRejectsNonFinite(t *testing.T) {
	for _, typ := range blockTypes() {
		for _, bad := range []float32{float32(math.NaN()), float32(math.Inf(-1)), float32(math.Inf(1))} {
			for _, at := range []int{40, 77, 200} {
				x := make([]float32, 256)
				x[at] = bad
				dst := make([]byte, 256/typ.BlockSize()*typ.BlockBytes())
				err := Quantize(typ, x, dst)
				if want := fmt.Sprintf("src[%d]", at); err == nil || !strings.Contains(err.Error(), want) {
					t.Errorf("Quantize(%s) with %g at %d: err = %v, want one naming %s", typ, bad, at, err, want)
				}
			}
		}
	}
	// The float types store non-finite values as they are.
	for _, typ := range []Type{F32, F16, BF16} {
		x := []float32{float32(math.NaN()), float32(math.Inf(1))}
		_, y := roundTrip(t, typ, x)
		if !math.IsNaN(float64(y[0])) || !math.IsInf(float64(y[1]), 1) {
			t.Errorf("%s round trip of NaN, +Inf = %v", typ, y)
		}
	}
}

func TestLengthErrors(t *testing.T) {
	tests := []struct {
		name    string
		t       Type
		n       int // float32 elements
		nbytes  int
		wantErr error
		wantMsg string
	}{
		{"Q8_0 partial block", Q8_0, 31, 34, ErrLength, "31"},
		{"Q8_0 short bytes", Q8_0, 32, 33, ErrLength, "33"},
		{"Q8_0 long bytes", Q8_0, 64, 69, ErrLength, "68"},
		{"Q4_0 partial block", Q4_0, 48, 36, ErrLength, "48"},
		{"Q4_K two blocks one block of bytes", Q4_K, 512, 144, ErrLength, "288"},
		{"Q4_K partial block", Q4_K, 255, 144, ErrLength, "256-element"},
		{"Q6_K off by one", Q6_K, 256, 211, ErrLength, "210"},
		{"F16 odd bytes", F16, 3, 8, ErrLength, "6 bytes"},
		{"BF16 short", BF16, 4, 6, ErrLength, "8 bytes"},
		{"F32 short", F32, 4, 12, ErrLength, "16 bytes"},
		{"known but unsupported", IQ2_XXS, 256, 66, ErrUnsupportedType, "IQ2_XXS"},
		{"unknown id", Type(99), 32, 32, ErrUnsupportedType, "type(99)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			errD := Dequantize(tt.t, make([]byte, tt.nbytes), make([]float32, tt.n))
			errQ := Quantize(tt.t, make([]float32, tt.n), make([]byte, tt.nbytes))
			for _, err := range []error{errD, errQ} {
				if !errors.Is(err, tt.wantErr) {
					t.Errorf("err = %v, want %v", err, tt.wantErr)
				} else if !strings.Contains(err.Error(), tt.wantMsg) {
					t.Errorf("err = %q, want it to mention %q", err, tt.wantMsg)
				}
			}
		})
	}
}

// Blocks are encoded independently: a row and its blocks quantized one at a
// time give the same bytes.
func TestQuantizeBlocksIndependent(t *testing.T) {
	x := testData(1024)[3].x
	for _, typ := range blockTypes() {
		whole, _ := roundTrip(t, typ, x)
		var parts []byte
		bs, bb := typ.BlockSize(), typ.BlockBytes()
		for b := 0; b < len(x)/bs; b++ {
			p := make([]byte, bb)
			if err := Quantize(typ, x[b*bs:(b+1)*bs], p); err != nil {
				t.Fatal(err)
			}
			parts = append(parts, p...)
		}
		if !bytes.Equal(whole, parts) {
			t.Errorf("%s: row encoding differs from block-by-block encoding", typ)
		}
	}
}

package vec

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/baton-serving/baton/kernels/quant"
)

// legacyExported maps the legacy weight types to their exported products,
// for TestExportedAPI.
var legacyExported = map[qtype]struct {
	matMul func(dst []float32, ldd int, w, xq []byte, rows, cols, tokens int)
	matVec func(dst []float32, w, xq []byte, rows, cols int)
}{
	q4_1:   {MatMulQ4_1, MatVecQ4_1},
	q5_0:   {MatMulQ5_0, MatVecQ5_0},
	q5_1:   {MatMulQ5_1, MatVecQ5_1},
	iq4_nl: {MatMulIQ4_NL, MatVecIQ4_NL},
}

// exactDotLegacy is exactDot for the legacy types, decoding the ggml
// layouts on its own: value i of a block is the low nibble of qs[i] (i <
// 16) or the high nibble of qs[i−16], with bit i of qh as fifth bit.
func exactDotLegacy(q qtype, w, xq []byte, nb int) (sum, mag float64) {
	grid := quant.IQ4NLValues()
	qi := &qinfo[q]
	for b := range nb {
		wb := w[b*qi.wBytes : (b+1)*qi.wBytes]
		xb := xq[b*qi.xBytes : (b+1)*qi.xBytes]
		qsOff, qhOff, mOff := map[qtype][3]int{
			q4_1: {4, -1, 2}, q5_0: {6, 2, -1}, q5_1: {8, 4, 2}, iq4_nl: {2, -1, -1}}[q][0],
			map[qtype]int{q5_0: 2, q5_1: 4}[q], map[qtype]int{q4_1: 2, q5_1: 2}[q]
		var isum, iabs int64
		for i := range 32 {
			var lv int64
			if i < 16 {
				lv = int64(wb[qsOff+i] & 15)
			} else {
				lv = int64(wb[qsOff+i-16] >> 4)
			}
			if qhOff != 0 {
				lv |= int64(binary.LittleEndian.Uint32(wb[qhOff:])>>i&1) << 4
			}
			switch q {
			case q5_0:
				lv -= 16
			case iq4_nl:
				lv = int64(grid[lv])
			}
			p := lv * int64(int8(xb[qi.xBytes-32+i]))
			isum += p
			iabs += max(p, -p)
			if q == q5_0 { // the kernels take the bias off separately
				iabs += 16 * max(int64(int8(xb[qi.xBytes-32+i])), -int64(int8(xb[qi.xBytes-32+i])))
			}
		}
		sc := f16(wb) * f16(xb)
		sum += sc * float64(isum)
		mag += math.Abs(sc) * float64(iabs)
		if mOff != 0 {
			ms := f16(wb[mOff:]) * f16(xb[2:])
			sum += ms
			mag += math.Abs(ms)
		}
	}
	return sum, mag
}

// TestLegacyMatchesGGML checks the activation quantizers byte for byte and
// the block dot products against ggml's vec_dot results recorded in
// kernels/quant/testdata/ggml (see its README): the pure-Go kernels bit for
// bit (they add in ggml's order), every implementation within the rounding
// of its lanes.
func TestLegacyMatchesGGML(t *testing.T) {
	dir := filepath.Join("..", "quant", "testdata", "ggml")
	read := func(name string) []byte {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	floats := func(b []byte) []float32 {
		f := make([]float32, len(b)/4)
		for i := range f {
			f[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
		}
		return f
	}
	x := floats(read("input.f32"))
	slices.Reverse(x) // the activations of the recorded products
	a80, a81 := read("act_q8_0.bin"), read("act_q8_1.bin")
	dots := floats(read("legacy_dots.f32"))
	weights := []struct {
		q    qtype
		file string
	}{{q4_1, "q4_1.bin"}, {q5_0, "q5_0.bin"}, {q5_1, "q5_1.bin"}, {iq4_nl, "iq4_nl.bin"}}
	forEachImpl(t, func(t *testing.T, im *impl) {
		got80, got81 := make([]byte, len(a80)), make([]byte, len(a81))
		im.quantQ8_0(x, got80)
		im.quantQ8_1(x, got81)
		if !slices.Equal(got80, a80) {
			t.Errorf("Q8_0 activations differ from ggml's quantize_row_q8_0")
		}
		if !slices.Equal(got81, a81) {
			t.Errorf("Q8_1 activations differ from ggml's quantize_row_q8_1")
		}
		for i, wt := range weights {
			qi := &qinfo[wt.q]
			w := read(wt.file)
			xq := a80
			if qi.xBytes == Q8_1Bytes {
				xq = a81
			}
			nb := len(x) / 32
			want := dots[i*(nb+1) : (i+1)*(nb+1)]
			for b := 0; b <= nb; b++ {
				o, n := b, 1
				if b == nb {
					o, n = 0, nb
				}
				got := im.dotQ[wt.q](w[o*qi.wBytes:(o+n)*qi.wBytes], xq[o*qi.xBytes:(o+n)*qi.xBytes], n)
				_, mag := exactDot(wt.q, w[o*qi.wBytes:(o+n)*qi.wBytes], xq[o*qi.xBytes:(o+n)*qi.xBytes], n)
				exact := im == genericImpl
				if exact && math.Float32bits(got) != math.Float32bits(want[b]) ||
					!exact && !relClose(got, float64(want[b]), mag, intTol) {
					t.Errorf("%s block %d (of %d): %g, ggml's vec_dot %g", qi.name, o, n, got, want[b])
				}
			}
		}
	})
}

func TestQuantizeQ8_1(t *testing.T) {
	forEachImpl(t, func(t *testing.T, im *impl) {
		r := rand.New(rand.NewPCG(21, 22))
		for _, x := range activationData(r, 512) {
			q0 := make([]byte, len(x)/32*34)
			im.quantQ8_0(x, q0)
			got, check := guarded(len(x)/32*36, byteSentinel)
			im.quantQ8_1(x, got)
			check(t, "QuantizeQ8_1 dst")
			for b := range len(x) / 32 {
				g, w := got[36*b:36*b+36], q0[34*b:34*b+34]
				// d and the values as Q8_0 (ggml's reference rounding).
				if !slices.Equal(g[:2], w[:2]) || !slices.Equal(g[4:], w[2:]) {
					t.Fatalf("block %d: d or values differ from the Q8_0 block", b)
				}
				var sum int
				for _, v := range g[4:] {
					sum += int(int8(v))
				}
				var amax float32
				for _, v := range x[32*b : 32*b+32] {
					amax = max(amax, float32(math.Abs(float64(v))))
				}
				// d in float32, before its rounding to binary16.
				s := quant.F32ToF16(float32(sum) * (amax / 127))
				if binary.LittleEndian.Uint16(g[2:]) != s {
					t.Fatalf("block %d: s = %#04x, want binary16(d·Σq) = %#04x", b, binary.LittleEndian.Uint16(g[2:]), s)
				}
			}
		}
		// A non-finite value poisons its block, s included.
		x := make([]float32, 64)
		x[40] = float32(math.NaN())
		q := make([]byte, 72)
		im.quantQ8_1(x, q)
		if f16(q[36:]) == f16(q[36:]) || f16(q[38:]) == f16(q[38:]) || f16(q) != 0 {
			t.Errorf("Q8_1 of a NaN in block 1: d, s = %g, %g; block 0 d = %g", f16(q[36:]), f16(q[38:]), f16(q))
		}
	})
	if err := QuantizeQ8_1(make([]float32, 33), make([]byte, 36)); err == nil {
		t.Errorf("QuantizeQ8_1 of 33 values: no error")
	}
}

func TestLegacyBadShapes(t *testing.T) {
	b := make([]byte, 1024)
	for _, got := range []float32{
		DotQ4_1(b[:20], b[:34], 32), // Q8_0-sized activations
		DotQ5_0(b[:22], b[:36], 32),
		DotQ5_1(b[:23], b[:36], 32),
		DotIQ4_NL(b[:18], b[:34], 31),
	} {
		if !math.IsNaN(float64(got)) {
			t.Errorf("dot with bad shapes = %g, want NaN", got)
		}
	}
	dst := make([]float32, 4)
	MatVecQ5_1(dst, b[:24*3], b[:36], 4, 32)
	if !math.IsNaN(float64(dst[0])) {
		t.Errorf("MatVecQ5_1 with 3 rows of weights for 4: dst[0] = %g, want NaN", dst[0])
	}
	for _, typ := range []quant.Type{quant.Q4_1, quant.Q5_0, quant.Q5_1, quant.IQ4_NL} {
		if _, ok := ActivationType(typ); !ok {
			t.Errorf("ActivationType(%s) not ok", typ)
		}
	}
	if _, ok := ActivationType(quant.F16); ok {
		t.Errorf("ActivationType(F16) ok")
	}
}

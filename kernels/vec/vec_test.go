package vec

import (
	"encoding/binary"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/baton-serving/baton/kernels/quant"
)

// Float kernels must match the float64 dot product to 1e-5·Σ|aᵢbᵢ|.
const floatTol = 1e-5

// Integer kernels must match the exact per-block integer reference to
// 1e-6·Σ|block terms|: only the float32 scaling and summation round.
const intTol = 1e-6

func TestImplementation(t *testing.T) {
	names := []string{}
	for _, im := range impls() {
		names = append(names, im.name)
	}
	if !slices.Contains([]string{"avx512", "avx2", "purego"}, Implementation()) {
		t.Fatalf("Implementation() = %q", Implementation())
	}
	if names[0] != Implementation() || names[len(names)-1] != "purego" {
		t.Fatalf("impls() = %v, chosen %q: want the chosen one first and purego last", names, Implementation())
	}
	t.Logf("implementations available: %v", names)
}

// floatLens covers every remainder modulo the vector widths and unroll
// factors, plus long rows.
var floatLens = func() []int {
	var ns []int
	for n := 0; n <= 70; n++ {
		ns = append(ns, n)
	}
	return append(ns, 127, 128, 255, 256, 1000, 4096, 4099)
}()

// halfRow quantizes x to F16 or BF16 and returns the stored row and its
// exact float values.
func halfRow(r *rand.Rand, typ quant.Type, n int) ([]byte, []float32) {
	w := toBytes(r, typ, randF32(r, n, 1))
	return w, dequant(typ, w, n)
}

func TestDotFloat(t *testing.T) {
	forEachImpl(t, func(t *testing.T, im *impl) {
		r := rand.New(rand.NewPCG(1, 2))
		for _, n := range floatLens {
			a, b := randF32(r, n, 1), randF32(r, n, 1)
			want, mag := dotRef(a, b)
			if got := im.dotF32(a, b); !relClose(got, want, mag, floatTol) {
				t.Errorf("dotF32 n=%d: got %g, want %g (Σ|ab| %g)", n, got, want, mag)
			}
			for _, typ := range []quant.Type{quant.F16, quant.BF16} {
				w, wf := halfRow(r, typ, n)
				want, mag := dotRef(wf, b)
				dot := im.dotF16
				if typ == quant.BF16 {
					dot = im.dotBF16
				}
				if got := dot(w, b); !relClose(got, want, mag, floatTol) {
					t.Errorf("dot%s n=%d: got %g, want %g (Σ|wx| %g)", typ, n, got, want, mag)
				}
			}
		}
	})
}

// floatMat is a weight matrix in one of the float types, with its exact
// float32 values for the reference.
type floatMat struct {
	typ   quant.Type
	f32   []float32 // F32 weights
	bytes []byte    // F16 / BF16 weights
	exact []float32
}

func newFloatMat(r *rand.Rand, typ quant.Type, rows, cols int) floatMat {
	if typ == quant.F32 {
		w := randF32(r, rows*cols, 1)
		return floatMat{typ: typ, f32: w, exact: w}
	}
	w, wf := halfRow(r, typ, rows*cols)
	return floatMat{typ: typ, bytes: w, exact: wf}
}

func (m floatMat) matVec(im *impl, dst, x []float32, rows, cols int) {
	switch m.typ {
	case quant.F32:
		im.matVecF32(dst, m.f32, x, rows, cols)
	case quant.F16:
		im.matVecF16(dst, m.bytes, x, rows, cols)
	default:
		im.matVecBF16(dst, m.bytes, x, rows, cols)
	}
}

func (m floatMat) matMul(im *impl, dst []float32, ldd int, x []float32, rows, cols, tokens int) {
	m.matMulPacked(im, dst, ldd, x, nil, rows, cols, tokens)
}

// matMulPacked is matMul with activations packed beforehand (xp).
func (m floatMat) matMulPacked(im *impl, dst []float32, ldd int, x, xp []float32, rows, cols, tokens int) {
	switch m.typ {
	case quant.F32:
		im.matMulF32(dst, ldd, m.f32, x, xp, rows, cols, tokens)
	case quant.F16:
		im.matMulF16(dst, ldd, m.bytes, x, xp, rows, cols, tokens)
	default:
		im.matMulBF16(dst, ldd, m.bytes, x, xp, rows, cols, tokens)
	}
}

var floatTypes = []quant.Type{quant.F32, quant.F16, quant.BF16}

func TestMatVecFloat(t *testing.T) {
	shapes := [][2]int{{1, 1}, {1, 8}, {2, 0}, {3, 7}, {4, 8}, {5, 16}, {7, 33}, {9, 64}, {13, 100}, {17, 256}, {33, 517}, {0, 5}}
	forEachImpl(t, func(t *testing.T, im *impl) {
		r := rand.New(rand.NewPCG(3, 4))
		for _, typ := range floatTypes {
			for _, sh := range shapes {
				rows, cols := sh[0], sh[1]
				m := newFloatMat(r, typ, rows, cols)
				x := randF32(r, cols, 1)
				dst, check := guarded(rows, outSentinel)
				m.matVec(im, dst, x, rows, cols)
				check(t, "matVec dst")
				for i := range rows {
					want, mag := dotRef(m.exact[i*cols:(i+1)*cols], x)
					if !relClose(dst[i], want, mag, floatTol) {
						t.Errorf("%s %s row %d: got %g, want %g", typ, shapeName(rows, cols), i, dst[i], want)
					}
				}
			}
		}
	})
}

// checkMatMulOut checks every output of a matrix-matrix product against
// ref(t, r) and that the gaps between token rows (ldd > rows) are intact.
func checkMatMulOut(t *testing.T, what string, dst []float32, ldd, rows, tokens int,
	ref func(tok, row int) (want, mag float64), tol float64) {
	t.Helper()
	bad := 0
	for tok := range tokens {
		for i := range ldd {
			pos := tok*ldd + i
			if pos >= len(dst) {
				break
			}
			if i >= rows {
				if dst[pos] != outSentinel {
					t.Fatalf("%s: dst[%d] between token rows was overwritten", what, pos)
				}
				continue
			}
			want, mag := ref(tok, i)
			if !relClose(dst[pos], want, mag, tol) && bad < 5 {
				bad++
				t.Errorf("%s token %d row %d: got %g, want %g (scale %g)", what, tok, i, dst[pos], want, mag)
			}
		}
	}
}

func TestMatMulFloat(t *testing.T) {
	type shp struct{ rows, cols, tokens int }
	var shapes []shp
	for _, rows := range []int{1, 2, 3, 4, 5, 7, 13} {
		for _, tokens := range []int{1, 2, 3, 4, 5, 9, 17} {
			shapes = append(shapes, shp{rows, 40, tokens})
		}
	}
	shapes = append(shapes, shp{5, 13, 6}, shp{6, 8, 8}, shp{3, 0, 2}, shp{0, 8, 3}, shp{4, 8, 0},
		shp{7, 1024, 100}, shp{9, 2051, 11})
	forEachImpl(t, func(t *testing.T, im *impl) {
		r := rand.New(rand.NewPCG(5, 6))
		for _, typ := range floatTypes {
			for _, sh := range shapes {
				m := newFloatMat(r, typ, sh.rows, sh.cols)
				x := randF32(r, sh.tokens*sh.cols, 1)
				ldd := sh.rows + 3
				n := max(0, (sh.tokens-1)*ldd+sh.rows)
				dst, check := guarded(n, outSentinel)
				m.matMul(im, dst, ldd, x, sh.rows, sh.cols, sh.tokens)
				check(t, "matMul dst")
				what := typ.String() + " " + shapeName(sh.rows, sh.cols, sh.tokens)
				checkMatMulOut(t, what, dst, ldd, sh.rows, sh.tokens, func(tok, row int) (float64, float64) {
					return dotRef(m.exact[row*sh.cols:(row+1)*sh.cols], x[tok*sh.cols:(tok+1)*sh.cols])
				}, floatTol)
				// Activations packed once beforehand give the same bits.
				if pl := im.packLen(sh.cols, sh.tokens); pl > 0 {
					xp, checkXP := guarded(pl, f32Sentinel)
					im.pack(xp, x, sh.cols, sh.tokens)
					checkXP(t, "pack")
					got, check := guarded(n, outSentinel)
					m.matMulPacked(im, got, ldd, x, xp, sh.rows, sh.cols, sh.tokens)
					check(t, "packed matMul dst")
					for i := range got {
						if math.Float32bits(got[i]) != math.Float32bits(dst[i]) && !(got[i] != got[i] && dst[i] != dst[i]) {
							t.Fatalf("%s: packed beforehand, dst[%d] = %g, want %g", what, i, got[i], dst[i])
						}
					}
				}
			}
		}
	})
}

// quantBound is how far a quantized dot product may stray from the float
// one (quant.Dot with unquantized activations): each activation xᵢ is
// replaced by dq·qᵢ, off by at most half a step dq/2, plus up to 2⁻¹¹·|xᵢ|
// more for Q8_0, whose step is rounded to binary16 after the values were
// computed. Float rounding adds 1e-5·Σ|wᵢxᵢ|.
func quantBound(q qtype, w []float32, x []float32, xq []byte) float64 {
	qi := &qinfo[q]
	var b float64
	for i := range w {
		blk := i / qi.values
		var step float64
		if qi.xBytes == Q8_0Bytes || qi.xBytes == Q8_1Bytes {
			step = math.Abs(f16(xq[blk*qi.xBytes:]))
		} else {
			step = math.Abs(f32le(xq[blk*Q8_KBytes:]))
		}
		wi, xi := math.Abs(float64(w[i])), math.Abs(float64(x[i]))
		b += wi*(step/2+xi*0x1p-11) + 1e-5*wi*xi
	}
	return b
}

func TestDotQuantized(t *testing.T) {
	forEachImpl(t, func(t *testing.T, im *impl) {
		r := rand.New(rand.NewPCG(7, 8))
		for q := range numQ {
			qi := &qinfo[q]
			for _, nb := range []int{0, 1, 2, 3, 4, 5, 7, 8, 9, 16, 33} {
				for _, raw := range []bool{false, true} {
					n := nb * qi.values
					w := randWeights(r, q, nb, raw)
					x := randF32(r, n, 1)
					xq := quantizeActs(q, x)
					got := im.dotQ[q](w, xq, nb)
					want, mag := exactDot(q, w, xq, nb)
					if !relClose(got, want, mag, intTol) {
						t.Errorf("%s nb=%d raw=%v: got %g, exact %g (scale %g)", qi.name, nb, raw, got, want, mag)
					}
					if raw {
						continue
					}
					// End to end against the float path.
					wf := dequant(qtypeOf[q], w, n)
					ref := quant.Dot(qtypeOf[q], w, x)
					if bound := quantBound(q, wf, x, xq); math.Abs(float64(got-ref)) > bound {
						t.Errorf("%s nb=%d: got %g, quant.Dot %g: differ by more than the activation quantization bound %g",
							qi.name, nb, got, ref, bound)
					}
				}
			}
		}
	})
}

func TestMatVecQuantized(t *testing.T) {
	forEachImpl(t, func(t *testing.T, im *impl) {
		r := rand.New(rand.NewPCG(9, 10))
		for q := range numQ {
			qi := &qinfo[q]
			for _, rows := range []int{0, 1, 2, 3, 4, 5, 6, 7, 9, 13} {
				for _, nb := range []int{0, 1, 3} {
					w := randWeights(r, q, rows*nb, true)
					xq := quantizeActs(q, randF32(r, nb*qi.values, 1))
					dst, check := guarded(rows, outSentinel)
					im.matVecQ[q](dst, w, xq, rows, nb)
					check(t, "matVec dst")
					rb := nb * qi.wBytes
					for i := range rows {
						want, mag := exactDot(q, w[i*rb:(i+1)*rb], xq, nb)
						if !relClose(dst[i], want, mag, intTol) {
							t.Errorf("%s %s row %d: got %g, exact %g", qi.name, shapeName(rows, nb), i, dst[i], want)
						}
					}
				}
			}
		}
	})
}

func TestMatMulQuantized(t *testing.T) {
	type shp struct{ rows, nb, tokens int }
	var shapes []shp
	for _, rows := range []int{1, 2, 3, 4, 5, 7} {
		for _, tokens := range []int{1, 2, 3, 4, 5, 6, 9} {
			shapes = append(shapes, shp{rows, 2, tokens})
		}
	}
	shapes = append(shapes, shp{3, 0, 2}, shp{0, 1, 3}, shp{2, 1, 0}, shp{9, 1, 40}, shp{5, 3, 13},
		shp{3, 61, 5}, shp{2, 13, 3}) // several row chunks
	forEachImpl(t, func(t *testing.T, im *impl) {
		r := rand.New(rand.NewPCG(11, 12))
		for q := range numQ {
			qi := &qinfo[q]
			for _, sh := range shapes {
				w := randWeights(r, q, sh.rows*sh.nb, true)
				xq := quantizeActs(q, randF32(r, sh.tokens*sh.nb*qi.values, 1))
				ldd := sh.rows + 2
				dst, check := guarded(max(0, (sh.tokens-1)*ldd+sh.rows), outSentinel)
				im.matMulQ[q](dst, ldd, w, xq, sh.rows, sh.nb, sh.tokens)
				check(t, "matMul dst")
				rb, xr := sh.nb*qi.wBytes, sh.nb*qi.xBytes
				checkMatMulOut(t, qi.name+" "+shapeName(sh.rows, sh.nb, sh.tokens), dst, ldd, sh.rows, sh.tokens,
					func(tok, row int) (float64, float64) {
						return exactDot(q, w[row*rb:(row+1)*rb], xq[tok*xr:(tok+1)*xr], sh.nb)
					}, intTol)
			}
		}
	})
}

// activationData returns test rows for the quantizers: normal values of
// several magnitudes, exact zeros, values that land on rounding ties, and
// blocks with repeated extremes.
func activationData(r *rand.Rand, n int) [][]float32 {
	var rows [][]float32
	for _, scale := range []float64{1, 1e-3, 300, 1e-6} {
		rows = append(rows, randF32(r, n, scale))
	}
	zero := make([]float32, n)
	rows = append(rows, zero)
	// Multiples of 0.5 against amax 127: x·(1/d) lands on or next to .5.
	ties := make([]float32, n)
	for i := range ties {
		ties[i] = float32(int(r.IntN(255))-127) / 2
	}
	for i := 0; i < n; i += 32 {
		ties[i] = 127
	}
	rows = append(rows, ties)
	// The float32 just below (or, for Q8_K, around) a half: a rounding
	// shortcut that adds exactly ½ would round these up.
	below := make([]float32, n)
	for i := range below {
		h := float32(r.IntN(127)) + 0.5
		below[i] = math.Nextafter32(h, 0)
		if r.IntN(2) == 0 {
			below[i] = -below[i]
		}
	}
	for i := 0; i < n; i += 32 {
		below[i] = 127
	}
	rows = append(rows, below)
	// Equal magnitudes of both signs, the negative first: the first of the
	// largest must decide the sign of the Q8_K scale.
	sym := randF32(r, n, 1)
	for i := 0; i < n; i += 256 {
		sym[i+3], sym[i+100] = -5, 5
	}
	rows = append(rows, sym)
	return rows
}

func TestQuantizeQ8_0(t *testing.T) {
	forEachImpl(t, func(t *testing.T, im *impl) {
		r := rand.New(rand.NewPCG(13, 14))
		for _, x := range activationData(r, 512) {
			want := make([]byte, len(x)/32*34)
			if err := quant.Quantize(quant.Q8_0, x, want); err != nil {
				t.Fatal(err)
			}
			got, check := guarded(len(want), byteSentinel)
			im.quantQ8_0(x, got)
			check(t, "QuantizeQ8_0 dst")
			if !slices.Equal(got, want) {
				t.Fatalf("Q8_0 blocks differ from quant.Quantize (ggml's reference)")
			}
		}
	})
}

// refQ8_K is ggml's quantize_row_q8_K_ref for one block, written plainly.
func refQ8_K(x []float32) []byte {
	out := make([]byte, Q8_KBytes)
	var amax, vmax float32
	for _, v := range x {
		if a := float32(math.Abs(float64(v))); a > amax {
			amax, vmax = a, v
		}
	}
	if amax == 0 {
		return out
	}
	iscale := -127 / vmax
	for j, v := range x {
		q := int(math.RoundToEven(float64(iscale * v)))
		out[4+j] = byte(int8(min(127, q)))
	}
	for g := range 16 {
		s := 0
		for j := range 16 {
			s += int(int8(out[4+16*g+j]))
		}
		binary.LittleEndian.PutUint16(out[260+2*g:], uint16(int16(s)))
	}
	binary.LittleEndian.PutUint32(out, math.Float32bits(1/iscale))
	return out
}

func TestQuantizeQ8_K(t *testing.T) {
	forEachImpl(t, func(t *testing.T, im *impl) {
		r := rand.New(rand.NewPCG(15, 16))
		for _, x := range activationData(r, 1024) {
			got, check := guarded(len(x)/256*Q8_KBytes, byteSentinel)
			im.quantQ8_K(x, got)
			check(t, "QuantizeQ8_K dst")
			for b := range len(x) / 256 {
				want := refQ8_K(x[256*b : 256*b+256])
				if blk := got[Q8_KBytes*b : Q8_KBytes*(b+1)]; !slices.Equal(blk, want) {
					t.Fatalf("Q8_K block %d differs from ggml's reference", b)
				}
			}
			// Dequantized, every value is within half a step of x.
			for i, v := range x {
				blk := got[Q8_KBytes*(i/256):]
				d := f32le(blk)
				if dv := d * float64(int8(blk[4+i%256])); math.Abs(dv-float64(v)) > math.Abs(d)*0.5000001 {
					t.Fatalf("value %d: %g quantized to %g, step %g", i, v, dv, d)
				}
			}
		}
	})
}

func TestQuantizeNonFinite(t *testing.T) {
	bad := []float32{float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1))}
	forEachImpl(t, func(t *testing.T, im *impl) {
		for _, v := range bad {
			x := make([]float32, 512)
			for i := range x {
				x[i] = float32(i%7) - 3
			}
			x[300] = v // block 9 of Q8_0, block 1 of Q8_K
			q0 := make([]byte, 16*34)
			im.quantQ8_0(x, q0)
			for b := range 16 {
				blk := q0[34*b : 34*b+34]
				nan := binary.LittleEndian.Uint16(blk) == f16NaN && !slices.ContainsFunc(blk[2:], func(c byte) bool { return c != 0 })
				if (b == 9) != nan {
					t.Errorf("Q8_0 with %v at 300: block %d NaN-poisoned = %v", v, b, nan)
				}
			}
			qk := make([]byte, 2*Q8_KBytes)
			im.quantQ8_K(x, qk)
			if d := f32le(qk[Q8_KBytes:]); !math.IsNaN(d) || slices.ContainsFunc(qk[Q8_KBytes+4:], func(c byte) bool { return c != 0 }) {
				t.Errorf("Q8_K with %v: block 1 has d = %g, want NaN and zero values", v, d)
			}
			if d := f32le(qk); math.IsNaN(d) || d == 0 {
				t.Errorf("Q8_K with %v in block 1: block 0 has d = %g", v, d)
			}
			// The poisoned block makes the dot product NaN.
			w := toBytes(rand.New(rand.NewPCG(1, 1)), quant.Q8_0, make([]float32, 512))
			if got := im.dotQ[q8_0](w, q0, 16); !math.IsNaN(float64(got)) {
				t.Errorf("dot with a NaN-poisoned Q8_0 block = %g, want NaN", got)
			}
		}
	})
}

// The exported functions check shapes before calling the implementation.
func TestBadShapes(t *testing.T) {
	nan := func(f float32) bool { return math.IsNaN(float64(f)) }
	f := make([]float32, 64)
	b := make([]byte, 1024)
	dots := []struct {
		name string
		got  float32
	}{
		{"DotF32 lengths", DotF32(f[:3], f[:4])},
		{"DotF16 lengths", DotF16(b[:7], f[:4])},
		{"DotBF16 lengths", DotBF16(b[:8], f[:3])},
		{"DotQ8_0 n not blocks", DotQ8_0(b[:34], b[:34], 31)},
		{"DotQ8_0 short w", DotQ8_0(b[:33], b[:34], 32)},
		{"DotQ4_0 long x", DotQ4_0(b[:18], b[:35], 32)},
		{"DotQ4_K short", DotQ4_K(b[:143], b[:292], 256)},
		{"DotQ6_K negative", DotQ6_K(b[:0], b[:0], -256)},
	}
	for _, d := range dots {
		if !nan(d.got) {
			t.Errorf("%s = %g, want NaN", d.name, d.got)
		}
	}
	if got := DotF32(nil, nil); got != 0 {
		t.Errorf("DotF32 of empty slices = %g, want 0", got)
	}
	if got := DotQ4_K(nil, nil, 0); got != 0 {
		t.Errorf("DotQ4_K of no blocks = %g, want 0", got)
	}

	fills := []struct {
		name string
		run  func(dst []float32)
	}{
		{"MatVecF32 w short", func(d []float32) { MatVecF32(d, f[:15], f[:4], 4, 4) }},
		{"MatVecF32 dst len", func(d []float32) { MatVecF32(d[:3], f[:16], f[:4], 4, 4) }},
		{"MatVecF16 x len", func(d []float32) { MatVecF16(d, b[:32], f[:5], 4, 4) }},
		{"MatVecBF16 negative", func(d []float32) { MatVecBF16(d, b[:0], f[:0], -1, 0) }},
		{"MatVecQ8_0 cols", func(d []float32) { MatVecQ8_0(d, b[:34*4], b[:34], 4, 33) }},
		{"MatVecQ6_K xq", func(d []float32) { MatVecQ6_K(d, b[:210*4], b[:291], 4, 256) }},
		{"MatMulF32 ldd < rows", func(d []float32) { MatMulF32(d, 3, f[:16], f[:8], 4, 4, 2) }},
		{"MatMulF32 dst short", func(d []float32) { MatMulF32(d[:9], 6, f[:16], f[:8], 4, 4, 2) }},
		{"MatMulF16 x len", func(d []float32) { MatMulF16(d, 4, b[:32], f[:7], 4, 4, 2) }},
		{"MatMulQ4_0 w", func(d []float32) { MatMulQ4_0(d, 4, b[:18*3], b[:68], 4, 32, 2) }},
		{"MatMulQ4_K huge cols", func(d []float32) { MatMulQ4_K(d, 4, b, b, 4, math.MaxInt/256*256, 2) }},
		{"MatMulBF16 huge tokens", func(d []float32) { MatMulBF16(d, math.MaxInt/2, b[:32], f[:8], 4, 4, 3) }},
	}
	for _, fl := range fills {
		dst := make([]float32, 16)
		fl.run(dst)
		if !nan(dst[0]) {
			t.Errorf("%s: dst[0] = %g, want NaN fill", fl.name, dst[0])
		}
	}

	// Empty products touch nothing, whatever the stride.
	MatMulF32(nil, 5, nil, f[:12], 0, 4, 3)
	MatMulQ8_0(nil, 7, nil, b[:3*34], 0, 32, 3)
	MatMulBF16(nil, 5, b[:16], nil, 2, 4, 0)

	if err := QuantizeQ8_0(f[:33], b[:34]); !errors.Is(err, ErrShape) {
		t.Errorf("QuantizeQ8_0 of 33 values: error %v, want ErrShape", err)
	}
	if err := QuantizeQ8_K(f[:64], b[:292]); !errors.Is(err, ErrShape) {
		t.Errorf("QuantizeQ8_K of 64 values: error %v, want ErrShape", err)
	}
	if err := QuantizeQ8_0(nil, nil); err != nil {
		t.Errorf("QuantizeQ8_0 of nothing: %v", err)
	}
}

// The exported functions run the chosen implementation end to end.
func TestExportedAPI(t *testing.T) {
	r := rand.New(rand.NewPCG(17, 18))
	const rows, cols, tokens = 6, 512, 5
	x := randF32(r, tokens*cols, 1)
	w := randF32(r, rows*cols, 1)
	dst := make([]float32, tokens*rows)
	MatMulF32(dst, rows, w, x, rows, cols, tokens)
	mv := make([]float32, rows)
	MatVecF32(mv, w, x[:cols], rows, cols)
	for i := range rows {
		want, mag := dotRef(w[i*cols:(i+1)*cols], x[:cols])
		for _, got := range []float32{dst[i], mv[i], DotF32(w[i*cols:(i+1)*cols], x[:cols])} {
			if !relClose(got, want, mag, floatTol) {
				t.Errorf("row %d: got %g, want %g", i, got, want)
			}
		}
	}
	for q := range numQ {
		qi := &qinfo[q]
		wq := randWeights(r, q, rows*cols/qi.values, false)
		xq := make([]byte, tokens*cols/qi.values*qi.xBytes)
		var err error
		if actType(q) == quant.Q8_K {
			err = QuantizeQ8_K(x, xq)
		} else if actType(q) == quant.Q8_1 {
			err = QuantizeQ8_1(x, xq)
		} else {
			err = QuantizeQ8_0(x, xq)
		}
		if err != nil {
			t.Fatal(err)
		}
		mm := make([]float32, tokens*rows)
		mvq := make([]float32, rows)
		switch q {
		case q8_0:
			MatMulQ8_0(mm, rows, wq, xq, rows, cols, tokens)
			MatVecQ8_0(mvq, wq, xq[:cols/32*34], rows, cols)
		case q4_0:
			MatMulQ4_0(mm, rows, wq, xq, rows, cols, tokens)
			MatVecQ4_0(mvq, wq, xq[:cols/32*34], rows, cols)
		case q4_K:
			MatMulQ4_K(mm, rows, wq, xq, rows, cols, tokens)
			MatVecQ4_K(mvq, wq, xq[:cols/256*292], rows, cols)
		case q6_K:
			MatMulQ6_K(mm, rows, wq, xq, rows, cols, tokens)
			MatVecQ6_K(mvq, wq, xq[:cols/256*292], rows, cols)
		case q2_K, q3_K, q5_K, iq4_XS:
			kq2Exported[q].matMul(mm, rows, wq, xq, rows, cols, tokens)
			kq2Exported[q].matVec(mvq, wq, xq[:cols/256*292], rows, cols)
		default:
			legacyExported[q].matMul(mm, rows, wq, xq, rows, cols, tokens)
			legacyExported[q].matVec(mvq, wq, xq[:cols/32*qi.xBytes], rows, cols)
		}
		rb, xr := cols/qi.values*qi.wBytes, cols/qi.values*qi.xBytes
		for i := range rows {
			row := wq[i*rb : (i+1)*rb]
			want, mag := exactDot(q, row, xq[:xr], cols/qi.values)
			dot := [numQ]func([]byte, []byte, int) float32{DotQ8_0, DotQ4_0, DotQ4_K, DotQ6_K,
				q4_1: DotQ4_1, q5_0: DotQ5_0, q5_1: DotQ5_1, iq4_nl: DotIQ4_NL,
				q2_K: DotQ2_K, q3_K: DotQ3_K, q5_K: DotQ5_K, iq4_XS: DotIQ4_XS}[q]
			for _, got := range []float32{mm[i], mvq[i], dot(row, xq[:xr], cols)} {
				if !relClose(got, want, mag, intTol) {
					t.Errorf("%s row %d: got %g, exact %g", qi.name, i, got, want)
				}
			}
		}
	}
}

// TestDot4 checks four strided dot products at once, over float32 and
// binary16 rows, on every implementation against the float64 reference,
// with rows read from guarded buffers whose sentinels wreck any result
// that reads past them.
func TestDot4(t *testing.T) {
	forEachImpl(t, func(t *testing.T, im *impl) {
		r := rand.New(rand.NewPCG(41, 42))
		for _, typ := range []quant.Type{quant.F32, quant.F16} {
			for _, n := range []int{0, 1, 7, 8, 9, 16, 63, 64, 100, 257} {
				for _, stride := range []int{n, n + 3, 2*n + 8} {
					x := randF32(r, n, 1)
					var dst [4]float32
					var exact []float32
					if typ == quant.F32 {
						exact = randF32(r, 3*stride+n, 1)
						im.dot4F32(&dst, exact, stride, x)
					} else {
						var w []byte
						w, exact = halfRow(r, quant.F16, 3*stride+n)
						im.dot4F16(&dst, w, stride, x)
					}
					for i := range dst {
						want, mag := dotRef(exact[i*stride:i*stride+n], x)
						if d := math.Abs(float64(dst[i]) - want); !(d <= floatTol*mag+1e-6) {
							t.Fatalf("%v n=%d stride=%d row %d: %g, want %g", typ, n, stride, i, dst[i], want)
						}
					}
				}
			}
		}
	})
	var dst [4]float32
	Dot4F32(&dst, make([]float32, 10), 4, make([]float32, 4))
	if !math.IsNaN(float64(dst[3])) {
		t.Errorf("Dot4F32 with too short rows gave %v, want NaN", dst)
	}
	dst = [4]float32{}
	Dot4F16(&dst, make([]byte, 20), 4, make([]float32, 4))
	if !math.IsNaN(float64(dst[0])) {
		t.Errorf("Dot4F16 with too short rows gave %v, want NaN", dst)
	}
}

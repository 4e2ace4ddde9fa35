package vec

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/baton-serving/baton/kernels/quant"
)

// ulpDiff returns how many float32 values lie between got and want (both
// finite and of the same sign).
func ulpDiff(got, want float32) int64 {
	a, b := int64(math.Float32bits(got)), int64(math.Float32bits(want))
	if a > b {
		return a - b
	}
	return b - a
}

func TestExp32(t *testing.T) {
	r := rand.New(rand.NewPCG(21, 22))
	check := func(x float32) {
		t.Helper()
		want := float32(math.Exp(float64(x)))
		got := Exp32(x)
		if want < 0x1p-126 {
			if got != 0 && ulpDiff(got, want) > 1 {
				t.Fatalf("Exp32(%g) = %g, want %g or 0", x, got, want)
			}
			return
		}
		if d := ulpDiff(got, want); d > 1 {
			t.Fatalf("Exp32(%g) = %g, want %g (%d ulp apart)", x, got, want, d)
		}
	}
	for range 1 << 20 {
		check(float32(r.Float64()*176 - 87.3))
	}
	for _, x := range []float32{0, -0.0, 1, -1, 0.5, 88.7, 88.72283, -87.33654, 1e-8, -1e-8, float32(math.Ln2) / 2} {
		check(x)
	}
	special := []struct{ x, want float32 }{
		{float32(math.Inf(1)), float32(math.Inf(1))},
		{float32(math.Inf(-1)), 0},
		{89, float32(math.Inf(1))},
		{-88, 0},
		{-1000, 0},
	}
	for _, s := range special {
		if got := Exp32(s.x); got != s.want {
			t.Errorf("Exp32(%g) = %g, want %g", s.x, got, s.want)
		}
	}
	if got := Exp32(float32(math.NaN())); !math.IsNaN(float64(got)) {
		t.Errorf("Exp32(NaN) = %g", got)
	}
}

func TestElementwise(t *testing.T) {
	r := rand.New(rand.NewPCG(23, 24))
	for _, n := range []int{0, 1, 3, 4, 5, 8, 13, 100, 1027} {
		x, y := randF32(r, n, 1), randF32(r, n, 1)
		y0 := append([]float32(nil), y...)

		Axpy(0.75, x, y)
		for i := range y {
			// The compiler may fuse the multiply-add (GOAMD64=v3), so allow
			// the rounding of the product.
			want := float64(y0[i]) + 0.75*float64(x[i])
			if math.Abs(float64(y[i])-want) > 2.4e-7*(math.Abs(float64(y0[i]))+math.Abs(0.75*float64(x[i]))) {
				t.Fatalf("Axpy n=%d: y[%d] = %g, want %g", n, i, y[i], want)
			}
		}
		s := append([]float32(nil), x...)
		Scale(-3, s)
		for i := range s {
			if s[i] != -3*x[i] {
				t.Fatalf("Scale n=%d: [%d] = %g", n, i, s[i])
			}
		}
		dst, check := guarded(n, outSentinel)
		Add(dst, x, y0)
		check(t, "Add dst")
		for i := range dst {
			if dst[i] != x[i]+y0[i] {
				t.Fatalf("Add n=%d: [%d] = %g", n, i, dst[i])
			}
		}
		Mul(dst, x, y0)
		check(t, "Mul dst")
		for i := range dst {
			if dst[i] != x[i]*y0[i] {
				t.Fatalf("Mul n=%d: [%d] = %g", n, i, dst[i])
			}
		}
		var ss float64
		m := float32(math.Inf(-1))
		for _, v := range x {
			ss += float64(v * v)
			m = max(m, v)
		}
		if got := SumSquares(x); math.Abs(got-ss) > 1e-12*ss {
			t.Errorf("SumSquares n=%d = %g, want %g", n, got, ss)
		}
		if got := MaxF32(x); got != m {
			t.Errorf("MaxF32 n=%d = %g, want %g", n, got, m)
		}

		e, check := guarded(n, outSentinel)
		sum := ExpSum(e, x, m)
		check(t, "ExpSum dst")
		var want float64
		for i, v := range x {
			ev := math.Exp(float64(v - m))
			want += ev
			if ulpDiff(e[i], float32(ev)) > 1 {
				t.Fatalf("ExpSum n=%d: [%d] = %g, want %g", n, i, e[i], ev)
			}
		}
		if math.Abs(float64(sum)-want) > 1e-6*want {
			t.Errorf("ExpSum n=%d returned %g, want %g", n, sum, want)
		}
		sm := append([]float32(nil), x...)
		Softmax(sm)
		var total float64
		for i := range sm {
			total += float64(sm[i])
			if w := math.Exp(float64(x[i]-m)) / want; math.Abs(float64(sm[i])-w) > 1e-6*w+1e-12 {
				t.Fatalf("Softmax n=%d: [%d] = %g, want %g", n, i, sm[i], w)
			}
		}
		if n > 0 && math.Abs(total-1) > 1e-5 {
			t.Errorf("Softmax n=%d sums to %g", n, total)
		}
	}
}

func TestElementwiseEdges(t *testing.T) {
	nan := func(f float32) bool { return math.IsNaN(float64(f)) }
	if got := MaxF32(nil); !math.IsInf(float64(got), -1) {
		t.Errorf("MaxF32(nil) = %g, want -Inf", got)
	}
	if got := MaxF32([]float32{1, float32(math.NaN()), 3, 4, 5}); !nan(got) {
		t.Errorf("MaxF32 with a NaN = %g, want NaN", got)
	}
	y := []float32{1, 2, 3}
	Axpy(1, []float32{1, 2}, y)
	if !nan(y[0]) {
		t.Errorf("Axpy with mismatched lengths left y = %v, want NaN", y)
	}
	d := []float32{1, 2}
	Add(d, []float32{1, 2}, []float32{1})
	if !nan(d[0]) {
		t.Errorf("Add with mismatched lengths: %v", d)
	}
	Mul(d, []float32{1}, []float32{1, 2})
	if !nan(d[0]) {
		t.Errorf("Mul with mismatched lengths: %v", d)
	}
	if got := ExpSum(make([]float32, 2), make([]float32, 3), 0); !nan(got) {
		t.Errorf("ExpSum with mismatched lengths = %g", got)
	}
	Softmax(nil)
	one := []float32{-5}
	Softmax(one)
	if one[0] != 1 {
		t.Errorf("Softmax of one value = %g", one[0])
	}
}

func TestExpSumVariants(t *testing.T) {
	inf := float32(math.Inf(1))
	forEachImpl(t, func(t *testing.T, im *impl) {
		r := rand.New(rand.NewPCG(25, 26))
		for _, n := range []int{0, 1, 7, 8, 9, 16, 31, 100, 1027} {
			x := randF32(r, n, 30)
			// Sprinkle the special cases over the vector lanes.
			specials := []float32{inf, -inf, float32(math.NaN()), 89, -88, 88.72, -87.3, 0}
			for i := range x {
				if r.IntN(4) == 0 {
					x[i] = specials[r.IntN(len(specials))]
				}
			}
			const shift = 0.25
			dst, check := guarded(n, outSentinel)
			sum := im.expSum(dst, x, shift)
			check(t, "expSum dst")
			var want float64
			for i, v := range x {
				ref := Exp32(v - shift)
				want += float64(ref)
				got := dst[i]
				switch {
				case math.IsNaN(float64(ref)):
					if !math.IsNaN(float64(got)) {
						t.Fatalf("n=%d: exp(%g−%g) = %g, want NaN", n, v, shift, got)
					}
				case math.IsInf(float64(ref), 0) || ref == 0:
					if got != ref {
						t.Fatalf("n=%d: exp(%g−%g) = %g, want %g", n, v, shift, got, ref)
					}
				case ulpDiff(got, ref) > 1:
					t.Fatalf("n=%d: exp(%g−%g) = %g, Exp32 gives %g", n, v, shift, got, ref)
				}
			}
			if math.IsNaN(want) || math.IsInf(want, 0) {
				if float64(sum) != want && !(math.IsNaN(want) && math.IsNaN(float64(sum))) {
					t.Errorf("n=%d: sum %g, want %g", n, sum, want)
				}
			} else if math.Abs(float64(sum)-want) > 1e-5*want {
				t.Errorf("n=%d: sum %g, want %g", n, sum, want)
			}
		}
	})
}

// TestAxpy4 checks attention's weighted sum of four value rows on every
// implementation against the Go reference, bit for bit, for float32 and
// binary16 rows, with guarded buffers that catch reads and writes outside
// them.
func TestAxpy4(t *testing.T) {
	r := rand.New(rand.NewPCG(25, 26))
	for _, n := range []int{0, 1, 7, 8, 9, 16, 63, 64, 100, 1027} {
		e := &[4]float32{float32(r.Float64()), float32(r.Float64()), float32(r.Float64()), -float32(r.Float64())}
		var vf [4][]float32
		var vh [4][]byte
		for j := range 4 {
			vf[j] = randF32(r, n, 1)
			vh[j], _ = guarded(2*n, byteSentinel)
			for i, v := range randF32(r, n, 1) {
				h := quant.F32ToF16(v)
				vh[j][2*i], vh[j][2*i+1] = byte(h), byte(h>>8)
			}
		}
		y0 := randF32(r, n, 1)
		wantF, wantH := append([]float32(nil), y0...), append([]float32(nil), y0...)
		axpy4Go(wantF, e, vf[0], vf[1], vf[2], vf[3])
		axpy4F16Go(wantH, e, vh[0], vh[1], vh[2], vh[3])
		for i := range n {
			// The reference itself, element by element, rounded as
			// documented.
			ref := func(v [4]float32) float32 {
				a := float32(e[0]*v[0]) + float32(e[1]*v[1])
				b := float32(e[2]*v[2]) + float32(e[3]*v[3])
				return y0[i] + (a + b)
			}
			h := func(j int) float32 { return f16At(vh[j][2*i:]) }
			if got, want := wantF[i], ref([4]float32{vf[0][i], vf[1][i], vf[2][i], vf[3][i]}); got != want {
				t.Fatalf("n=%d: axpy4Go[%d] = %g, want %g", n, i, got, want)
			}
			if got, want := wantH[i], ref([4]float32{h(0), h(1), h(2), h(3)}); got != want {
				t.Fatalf("n=%d: axpy4F16Go[%d] = %g, want %g", n, i, got, want)
			}
		}
		for _, im := range impls() {
			for _, half := range []bool{false, true} {
				y, check := guarded(n, outSentinel)
				copy(y, y0)
				want := wantF
				if half {
					im.axpy4F16(y, e, vh[0], vh[1], vh[2], vh[3])
					want = wantH
				} else {
					im.axpy4(y, e, vf[0], vf[1], vf[2], vf[3])
				}
				check(t, im.name)
				for i := range y {
					if math.Float32bits(y[i]) != math.Float32bits(want[i]) {
						t.Fatalf("%s half=%v n=%d: y[%d] = %g, want %g", im.name, half, n, i, y[i], want[i])
					}
				}
			}
		}
	}
	y := []float32{1, 2}
	Axpy4(y, &[4]float32{}, []float32{1, 2}, []float32{1, 2}, []float32{1}, []float32{1, 2})
	if !math.IsNaN(float64(y[0])) {
		t.Errorf("Axpy4 with a short row left y = %v, want NaN", y)
	}
	y = []float32{1, 2}
	Axpy4F16(y, &[4]float32{}, make([]byte, 4), make([]byte, 4), make([]byte, 4), make([]byte, 2))
	if !math.IsNaN(float64(y[0])) {
		t.Errorf("Axpy4F16 with a short row left y = %v, want NaN", y)
	}
}

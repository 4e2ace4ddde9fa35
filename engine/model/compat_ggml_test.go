package model

import (
	"math"
	"math/big"
	"math/rand/v2"
	"testing"
)

// TestExpGGMLAccuracy bounds ggml's exponential against math.Exp: over the
// range where e^x is a normal float32 the relative error stays below
// 2.5·2⁻²³ (measured over every 13th float32 there: 1.9·2⁻²³); subnormal
// results are within one unit of 2⁻¹⁴⁹ more; beyond the range it gives 0
// and +Inf; NaN stays NaN.
func TestExpGGMLAccuracy(t *testing.T) {
	const relBound = 2.5 * 0x1p-23
	const minNormal = 0x1p-126
	check := func(x float32) {
		got, want := float64(expGGML(x)), math.Exp(float64(x))
		bound := relBound * want
		if want < minNormal {
			bound += 0x1p-149
		}
		if want > math.MaxFloat32 {
			if !math.IsInf(got, 1) {
				t.Fatalf("expGGML(%v) = %v, want +Inf", x, got)
			}
			return
		}
		if !(math.Abs(got-want) <= bound) {
			t.Fatalf("expGGML(%v) = %v, e^x = %v: error %.3g exceeds %.3g", x, got, want, math.Abs(got-want), bound)
		}
	}
	// Every 4099th float32 bit pattern from 0 up to 104, with both signs.
	for b := uint32(0); b <= math.Float32bits(104); b += 4099 {
		x := math.Float32frombits(b)
		check(x)
		check(-x)
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 100000 {
		check(float32(r.Float64()*176 - 88))
	}

	exact := []struct{ x, want float32 }{
		{0, 1},
		{float32(math.Copysign(0, -1)), 1},
		{float32(math.Inf(-1)), 0},
		{float32(math.Inf(1)), float32(math.Inf(1))},
		{-150, 0}, // 2^-216: flushed like any result below 2^-192
		{-200, 0}, // |n| > 192: zero outright
		{89, float32(math.Inf(1))},
		{300, float32(math.Inf(1))},
	}
	for _, e := range exact {
		if got := expGGML(e.x); got != e.want {
			t.Errorf("expGGML(%v) = %v, want %v", e.x, got, e.want)
		}
	}
	if got := expGGML(float32(math.NaN())); got == got {
		t.Errorf("expGGML(NaN) = %v, want NaN", got)
	}
}

// exactFMA32 is a·b+c rounded once to float32, through exact arithmetic.
func exactFMA32(a, b, c float32) float32 {
	x := new(big.Float).SetPrec(0).SetFloat64(float64(a))
	x.Mul(x, new(big.Float).SetFloat64(float64(b)))
	x.Add(x, new(big.Float).SetFloat64(float64(c)))
	f, _ := x.Float32()
	return f
}

func TestFMA32(t *testing.T) {
	// (1+2⁻¹²)² = 1 + 2⁻¹¹ + 2⁻²⁴ lies exactly halfway between two float32s;
	// adding ±2⁻⁸⁰ decides the rounding, but rounding to float64 first
	// loses it and rounds to even.
	a := float32(1 + 0x1p-12)
	tests := []struct {
		a, b, c float32
		want    float32
	}{
		{a, a, 0x1p-80, 1 + 0x1p-11 + 0x1p-23},
		{a, a, -0x1p-80, 1 + 0x1p-11},
		{-a, a, 0x1p-80, -(1 + 0x1p-11)},
		{a, a, 0, 1 + 0x1p-11}, // an exact tie: to even
		{2, 3, 4, 10},
		{float32(math.Inf(1)), 1, 1, float32(math.Inf(1))},
		{0x1p-100, 0x1p-100, 0x1p-149, 0x1p-149},                   // a subnormal result
		{0x1p100, 0x1p100, -math.MaxFloat32, float32(math.Inf(1))}, // overflow
		// 31·601 · 1801·2¹⁰³ = (2²⁵−1)·2¹⁰³ is the overflow threshold,
		// halfway between MaxFloat32 and 2¹²⁸.
		{31 * 601, 1801 * 0x1p103, -1, math.MaxFloat32},
		{31 * 601, 1801 * 0x1p103, 0, float32(math.Inf(1))},
		{-31 * 601, 1801 * 0x1p103, 1, -math.MaxFloat32},
	}
	for _, tc := range tests {
		if got := fma32(tc.a, tc.b, tc.c); got != tc.want {
			t.Errorf("fma32(%v, %v, %v) = %v, want %v", tc.a, tc.b, tc.c, got, tc.want)
		}
	}
	if naive := float32(float64(a)*float64(a) + 0x1p-80); naive == tests[0].want {
		t.Fatal("the first case does not exercise double rounding")
	}
	if got := fma32(float32(math.Inf(1)), 0, 1); got == got {
		t.Errorf("fma32(Inf, 0, 1) = %v, want NaN", got)
	}

	r := rand.New(rand.NewPCG(3, 4))
	rnd := func() float32 {
		return float32(math.Ldexp(r.Float64()*2-1, r.IntN(60)-30))
	}
	for range 20000 {
		x, y, z := rnd(), rnd(), rnd()
		// Cancellation-prone triples: c close to −a·b.
		if r.IntN(2) == 0 {
			z = -float32(x*y) * float32(1+math.Ldexp(r.Float64(), -20))
		}
		if got, want := fma32(x, y, z), exactFMA32(x, y, z); got != want {
			t.Fatalf("fma32(%v, %v, %v) = %v, want %v", x, y, z, got, want)
		}
	}
}

// TestSummationOrders pins the orders of ggml's vector sums with values
// whose sum depends on the order: 2²⁴ + 1 rounds back to 2²⁴ in float32, so
// each case's result tells which additions happened first.
func TestSummationOrders(t *testing.T) {
	const big = 0x1p24
	ones := func(n int) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = 1
		}
		return v
	}
	t.Run("hsum16", func(t *testing.T) {
		// Lanes 0 and 8 meet first, then 0 and 4, then (0+2) + (1+3): the
		// 1s in lanes 8 and 2 are absorbed by 2²⁴ in lane 0, while those in
		// lanes 1, 9, 5 and 13 meet each other first and survive as 4.
		var v [ggmlLanes]float32
		v[0] = big
		for _, l := range []int{8, 2, 1, 9, 5, 13} {
			v[l] = 1
		}
		if got := hsum16(&v); got != big+4 {
			t.Errorf("hsum16 = 2²⁴%+v, want 2²⁴+4", got-big)
		}
	})
	t.Run("vec_dot_f32", func(t *testing.T) {
		// 64 lanes' worth go through the accumulators; the 3 leftover 1s are
		// then added to 2²⁴ one by one and vanish.
		x := make([]float32, 67)
		x[0] = big
		for i := 64; i < 67; i++ {
			x[i] = 1
		}
		if got := dotVecF32(x, ones(67)); got != big {
			t.Errorf("dotVecF32 = 2²⁴%+v, want 2²⁴", got-big)
		}
		// Accumulators 0 and 2 meet first, then 1 and 3 are added: a 1 in
		// accumulator 2 is absorbed, the 1s in 1 and 3 survive as 2.
		x = make([]float32, 64)
		x[0], x[32], x[16], x[48] = big, 1, 1, 1
		if got := dotVecF32(x, ones(64)); got != big+2 {
			t.Errorf("dotVecF32 = 2²⁴%+v, want 2²⁴+2", got-big)
		}
	})
	t.Run("vec_dot_f16", func(t *testing.T) {
		// The leftovers are summed in float64: the 1s survive.
		x := make([]float32, 67)
		x[0] = big
		for i := 64; i < 67; i++ {
			x[i] = 1
		}
		if got := dotVecF16(x, ones(67)); got != big+4 {
			t.Errorf("dotVecF16 = 2²⁴%+v, want 2²⁴+4 (2²⁴+3 rounded to even)", got-big)
		}
	})
	t.Run("tinyBLAS", func(t *testing.T) {
		// One accumulator of 16 lanes: elements 1 and 17 meet in lane 1 and
		// survive as 2, where adding them to 2²⁴ one at a time would not.
		x := make([]float32, 32)
		x[0], x[1], x[17] = big, 1, 1
		if got := dotTiny(x, ones(32)); got != big+2 {
			t.Errorf("dotTiny = 2²⁴%+v, want 2²⁴+2", got-big)
		}
	})
}

package kernels

import (
	"math"
	"testing"
)

func near(a, b, tol float32) bool { return math.Abs(float64(a-b)) <= float64(tol) }

func assertSlice(t *testing.T, name string, got, want []float32, tol float32) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: len %d, want %d", name, len(got), len(want))
	}
	for i := range got {
		if !near(got[i], want[i], tol) {
			t.Fatalf("%s: [%d] = %v, want %v (all: %v, want %v)", name, i, got[i], want[i], got, want)
		}
	}
}

func TestDot(t *testing.T) {
	tests := []struct {
		a, b []float32
		want float32
	}{
		{nil, nil, 0},
		{[]float32{1, 2, 3}, []float32{4, 5, 6}, 32},
		{[]float32{1, -1}, []float32{1, 1, 99}, 0}, // b may be longer
	}
	for _, tc := range tests {
		if got := Dot(tc.a, tc.b); got != tc.want {
			t.Errorf("Dot(%v, %v) = %v, want %v", tc.a, tc.b, got, tc.want)
		}
	}
}

func TestRMSNorm(t *testing.T) {
	tests := []struct {
		name       string
		x, w, want []float32
		eps        float32
	}{
		// mean(x²) = (9+16)/2 = 12.5, rms = 3.5355339
		{"unit weight", []float32{3, 4}, []float32{1, 1}, []float32{0.8485281, 1.1313708}, 0},
		{"weights", []float32{3, 4}, []float32{2, -1}, []float32{1.6970563, -1.1313708}, 0},
		// eps dominates a zero vector instead of dividing by zero
		{"zero with eps", []float32{0, 0, 0}, []float32{1, 1, 1}, []float32{0, 0, 0}, 1e-5},
		// mean(x²) = 1, + eps 1 → rms = sqrt(2)
		{"eps", []float32{1, -1}, []float32{1, 1}, []float32{0.70710678, -0.70710678}, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dst := make([]float32, len(tc.x))
			RMSNorm(dst, tc.x, tc.w, tc.eps)
			assertSlice(t, "RMSNorm", dst, tc.want, 1e-6)
			// in place gives the same result
			x := append([]float32(nil), tc.x...)
			RMSNorm(x, x, tc.w, tc.eps)
			assertSlice(t, "RMSNorm in place", x, tc.want, 1e-6)
		})
	}
}

func TestRopeTable(t *testing.T) {
	cos := make([]float32, 2)
	sin := make([]float32, 2)
	// rotDim 4, base 100: theta_0 = pos, theta_1 = pos·100^(-1/2) = pos/10.
	RopeTable(cos, sin, 3, 100, 1, nil)
	assertSlice(t, "cos", cos, []float32{float32(math.Cos(3)), float32(math.Cos(0.3))}, 1e-7)
	assertSlice(t, "sin", sin, []float32{float32(math.Sin(3)), float32(math.Sin(0.3))}, 1e-7)

	// freqScale 0.5 halves the position; freq factors divide each angle.
	RopeTable(cos, sin, 6, 100, 0.5, []float32{1, 3})
	assertSlice(t, "cos scaled", cos, []float32{float32(math.Cos(3)), float32(math.Cos(0.1))}, 1e-7)
	assertSlice(t, "sin scaled", sin, []float32{float32(math.Sin(3)), float32(math.Sin(0.1))}, 1e-7)

	// position 0 is the identity rotation
	RopeTable(cos, sin, 0, 10000, 1, nil)
	assertSlice(t, "cos0", cos, []float32{1, 1}, 0)
	assertSlice(t, "sin0", sin, []float32{0, 0}, 0)
}

func TestRope(t *testing.T) {
	// Quarter and half turns are exact enough to check by hand.
	c := []float32{0, -1} // angles π/2, π
	s := []float32{1, 0}
	tests := []struct {
		name   string
		layout RopeLayout
		x      []float32
		want   []float32
	}{
		// pairs (1,2) by π/2 → (-2,1); (3,4) by π → (-3,-4); tail 5 untouched
		{"normal", RopeNormal, []float32{1, 2, 3, 4, 5}, []float32{-2, 1, -3, -4, 5}},
		// pairs (x0,x2)=(1,3) by π/2 → (-3,1); (x1,x3)=(2,4) by π → (-2,-4)
		{"neox", RopeNeoX, []float32{1, 2, 3, 4, 5}, []float32{-3, -2, 1, -4, 5}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			x := append([]float32(nil), tc.x...)
			Rope(x, c, s, tc.layout)
			assertSlice(t, "Rope", x, tc.want, 1e-6)
		})
	}
}

func TestRopePreservesNormAndRelativePosition(t *testing.T) {
	// RoPE is a rotation, and the dot product of two rotated vectors depends
	// only on the difference of their positions: the property attention uses.
	const d = 8
	q := []float32{0.3, -1.2, 0.5, 0.7, -0.1, 0.9, 1.1, -0.4}
	k := []float32{-0.6, 0.2, 0.8, -1.0, 0.4, 0.3, -0.7, 0.5}
	rot := func(x []float32, pos int, layout RopeLayout) []float32 {
		y := append([]float32(nil), x...)
		c, s := make([]float32, d/2), make([]float32, d/2)
		RopeTable(c, s, pos, 10000, 1, nil)
		Rope(y, c, s, layout)
		return y
	}
	for _, layout := range []RopeLayout{RopeNormal, RopeNeoX} {
		a := Dot(rot(q, 7, layout), rot(k, 3, layout))
		b := Dot(rot(q, 104, layout), rot(k, 100, layout))
		if !near(a, b, 1e-5) {
			t.Errorf("%v: q·k at (7,3) = %v, at (104,100) = %v", layout, a, b)
		}
		r := rot(q, 57, layout)
		if !near(Dot(r, r), Dot(q, q), 1e-5) {
			t.Errorf("%v: |rope(q)|² = %v, |q|² = %v", layout, Dot(r, r), Dot(q, q))
		}
	}
}

func TestSoftmax(t *testing.T) {
	tests := []struct {
		name    string
		x, want []float32
	}{
		{"empty", nil, nil},
		{"single", []float32{-3}, []float32{1}},
		{"uniform", []float32{2, 2, 2, 2}, []float32{0.25, 0.25, 0.25, 0.25}},
		// e^0 : e^ln3 = 1 : 3
		{"ratio", []float32{0, float32(math.Log(3))}, []float32{0.25, 0.75}},
		// would overflow exp without the max subtraction
		{"large", []float32{1000, 1001}, []float32{0.26894142, 0.73105858}},
		{"very negative", []float32{-1e30, 0}, []float32{0, 1}},
		{"neg inf", []float32{float32(math.Inf(-1)), 1, 1}, []float32{0, 0.5, 0.5}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			x := append([]float32(nil), tc.x...)
			Softmax(x)
			assertSlice(t, "Softmax", x, tc.want, 1e-6)
		})
	}
}

func TestSiLUMul(t *testing.T) {
	gate := []float32{0, 1, -2, 20}
	up := []float32{5, 2, 1, 0.5}
	// silu(1) = 1/(1+e^-1) = 0.7310586; silu(-2) = -2/(1+e^2) = -0.2384058;
	// silu(20) ≈ 20
	want := []float32{0, 1.4621172, -0.2384058, 9.99999998}
	dst := make([]float32, 4)
	SiLUMul(dst, gate, up)
	assertSlice(t, "SiLUMul", dst, want, 1e-6)
	SiLUMul(gate, gate, up) // in place
	assertSlice(t, "SiLUMul in place", gate, want, 1e-6)
	if got := SiLU(-100); got > 0 || got < -1e-30 {
		t.Errorf("SiLU(-100) = %v, want a tiny negative number", got)
	}
}

func TestAdd(t *testing.T) {
	a := []float32{1, 2, 3}
	Add(a, a, []float32{10, 20, 30})
	assertSlice(t, "Add", a, []float32{11, 22, 33}, 0)
}

func TestAttendHead(t *testing.T) {
	// One head of dim 4 (scale 1/2) over 2 positions, stride 4.
	q := []float32{2, 0, 0, 0}
	k := []float32{
		0, 0, 0, 0, // score 0
		float32(math.Log(3)), 0, 0, 0, // score 2·ln3/2 = ln3
	}
	v := []float32{
		1, 0, 0, 4,
		0, 1, 0, 8,
	}
	// weights 1/4, 3/4
	out := make([]float32, 4)
	AttendHead(out, q, k, v, 2, 4, make([]float32, 2))
	assertSlice(t, "AttendHead", out, []float32{0.25, 0.75, 0, 7}, 1e-6)

	// With n = 1 only the first position counts (causality is the caller's n).
	AttendHead(out, q, k, v, 1, 4, make([]float32, 1))
	assertSlice(t, "AttendHead n=1", out, []float32{1, 0, 0, 4}, 0)
}

func TestAttentionGroupedHeads(t *testing.T) {
	// 4 query heads, 2 KV heads, head dim 1 (scale 1): query heads 0,1 read KV
	// head 0 and query heads 2,3 read KV head 1.
	const n = 2
	k := []float32{
		0, 0, // pos 0: kv0, kv1
		1, -1, // pos 1
	}
	v := []float32{
		10, 100,
		20, 200,
	}
	q := []float32{0, float32(math.Log(3)), 0, float32(math.Log(3))}
	out := make([]float32, 4)
	Attention(out, q, k, v, n, 4, 2, 1, make([]float32, n))
	// head 0: scores (0,0) → 15; head 1: (0, ln3) → weights 1/4,3/4 → 17.5
	// head 2: scores (0,0) → 150; head 3: (0, -ln3) → weights 3/4,1/4 → 125
	assertSlice(t, "Attention", out, []float32{15, 17.5, 150, 125}, 1e-4)

	// Multi-head attention (nKVHeads == nHeads) maps head h to KV head h.
	k2 := []float32{0, 0, 0, 0, 1, 1, 1, 1}
	v2 := []float32{1, 2, 3, 4, 5, 6, 7, 8}
	out2 := make([]float32, 4)
	Attention(out2, []float32{0, 0, 0, 0}, k2, v2, 2, 4, 4, 1, make([]float32, 2))
	assertSlice(t, "MHA", out2, []float32{3, 4, 5, 6}, 1e-6)
}

// BenchmarkOps measures the row operations of a forward step on one
// 2048-wide row (the 1.1B shape's embedding width; 64-wide heads for
// RoPE), reporting the bytes they read and write per second:
//
//	go test -run '^$' -bench Ops .
func BenchmarkOps(b *testing.B) {
	const n, hd = 2048, 64
	x, y, w := make([]float32, n), make([]float32, n), make([]float32, n)
	for i := range x {
		x[i], y[i], w[i] = float32(i%17)*0.1-0.8, float32(i%5)*0.3-0.6, 1
	}
	dst := make([]float32, n)
	cos, sin := make([]float32, hd/2), make([]float32, hd/2)
	RopeTable(cos, sin, 17, 10000, 1, nil)
	b.Run("RMSNorm", func(b *testing.B) {
		b.SetBytes(3 * 4 * n)
		for b.Loop() {
			RMSNorm(dst, x, w, 1e-5)
		}
	})
	b.Run("Rope", func(b *testing.B) {
		b.SetBytes(2 * 4 * n)
		for b.Loop() {
			for h := 0; h < n; h += hd {
				Rope(dst[h:h+hd], cos, sin, RopeNormal)
			}
		}
	})
	b.Run("Softmax", func(b *testing.B) {
		b.SetBytes(2 * 4 * n)
		for b.Loop() {
			copy(dst, x)
			Softmax(dst)
		}
	})
	b.Run("SiLUMul", func(b *testing.B) {
		b.SetBytes(3 * 4 * n)
		for b.Loop() {
			SiLUMul(dst, x, y)
		}
	})
	b.Run("Add", func(b *testing.B) {
		b.SetBytes(3 * 4 * n)
		for b.Loop() {
			Add(dst, x, y)
		}
	})
}

package quant

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// Dot against a one-hot vector picks out one stored value, so it checks,
// value by value, that Dot reads the same layout Dequantize does.
func TestDotOneHotKnownBlocks(t *testing.T) {
	for _, kb := range knownBlocks() {
		t.Run(kb.name, func(t *testing.T) {
			x := make([]float32, len(kb.want))
			for i, want := range kb.want {
				x[i] = 1
				if got := Dot(kb.t, kb.src, x); got != want {
					t.Errorf("Dot with e_%d = %g, want %g", i, got, want)
				}
				x[i] = 0
			}
		})
	}
}

// Dot must equal the float64 dot product of the dequantized row with x to
// within float32 accumulation error, measured against Σ|wᵢxᵢ| so that
// cancellation in the sum does not make the test flaky.
func TestDotMatchesDequantized(t *testing.T) {
	const relTol = 1e-5
	r := rand.New(rand.NewPCG(21, 22))
	for _, typ := range SupportedTypes() {
		for _, n := range []int{256, 768, 4096} {
			t.Run(fmt.Sprintf("%s/%d", typ, n), func(t *testing.T) {
				w := make([]float32, n)
				x := make([]float32, n)
				for i := range w {
					w[i] = float32(r.NormFloat64())
					x[i] = float32(r.NormFloat64())
				}
				row, deq := roundTrip(t, typ, w)
				var want, mag float64
				for i := range deq {
					p := float64(deq[i]) * float64(x[i])
					want += p
					mag += math.Abs(p)
				}
				got := Dot(typ, row, x)
				if diff := math.Abs(float64(got) - want); !(diff <= relTol*mag) {
					t.Errorf("Dot = %g, float64 reference %g: difference %g > %g·Σ|wx| = %g",
						got, want, diff, relTol, relTol*mag)
				}
			})
		}
	}
}

func TestDotBadShapesReturnNaN(t *testing.T) {
	tests := []struct {
		name   string
		t      Type
		nbytes int
		n      int
	}{
		{"F32 row short", F32, 12, 4},
		{"F16 row long", F16, 10, 4},
		{"BF16 row short", BF16, 6, 4},
		{"Q8_0 partial block", Q8_0, 34, 31},
		{"Q8_0 row short", Q8_0, 33, 32},
		{"Q4_0 row long", Q4_0, 19, 32},
		{"Q4_K two blocks of x one of row", Q4_K, 144, 512},
		{"Q4_K partial block", Q4_K, 144, 255},
		{"Q6_K row short", Q6_K, 209, 256},
		{"Q6_K empty row", Q6_K, 0, 256},
		{"unsupported", IQ2_XXS, 66, 256},
		{"unknown", Type(1000), 4, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Dot(tt.t, make([]byte, tt.nbytes), make([]float32, tt.n))
			if !math.IsNaN(float64(got)) {
				t.Errorf("Dot = %g, want NaN", got)
			}
		})
	}
}

func TestDotEmpty(t *testing.T) {
	for _, typ := range SupportedTypes() {
		if got := Dot(typ, nil, nil); got != 0 {
			t.Errorf("Dot(%s) of empty row = %g, want 0", typ, got)
		}
	}
}

func TestMatVec(t *testing.T) {
	const rows, cols = 5, 512
	r := rand.New(rand.NewPCG(31, 32))
	w := make([]float32, rows*cols)
	x := make([]float32, cols)
	for i := range w {
		w[i] = float32(r.NormFloat64())
	}
	for i := range x {
		x[i] = float32(r.NormFloat64())
	}
	for _, typ := range SupportedTypes() {
		t.Run(typ.String(), func(t *testing.T) {
			q, _ := roundTrip(t, typ, w)
			rb := len(q) / rows
			dst := make([]float32, rows)
			MatVec(typ, dst, q, rows, cols, x)
			for r := range rows {
				if want := Dot(typ, q[r*rb:(r+1)*rb], x); dst[r] != want {
					t.Errorf("row %d = %g, Dot gives %g", r, dst[r], want)
				}
			}
		})
	}
}

func TestMatVecBadShapesFillNaN(t *testing.T) {
	x := make([]float32, 64)
	w := make([]byte, 3*68) // three Q8_0 rows of 64
	tests := []struct {
		name       string
		t          Type
		dst        int
		w          []byte
		rows, cols int
		x          []float32
	}{
		{"dst too long", Q8_0, 4, w, 3, 64, x},
		{"dst too short", Q8_0, 2, w, 3, 64, x},
		{"x wrong length", Q8_0, 3, w, 3, 64, x[:32]},
		{"w too short", Q8_0, 3, w[:200], 3, 64, x},
		{"cols not whole blocks", Q8_0, 3, w, 3, 60, x[:60]},
		{"negative rows", Q8_0, 0, nil, -1, 64, x},
		{"negative cols", F32, 3, nil, 3, -4, nil},
		{"rows overflow", Q8_0, 0, w, math.MaxInt / 2, 64, x},
		{"unsupported", IQ2_XXS, 3, make([]byte, 3*40), 3, 64, x},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dst := make([]float32, tt.dst)
			MatVec(tt.t, dst, tt.w, tt.rows, tt.cols, tt.x)
			for i, v := range dst {
				if !math.IsNaN(float64(v)) {
					t.Errorf("dst[%d] = %g, want NaN", i, v)
				}
			}
		})
	}
	// Zero rows is a valid, empty product.
	MatVec(Q4_K, nil, nil, 0, 256, make([]float32, 256))
}

// FuzzDot feeds arbitrary bytes, lengths and type ids to Dot and MatVec:
// they may return NaN or any number but must never panic.
func FuzzDot(f *testing.F) {
	f.Add(uint32(Q4_K), make([]byte, 144), 256)
	f.Add(uint32(Q6_K), make([]byte, 210), 256)
	f.Add(uint32(Q8_0), []byte{1, 2, 3}, 32)
	f.Add(uint32(F16), []byte{0, 0x7c, 1, 0xfc}, 2)
	f.Fuzz(func(t *testing.T, typ uint32, row []byte, n int) {
		n = min(max(n, 0), 1<<12)
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(i%7) - 3
		}
		_ = Dot(Type(typ), row, x)
		dst := make([]float32, 2)
		MatVec(Type(typ), dst, row, 2, n, x)
		out := make([]float32, n)
		_ = Dequantize(Type(typ), row, out)
	})
}

func BenchmarkDot(b *testing.B) {
	const n = 4096
	r := rand.New(rand.NewPCG(41, 42))
	w := make([]float32, n)
	x := make([]float32, n)
	for i := range w {
		w[i] = float32(r.NormFloat64())
		x[i] = float32(r.NormFloat64())
	}
	for _, typ := range SupportedTypes() {
		rb, _ := RowBytes(typ, n)
		row := make([]byte, rb)
		if err := Quantize(typ, w, row); err != nil {
			b.Fatal(err)
		}
		b.Run(typ.String(), func(b *testing.B) {
			b.SetBytes(int64(len(row)))
			var sink float32
			for b.Loop() {
				sink += Dot(typ, row, x)
			}
			if math.IsNaN(float64(sink)) {
				b.Fatal("Dot returned NaN")
			}
		})
	}
}

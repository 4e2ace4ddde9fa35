package quant

import (
	"math"
	"os"
	"path/filepath"
	"testing"
)

// kq2Types are the types of kquant2.go with their ggml test files.
var kq2Types = []struct {
	t    Type
	file string // testdata/ggml/<file>.bin and <file>.deq.f32
}{{Q2_K, "q2_K"}, {Q3_K, "q3_K"}, {Q5_K, "q5_K"}, {IQ4_XS, "iq4_xs"}}

func ggmlFile(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "ggml", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Dequantize must give ggml's dequantize_row_* values bit for bit, on
// ggml's own encodings.
func TestKQuant2DequantizeMatchesGGML(t *testing.T) {
	for _, c := range kq2Types {
		t.Run(c.t.String(), func(t *testing.T) {
			q := ggmlFile(t, c.file+".bin")
			want := readFloats(t, filepath.Join("testdata", "ggml", c.file+".deq.f32"))
			got := make([]float32, len(want))
			if err := Dequantize(c.t, q, got); err != nil {
				t.Fatal(err)
			}
			for i := range got {
				if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
					t.Fatalf("value %d = %g, ggml %g", i, got[i], want[i])
				}
			}
		})
	}
}

// Dot against a one-hot vector picks out one stored value: Dot reads the
// layout Dequantize does, value by value, on ggml's encodings (which use
// every level and both signs of the scales).
func TestKQuant2DotOneHot(t *testing.T) {
	for _, c := range kq2Types {
		t.Run(c.t.String(), func(t *testing.T) {
			q := ggmlFile(t, c.file+".bin")
			deq := make([]float32, len(q)/c.t.BlockBytes()*256)
			if err := Dequantize(c.t, q, deq); err != nil {
				t.Fatal(err)
			}
			x := make([]float32, len(deq))
			for i, want := range deq {
				x[i] = 1
				got := Dot(c.t, q, x)
				// Dot applies d and dmin once per block, so the one value
				// is computed in another order: allow float32 rounding.
				if math.Abs(float64(got-want)) > 1e-6*math.Abs(float64(want))+1e-9 {
					t.Errorf("Dot with e_%d = %g, want %g", i, got, want)
				}
				x[i] = 0
			}
		})
	}
}

// Hand-built blocks whose values follow from the layout written out in
// kquant2.go's comment, independently of the decoding code.
func TestKQuant2KnownBlocks(t *testing.T) {
	// Q2_K: d = 1, dmin = 0.5; sub-block s has scale s%16 and min
	// (15−s); value i has level (i·5) mod 4.
	q2 := make([]byte, 84)
	want2 := make([]float32, 256)
	for s := range 16 {
		q2[s] = byte(s) | byte(15-s)<<4
	}
	for i := range 256 {
		h, k, l := i/128, i%128/32, i%32
		lv := (i * 5) % 4
		q2[16+32*h+l] |= byte(lv) << (2 * k)
		want2[i] = float32(i/16)*float32(lv) - 0.5*float32(15-i/16)
	}
	put16(q2, 80, f16One)
	put16(q2, 82, f16Half)

	// Q3_K: d = 0.25; sub-block s has stored scale 4s+3 (signed scale
	// 4s−29); value i has 3-bit level (3i+1) mod 8, stored as q = level
	// with the high bit set meaning "no −4".
	q3 := make([]byte, 110)
	want3 := make([]float32, 256)
	for s := range 16 {
		v := 4*s + 3
		if s < 8 {
			q3[96+s] |= byte(v & 0xf)
		} else {
			q3[96+s-8] |= byte(v&0xf) << 4
		}
		q3[96+8+s%4] |= byte(v>>4) << (2 * (s / 4))
	}
	for i := range 256 {
		h, k, l := i/128, i%128/32, i%32
		lv := (3*i + 1) % 8 // 0..7 = stored value, decoded lv − 4
		q3[32+32*h+l] |= byte(lv&3) << (2 * k)
		if lv >= 4 {
			q3[l] |= 1 << (4*h + k)
		}
		want3[i] = 0.25 * float32(4*(i/16)-29) * float32(lv-4)
	}
	put16(q3, 108, f16Quart)

	// Q5_K: d = 0.5, dmin = 0.25, the Q4_K scales of the Q4_K test;
	// value i has level (7i+3) mod 32.
	q5 := make([]byte, 176)
	want5 := make([]float32, 256)
	put16(q5, 0, f16Half)
	put16(q5, 2, f16Quart)
	copy(q5[4:], q4kPacked[:])
	for i := range 256 {
		c, l := i/64, i%64
		lv := (7*i + 3) % 32
		if l < 32 {
			q5[48+32*c+l] |= byte(lv & 0xf)
		} else {
			q5[48+32*c+l-32] |= byte(lv&0xf) << 4
		}
		if lv >= 16 {
			q5[16+l%32] |= 1 << (2*c + l/32)
		}
		want5[i] = 0.5*float32(q4kSc[i/32])*float32(lv) - 0.25*float32(q4kMin[i/32])
	}

	// IQ4_XS: d = 0.125; sub-block s has stored scale 9s (signed 9s−32);
	// value i has index (5i+2) mod 16.
	iq := make([]byte, 136)
	wantIQ := make([]float32, 256)
	put16(iq, 0, f16Eighth)
	var h uint16
	for s := range 8 {
		v := 9 * s // 0, 9, …, 63
		iq[4+s/2] |= byte(v&0xf) << (4 * (s % 2))
		h |= uint16(v>>4) << (2 * s)
	}
	put16(iq, 2, h)
	for i := range 256 {
		s, j := i/32, i%32
		idx := (5*i + 2) % 16
		if j < 16 {
			iq[8+16*s+j] |= byte(idx)
		} else {
			iq[8+16*s+j-16] |= byte(idx) << 4
		}
		wantIQ[i] = 0.125 * float32(9*s-32) * float32(iq4nlValues[idx])
	}

	for _, kb := range []knownBlock{
		{"Q2_K", Q2_K, q2, want2}, {"Q3_K", Q3_K, q3, want3},
		{"Q5_K", Q5_K, q5, want5}, {"IQ4_XS", IQ4_XS, iq, wantIQ},
	} {
		t.Run(kb.name, func(t *testing.T) {
			got := make([]float32, 256)
			if err := Dequantize(kb.t, kb.src, got); err != nil {
				t.Fatal(err)
			}
			for i := range got {
				if got[i] != kb.want[i] {
					t.Fatalf("value %d = %g, want %g", i, got[i], kb.want[i])
				}
			}
		})
	}
}

func TestKQuant2BadLengths(t *testing.T) {
	for _, c := range kq2Types {
		bb := c.t.BlockBytes()
		if err := Dequantize(c.t, make([]byte, bb+1), make([]float32, 256)); err == nil {
			t.Errorf("Dequantize(%s) of %d bytes for 256 values: no error", c.t, bb+1)
		}
		if got := Dot(c.t, make([]byte, bb), make([]float32, 512)); !math.IsNaN(float64(got)) {
			t.Errorf("Dot(%s) of one block with 512 values = %g, want NaN", c.t, got)
		}
		if got := Dot(c.t, make([]byte, bb-1), make([]float32, 256)); !math.IsNaN(float64(got)) {
			t.Errorf("Dot(%s) of a short block = %g, want NaN", c.t, got)
		}
	}
}

// Finite but extreme inputs (near float32's range, subnormals, one huge
// value among tiny ones) must encode without a panic to blocks that
// decode; where ggml's own arithmetic overflows, the result may hold
// infinities or NaNs, as ggml's would.
func TestKQuant2QuantizeExtremes(t *testing.T) {
	rows := map[string]func(i int) float32{
		"max":        func(i int) float32 { return float32(1-2*(i%2)) * math.MaxFloat32 },
		"subnormal":  func(i int) float32 { return float32(i%7-3) * 0x1p-149 },
		"one huge":   func(i int) float32 { return map[bool]float32{true: 3e38, false: 1e-30}[i == 77] },
		"alternates": func(i int) float32 { return float32(i%3-1) * 1e30 },
	}
	for _, c := range kq2Types {
		for name, f := range rows {
			x := make([]float32, 512)
			for i := range x {
				x[i] = f(i)
			}
			q := make([]byte, 2*c.t.BlockBytes())
			if err := Quantize(c.t, x, q); err != nil {
				t.Errorf("%s %s: %v", c.t, name, err)
				continue
			}
			if err := Dequantize(c.t, q, make([]float32, 512)); err != nil {
				t.Errorf("%s %s: %v", c.t, name, err)
			}
			_ = Dot(c.t, q, x)
		}
	}
}

package quant

import (
	"math"
	"math/rand/v2"
	"testing"
)

func isF16NaN(h uint16) bool { return h&0x7c00 == 0x7c00 && h&0x3ff != 0 }

func sameFloat(a, b float32) bool {
	if math.IsNaN(float64(a)) || math.IsNaN(float64(b)) {
		return math.IsNaN(float64(a)) && math.IsNaN(float64(b))
	}
	return math.Float32bits(a) == math.Float32bits(b) // distinguishes ±0
}

func TestF16ToF32Known(t *testing.T) {
	tests := []struct {
		h    uint16
		want float32
	}{
		{0x0000, 0},
		{0x8000, float32(math.Copysign(0, -1))},
		{0x3c00, 1},
		{0xc000, -2},
		{0x3555, 0.333251953125},
		{0x7bff, 65504},
		{0x0400, 0x1p-14},   // smallest normal
		{0x03ff, 0x3ffp-24}, // largest subnormal
		{0x0001, 0x1p-24},   // smallest subnormal
		{0x8001, -0x1p-24},
		{0x7c00, float32(math.Inf(1))},
		{0xfc00, float32(math.Inf(-1))},
		{0x7e00, float32(math.NaN())},
	}
	for _, tt := range tests {
		if got := F16ToF32(tt.h); !sameFloat(got, tt.want) {
			t.Errorf("F16ToF32(%#04x) = %g (%#08x), want %g", tt.h, got, math.Float32bits(got), tt.want)
		}
	}
}

func TestF16NaNStaysQuietNaN(t *testing.T) {
	for _, h := range []uint16{0x7c01, 0x7d00, 0x7e00, 0x7fff, 0xfc01, 0xfe00} {
		f := F16ToF32(h)
		b := math.Float32bits(f)
		if !math.IsNaN(float64(f)) || b&0x400000 == 0 || b>>31 != uint32(h>>15) {
			t.Errorf("F16ToF32(%#04x) = %#08x, want a quiet NaN with the same sign", h, b)
		}
		back := F32ToF16(f)
		if back != h&0x8000|0x7e00 {
			t.Errorf("F32ToF16(F16ToF32(%#04x)) = %#04x, want %#04x", h, back, h&0x8000|0x7e00)
		}
	}
}

// Every binary16 value widens exactly, so narrowing it again must give the
// same bits back.
func TestF16RoundTripExhaustive(t *testing.T) {
	for i := range 1 << 16 {
		h := uint16(i)
		if isF16NaN(h) {
			continue
		}
		if got := F32ToF16(F16ToF32(h)); got != h {
			t.Fatalf("F32ToF16(F16ToF32(%#04x)) = %#04x", h, got)
		}
	}
}

// For every pair of adjacent binary16 values the midpoint (exact in
// float32, which has 13 more mantissa bits) must round to the even one, and
// the float32 values either side of it to the nearer one.
func TestF32ToF16RoundsToNearestEven(t *testing.T) {
	for i := range 0x7bff {
		for _, sign := range []uint16{0, 0x8000} {
			lo, hi := uint16(i)|sign, uint16(i+1)|sign
			mid64 := (float64(F16ToF32(lo)) + float64(F16ToF32(hi))) / 2
			mid := float32(mid64)
			if float64(mid) != mid64 {
				t.Fatalf("midpoint of %#04x and %#04x is not a float32", lo, hi)
			}
			even := lo
			if lo&1 == 1 {
				even = hi
			}
			// Towards lo's side means towards zero.
			below := math.Float32frombits(math.Float32bits(mid) - 1)
			above := math.Float32frombits(math.Float32bits(mid) + 1)
			for _, c := range []struct {
				f    float32
				want uint16
			}{{mid, even}, {below, lo}, {above, hi}} {
				if got := F32ToF16(c.f); got != c.want {
					t.Fatalf("F32ToF16(%g) = %#04x, want %#04x (between %#04x and %#04x)", c.f, got, c.want, lo, hi)
				}
			}
		}
	}
}

func TestF32ToF16Edges(t *testing.T) {
	tests := []struct {
		name string
		f    float32
		want uint16
	}{
		{"max", 65504, 0x7bff},
		{"below overflow tie", math.Nextafter32(65520, 0), 0x7bff},
		{"overflow tie rounds to even Inf", 65520, 0x7c00},
		{"large", 1e10, 0x7c00},
		{"negative large", -1e10, 0xfc00},
		{"max float32", math.MaxFloat32, 0x7c00},
		{"+Inf", float32(math.Inf(1)), 0x7c00},
		{"-Inf", float32(math.Inf(-1)), 0xfc00},
		{"NaN", float32(math.NaN()), 0x7e00},
		{"negative NaN", math.Float32frombits(0xffc00001), 0xfe00},
		{"signalling NaN", math.Float32frombits(0x7f800001), 0x7e00},
		{"half smallest subnormal ties to zero", 0x1p-25, 0x0000},
		{"just above half smallest subnormal", math.Nextafter32(0x1p-25, 1), 0x0001},
		{"negative tiny", -0x1p-26, 0x8000},
		{"float32 subnormal", math.SmallestNonzeroFloat32, 0x0000},
		{"smallest subnormal", 0x1p-24, 0x0001},
		{"subnormal tie 1.5 units rounds to 2", 0x3p-25, 0x0002},
		{"subnormal tie 2.5 units rounds to 2", 0x5p-25, 0x0002},
		{"largest subnormal rounds up to smallest normal", 0x3ff8p-28, 0x0400},
		{"negative zero", float32(math.Copysign(0, -1)), 0x8000},
		{"one third", 1.0 / 3, 0x3555},
	}
	for _, tt := range tests {
		if got := F32ToF16(tt.f); got != tt.want {
			t.Errorf("%s: F32ToF16(%g) = %#04x, want %#04x", tt.name, tt.f, got, tt.want)
		}
	}
}

func TestBF16Known(t *testing.T) {
	tests := []struct {
		name string
		bits uint32 // float32 input
		want uint16
	}{
		{"one", 0x3f800000, 0x3f80},
		{"tie to even (down)", 0x3f808000, 0x3f80},
		{"tie to even (up)", 0x3f818000, 0x3f82},
		{"above tie", 0x3f808001, 0x3f81},
		{"below tie", 0x3f807fff, 0x3f80},
		{"negative", 0xc0400000, 0xc040},
		{"max float32 overflows", 0x7f7fffff, 0x7f80},
		{"tie above largest bf16 rounds to even Inf", 0x7f7f8000, 0x7f80},
		{"just below that tie", 0x7f7f7fff, 0x7f7f},
		{"+Inf", 0x7f800000, 0x7f80},
		{"-Inf", 0xff800000, 0xff80},
		{"quiet NaN", 0x7fc00000, 0x7fc0},
		{"signalling NaN with low payload only", 0x7f800001, 0x7fc0},
		{"negative signalling NaN keeps top payload", 0xffa00000, 0xffe0},
		{"subnormal", 0x00010000, 0x0001},
		{"negative zero", 0x80000000, 0x8000},
	}
	for _, tt := range tests {
		if got := F32ToBF16(math.Float32frombits(tt.bits)); got != tt.want {
			t.Errorf("%s: F32ToBF16(%#08x) = %#04x, want %#04x", tt.name, tt.bits, got, tt.want)
		}
	}
}

func TestBF16RoundTripExhaustive(t *testing.T) {
	for i := range 1 << 16 {
		h := uint16(i)
		f := BF16ToF32(h)
		if math.Float32bits(f) != uint32(h)<<16 {
			t.Fatalf("BF16ToF32(%#04x) = %#08x", h, math.Float32bits(f))
		}
		got := F32ToBF16(f)
		if h&0x7f80 == 0x7f80 && h&0x7f != 0 {
			if got != h|0x40 {
				t.Fatalf("F32ToBF16 of NaN %#04x = %#04x, want %#04x", h, got, h|0x40)
			}
			continue
		}
		if got != h {
			t.Fatalf("F32ToBF16(BF16ToF32(%#04x)) = %#04x", h, got)
		}
	}
}

// On random finite inputs F32ToBF16 must pick the nearer of the two
// bfloat16 neighbours, the even one on a tie.
func TestF32ToBF16Nearest(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for range 200000 {
		b := r.Uint32()
		if b&0x7f800000 == 0x7f800000 {
			continue
		}
		f := float64(math.Float32frombits(b))
		down := uint16(b >> 16) // truncation: the neighbour towards zero
		up := down + 1
		dd := math.Abs(f - float64(BF16ToF32(down)))
		upVal := float64(BF16ToF32(up))
		if math.IsInf(upVal, 0) {
			// Rounding treats the exponent as unbounded: 2¹²⁸ and beyond
			// become Inf only afterwards.
			upVal = math.Copysign(0x1p128, f)
		}
		du := math.Abs(upVal - f)
		want := down
		if du < dd || du == dd && down&1 == 1 {
			want = up
		}
		if got := F32ToBF16(float32(f)); got != want {
			t.Fatalf("F32ToBF16(%#08x) = %#04x, want %#04x", b, got, want)
		}
	}
}

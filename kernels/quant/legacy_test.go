package quant

import (
	"encoding/binary"
	"math"
	"path/filepath"
	"testing"
)

var legacyTypes = []Type{Q4_1, Q5_0, Q5_1, IQ4_NL}

// legacyFiles names ggml's encodings of input.f32, in the order of the
// rows of legacy_deq.f32 (see testdata/ggml/README.md).
var legacyFiles = []string{"q4_1.bin", "q5_0.bin", "q5_1.bin", "iq4_nl.bin"}

// Hand-built blocks, one per type, with the values ggml's layout says they
// hold; scales are powers of two, so every value is exact.
func TestDequantizeLegacyKnownBlocks(t *testing.T) {
	// Level of value i (0..31): q(i) = (5i+3) mod 32, nibble q&15, fifth
	// bit q>>4.
	var q [32]int
	var qs [16]byte
	var qh uint32
	for i := range q {
		q[i] = (5*i + 3) % 32
		if i < 16 {
			qs[i] |= byte(q[i] & 15)
		} else {
			qs[i-16] |= byte(q[i]&15) << 4
		}
		qh |= uint32(q[i]>>4) << i
	}
	block := func(head ...byte) []byte { return append(append([]byte{}, head...), qs[:]...) }
	le32 := binary.LittleEndian.AppendUint32(nil, qh)
	half, quart := []byte{0x00, 0x38}, []byte{0x00, 0x34} // 0.5, 0.25
	negTwo := []byte{0x00, 0xc0}                          // −2
	cases := []struct {
		t    Type
		src  []byte
		want func(i int) float32
	}{
		{Q4_1, block(append(half, negTwo...)...), func(i int) float32 { return 0.5*float32(q[i]&15) - 2 }},
		{Q5_0, block(append(quart, le32...)...), func(i int) float32 { return 0.25 * float32(q[i]-16) }},
		{Q5_1, block(append(append(half, negTwo...), le32...)...), func(i int) float32 { return 0.5*float32(q[i]) - 2 }},
		{IQ4_NL, block(quart...), func(i int) float32 { return 0.25 * float32(iq4nlValues[q[i]&15]) }},
	}
	for _, c := range cases {
		if len(c.src) != c.t.BlockBytes() {
			t.Fatalf("%s: test block has %d bytes, want %d", c.t, len(c.src), c.t.BlockBytes())
		}
		got := make([]float32, 32)
		if err := Dequantize(c.t, c.src, got); err != nil {
			t.Fatal(err)
		}
		for i := range got {
			if got[i] != c.want(i) {
				t.Errorf("%s value %d = %g, want %g", c.t, i, got[i], c.want(i))
			}
		}
	}
}

// Dequantize must give ggml's values bit for bit on ggml's encodings (both
// recorded in testdata/ggml; TestQuantizeMatchesGGML checks the encodings).
func TestLegacyDequantizeMatchesGGML(t *testing.T) {
	dir := filepath.Join("testdata", "ggml")
	x := readFloats(t, filepath.Join(dir, "input.f32"))
	deq := readFloats(t, filepath.Join(dir, "legacy_deq.f32"))
	for i, typ := range legacyTypes {
		t.Run(typ.String(), func(t *testing.T) {
			want := ggmlFile(t, legacyFiles[i])
			y := make([]float32, len(x))
			if err := Dequantize(typ, want, y); err != nil {
				t.Fatal(err)
			}
			for j, v := range y {
				if w := deq[i*len(x)+j]; math.Float32bits(v) != math.Float32bits(w) {
					t.Fatalf("value %d dequantized to %g, ggml's dequantize_row gives %g", j, v, w)
				}
			}
		})
	}
}

// Dot against the float64 dot product of the dequantized row: only float32
// rounding may separate them.
func TestDotLegacy(t *testing.T) {
	for _, ds := range testData(1024) {
		for _, typ := range legacyTypes {
			q, y := roundTrip(t, typ, ds.x)
			var want, mag float64
			for i, v := range y {
				p := float64(v) * float64(ds.x[i])
				want += p
				mag += math.Abs(p)
			}
			if got := Dot(typ, q, ds.x); math.Abs(float64(got)-want) > 1e-5*mag {
				t.Errorf("%s %s: Dot = %g, want %g", typ, ds.name, got, want)
			}
			if got := Dot(typ, q[:len(q)-1], ds.x); !math.IsNaN(float64(got)) {
				t.Errorf("%s: Dot of a short row = %g, want NaN", typ, got)
			}
		}
	}
}

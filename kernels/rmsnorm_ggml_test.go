package kernels

import (
	"encoding/binary"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/baton-serving/baton/kernels/quant"
)

func readGGMLF32(t *testing.T, name string) []float32 {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("quant", "testdata", "ggml", name))
	if err != nil {
		t.Fatal(err)
	}
	v := make([]float32, len(b)/4)
	for i := range v {
		v[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return v
}

// TestRMSNormMatchesGGML checks RMSNorm (and the CPU backend's) bit for bit
// against ggml-cpu's rms_norm followed by the weight multiplication
// (quant/testdata/ggml/rms_norm.f32, see its README). Last-bit agreement
// matters because the norm feeds the activation quantizers of quantized
// weights: rows of a quantized token embedding normalize to values exactly
// on Q8_K rounding ties, where one ulp decides the rounded value, and a
// changed activation value then moves every product of the row by far more
// than rounding.
func TestRMSNormMatchesGGML(t *testing.T) {
	const n, rows = 256, 9
	in := readGGMLF32(t, "input.f32")
	q6, err := os.ReadFile(filepath.Join("quant", "testdata", "ggml", "q6_K.bin"))
	if err != nil {
		t.Fatal(err)
	}
	x := make([]float32, rows*n)
	copy(x, in)
	if err := quant.Dequantize(quant.Q6_K, q6, x[4*n:8*n]); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		x[8*n+i] = in[i] * 4096
	}
	ones := make([]float32, n)
	for i := range ones {
		ones[i] = 1
	}
	want := readGGMLF32(t, "rms_norm.f32")
	if len(want) != 2*rows*n {
		t.Fatalf("rms_norm.f32 holds %d values, want %d", len(want), 2*rows*n)
	}
	cpu := NewCPU(1)
	defer cpu.Close()
	for wi, w := range [][]float32{ones, in[2*n : 3*n]} {
		got := make([]float32, rows*n)
		for r := range rows {
			RMSNorm(got[r*n:(r+1)*n], x[r*n:(r+1)*n], w, 1e-5)
		}
		bx, bw, bd := mustBuf(t, cpu, x), mustBuf(t, cpu, w), mustBuf(t, cpu, make([]float32, rows*n))
		if err := cpu.RMSNorm(bd, bx, bw, 1e-5); err != nil {
			t.Fatal(err)
		}
		back := make([]float32, rows*n)
		if err := cpu.Read(back, bd); err != nil {
			t.Fatal(err)
		}
		for name, g := range map[string][]float32{"RMSNorm": got, "CPU.RMSNorm": back} {
			bad := 0
			for i := range g {
				if math.Float32bits(g[i]) != math.Float32bits(want[wi*rows*n+i]) {
					if bad == 0 {
						t.Errorf("%s, weight %d: row %d value %d = %.9g, ggml %.9g", name, wi, i/n, i%n, g[i], want[wi*rows*n+i])
					}
					bad++
				}
			}
			if bad > 0 {
				t.Errorf("%s, weight %d: %d of %d values differ from ggml's", name, wi, bad, len(g))
			}
		}
	}
}

func mustBuf(t *testing.T, b Backend, v []float32) Buffer {
	t.Helper()
	buf, err := b.Alloc(len(v))
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Write(buf, v); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Free(buf) })
	return buf
}

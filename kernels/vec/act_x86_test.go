package vec

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/baton-serving/baton/kernels/quant"
)

// x86Q8Value is one value of ggml's x86 Q8_0/Q8_1 quantizer, which llama.cpp
// builds for every x86-64 CPU with AVX: the product p = v·(127/amax) rounded
// to nearest, ties to even, converted by cvtps2dq (a NaN or a value beyond
// int32 becomes math.MinInt32) and saturated to int8 by the packs. It
// returns the int32 too, which Q8_1 sums before the packing.
func x86Q8Value(p float32) (int8, int32) {
	r := math.RoundToEven(float64(p))
	i := int32(math.MinInt32)
	if !math.IsNaN(r) && r >= math.MinInt32 && r <= math.MaxInt32 {
		i = int32(r)
	}
	return int8(max(-128, min(127, i))), i
}

// x86Q8_0 is ggml's x86 quantize_row_q8_0 for one finite block, written
// plainly; with s it is quantize_row_q8_1 (s = binary16(d·Σq)).
func x86Q8_0(x []float32, withS bool) []byte {
	var amax float32
	for _, v := range x {
		amax = max(amax, float32(math.Abs(float64(v))))
	}
	d := amax / 127
	var id float32
	if amax != 0 {
		id = 127 / amax
	}
	out := binary.LittleEndian.AppendUint16(nil, quant.F32ToF16(d))
	var sum int32
	var qs []byte
	for _, v := range x {
		q, i := x86Q8Value(v * id)
		qs = append(qs, byte(q))
		sum += i
	}
	if withS {
		out = binary.LittleEndian.AppendUint16(out, quant.F32ToF16(float32(sum)*d))
	}
	return append(out, qs...)
}

// TestActivationsMatchNativeGGML checks every implementation's activation
// quantizers byte for byte against llama.cpp's native x86 build
// (kernels/quant/testdata/ggml/act_gen.c, see the README there): the
// reversed input.f32 and act_edge.f32, whose blocks tell the x86 formula
// (id = 127/amax, ties to even) from ggml's scalar reference
// (id = 1/(amax/127), ties away from zero) and hold tiny values whose
// 127/amax is +Inf.
func TestActivationsMatchNativeGGML(t *testing.T) {
	floats := func(b []byte) []float32 {
		f := make([]float32, len(b)/4)
		for i := range f {
			f[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
		}
		return f
	}
	in := floats(ggmlTestdata(t, "input.f32"))
	slices.Reverse(in)
	inputs := []struct {
		name, prefix string
		x            []float32
	}{
		{"input.f32 reversed", "act_", in},
		{"act_edge.f32", "act_edge_", floats(ggmlTestdata(t, "act_edge.f32"))},
	}
	quantizers := []struct {
		typ        string
		blockVals  int
		blockBytes int
		run        func(im *impl) func([]float32, []byte)
	}{
		{"q8_0", Q8_0Values, Q8_0Bytes, func(im *impl) func([]float32, []byte) { return im.quantQ8_0 }},
		{"q8_1", Q8_1Values, Q8_1Bytes, func(im *impl) func([]float32, []byte) { return im.quantQ8_1 }},
		{"q8_K", Q8_KValues, Q8_KBytes, func(im *impl) func([]float32, []byte) { return im.quantQ8_K }},
	}
	forEachImpl(t, func(t *testing.T, im *impl) {
		for _, in := range inputs {
			for _, q := range quantizers {
				want := ggmlTestdata(t, in.prefix+q.typ+".bin")
				got, check := guarded(len(in.x)/q.blockVals*q.blockBytes, byteSentinel)
				q.run(im)(in.x, got)
				check(t, q.typ)
				if len(got) != len(want) {
					t.Fatalf("%s %s: %d bytes, ggml wrote %d", in.name, q.typ, len(got), len(want))
				}
				var bad []int
				for b := range len(want) / q.blockBytes {
					if !slices.Equal(got[b*q.blockBytes:(b+1)*q.blockBytes], want[b*q.blockBytes:(b+1)*q.blockBytes]) {
						bad = append(bad, b)
					}
				}
				if len(bad) > 0 {
					t.Errorf("%s %s: blocks %v (of %d) differ from llama.cpp's native x86 build", in.name, q.typ, bad, len(want)/q.blockBytes)
				}
			}
		}
	})
}

// TestX86ModelMatchesGGML checks the plain model x86Q8_0 of this file
// against the recorded blocks, so that the randomized tests that use it
// test the formula llama.cpp runs.
func TestX86ModelMatchesGGML(t *testing.T) {
	b := ggmlTestdata(t, "act_edge.f32")
	x := make([]float32, len(b)/4)
	for i := range x {
		x[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	w0, w1 := ggmlTestdata(t, "act_edge_q8_0.bin"), ggmlTestdata(t, "act_edge_q8_1.bin")
	for blk := range len(x) / 32 {
		if got := x86Q8_0(x[32*blk:32*blk+32], false); !slices.Equal(got, w0[34*blk:34*blk+34]) {
			t.Errorf("Q8_0 block %d: model %x, ggml %x", blk, got, w0[34*blk:34*blk+34])
		}
		if got := x86Q8_0(x[32*blk:32*blk+32], true); !slices.Equal(got, w1[36*blk:36*blk+36]) {
			t.Errorf("Q8_1 block %d: model %x, ggml %x", blk, got, w1[36*blk:36*blk+36])
		}
	}
}

// TestQuantizeQ8Ties checks the rounding of exact halves, where the x86
// formula (ties to even) and ggml's scalar reference (ties away from zero)
// differ: with amax = 127 the scale is 1 in both, so 2.5 becomes 2, −3.5
// becomes −4 and 0.5 becomes 0.
func TestQuantizeQ8Ties(t *testing.T) {
	x := make([]float32, 32)
	x[0] = 127
	x[1], x[2], x[3], x[4] = 2.5, -3.5, 0.5, -0.5
	want := []int8{127, 2, -4, 0, 0}
	forEachImpl(t, func(t *testing.T, im *impl) {
		q0, q1 := make([]byte, Q8_0Bytes), make([]byte, Q8_1Bytes)
		im.quantQ8_0(x, q0)
		im.quantQ8_1(x, q1)
		for j, w := range want {
			if g0, g1 := int8(q0[2+j]), int8(q1[4+j]); g0 != w || g1 != w {
				t.Errorf("value %g: Q8_0 %d, Q8_1 %d, want %d", x[j], g0, g1, w)
			}
		}
	})
}

// TestQuantizeQ8MatchesX86Model runs every implementation over random
// activations against x86Q8_0.
func TestQuantizeQ8MatchesX86Model(t *testing.T) {
	forEachImpl(t, func(t *testing.T, im *impl) {
		r := rand.New(rand.NewPCG(31, 32))
		for _, x := range activationData(r, 512) {
			q0, q1 := make([]byte, len(x)/32*Q8_0Bytes), make([]byte, len(x)/32*Q8_1Bytes)
			im.quantQ8_0(x, q0)
			im.quantQ8_1(x, q1)
			for b := range len(x) / 32 {
				if w := x86Q8_0(x[32*b:32*b+32], false); !slices.Equal(q0[34*b:34*b+34], w) {
					t.Fatalf("Q8_0 block %d: %x, want %x", b, q0[34*b:34*b+34], w)
				}
				if w := x86Q8_0(x[32*b:32*b+32], true); !slices.Equal(q1[36*b:36*b+36], w) {
					t.Fatalf("Q8_1 block %d: %x, want %x", b, q1[36*b:36*b+36], w)
				}
			}
		}
	})
}

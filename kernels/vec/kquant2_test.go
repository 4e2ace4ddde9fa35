package vec

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/baton-serving/baton/kernels/quant"
)

// exactKQ2 adds one block of a Q2_K, Q3_K, Q5_K or IQ4_XS row (wb, from
// the block's first byte) times one Q8_K block (xb) to exactDot's sums,
// decoding ggml's layouts from scratch, value by value, sharing only
// refScalesK4 with exactDot and none of the package's code.
func exactKQ2(q qtype, wb, xb []byte, add func(scale float64, isum, iabs int64)) {
	abs := func(v int64) int64 { return max(v, -v) }
	xd := f32le(xb)
	x := func(i int) int64 { return int64(int8(xb[4+i])) }
	var isum, iabs, msum, mabs int64
	switch q {
	case q2_K:
		for i := range 256 {
			h, k, l := i/128, i%128/32, i%32
			lv := int64(wb[16+32*h+l] >> (2 * k) & 3)
			sc, m := int64(wb[i/16]&15), int64(wb[i/16]>>4)
			isum += sc * lv * x(i)
			iabs += abs(sc * lv * x(i))
			msum += m * x(i)
			mabs += abs(m * x(i))
		}
		add(f16(wb[80:])*xd, isum, iabs)
		add(-f16(wb[82:])*xd, msum, mabs)
	case q3_K:
		for i := range 256 {
			h, k, l := i/128, i%128/32, i%32
			lv := int64(wb[32+32*h+l] >> (2 * k) & 3)
			if wb[l]>>(4*h+k)&1 == 0 {
				lv -= 4
			}
			s := i / 16
			var raw byte
			if s < 8 {
				raw = wb[96+s] & 15
			} else {
				raw = wb[96+s-8] >> 4
			}
			raw |= (wb[96+8+s%4] >> (2 * (s / 4)) & 3) << 4
			sc := int64(raw) - 32
			isum += sc * lv * x(i)
			// The kernels may add the unsigned levels 0..7 and take 4·Σx
			// off separately: both enter their partial sums.
			iabs += abs(sc*lv*x(i)) + abs(sc*4*x(i))
		}
		add(f16(wb[108:])*xd, isum, iabs)
	case q5_K:
		sc, mn := refScalesK4(wb[4:16])
		for i := range 256 {
			c, l := i/64, i%64
			byt := wb[48+32*c+l%32]
			lv := int64(byt & 15)
			if l >= 32 {
				lv = int64(byt >> 4)
			}
			lv |= int64(wb[16+l%32]>>(2*c+l/32)&1) << 4
			isum += sc[i/32] * lv * x(i)
			iabs += abs(sc[i/32] * lv * x(i))
			msum += mn[i/32] * x(i)
			mabs += abs(mn[i/32] * x(i))
		}
		add(f16(wb)*xd, isum, iabs)
		add(-f16(wb[2:])*xd, msum, mabs)
	case iq4_XS:
		levels := [16]int64{-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113}
		h := binary.LittleEndian.Uint16(wb[2:])
		for i := range 256 {
			s, j := i/32, i%32
			byt := wb[8+16*s+j%16]
			idx := byt & 15
			if j >= 16 {
				idx = byt >> 4
			}
			ls := int64(wb[4+s/2]>>(4*(s%2))&15) | int64(h>>(2*s)&3)<<4
			p := (ls - 32) * levels[idx] * x(i)
			isum += p
			iabs += abs(p)
		}
		add(f16(wb)*xd, isum, iabs)
	}
}

// kq2Scales gives randWeights' raw blocks modest finite binary16 scales.
func kq2Scales(q qtype, base int, scale func(off int)) {
	switch q {
	case q2_K:
		scale(base + 80)
		scale(base + 82)
	case q3_K:
		scale(base + 108)
	case q5_K:
		scale(base)
		scale(base + 2)
	case iq4_XS:
		scale(base)
	}
}

// kq2Exported are the exported products of each type, for TestExportedAPI.
var kq2Exported = map[qtype]struct {
	matMul func(dst []float32, ldd int, w, xq []byte, rows, cols, tokens int)
	matVec func(dst []float32, w, xq []byte, rows, cols int)
}{
	q2_K:   {MatMulQ2_K, MatVecQ2_K},
	q3_K:   {MatMulQ3_K, MatVecQ3_K},
	q5_K:   {MatMulQ5_K, MatVecQ5_K},
	iq4_XS: {MatMulIQ4_XS, MatVecIQ4_XS},
}

func ggmlTestdata(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "quant", "testdata", "ggml", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// ggmlDots reads vec_dot_q8_K.txt: per type, ggml's dot product of each
// block and of the whole row.
func ggmlDots(t *testing.T) map[string][]float32 {
	t.Helper()
	out := map[string][]float32{}
	sc := bufio.NewScanner(bytes.NewReader(ggmlTestdata(t, "vec_dot_q8_K.txt")))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 || strings.HasPrefix(f[0], "#") {
			continue
		}
		for _, s := range f[1:] {
			v, err := strconv.ParseFloat(s, 32)
			if err != nil {
				t.Fatalf("vec_dot_q8_K.txt: %v", err)
			}
			out[f[0]] = append(out[f[0]], float32(v))
		}
	}
	return out
}

// Against ggml itself: every implementation quantizes the activations to
// ggml's Q8_K bytes, and its dot products of ggml's encodings with them
// agree with ggml_vec_dot_<type>_q8_K, block by block and over the row
// (see kernels/quant/testdata/ggml/README.md), to float32 rounding of the
// partial sums.
func TestKQuant2DotMatchesGGML(t *testing.T) {
	raw := ggmlTestdata(t, "input.f32")
	x := make([]float32, len(raw)/4)
	for i := range x {
		x[i] = math.Float32frombits(binary.LittleEndian.Uint32(raw[4*(len(x)-1-i):]))
	}
	wantQ := ggmlTestdata(t, "act_q8_K.bin")
	dots := ggmlDots(t)
	files := map[qtype]string{q2_K: "q2_K", q3_K: "q3_K", q5_K: "q5_K", iq4_XS: "iq4_xs"}
	forEachImpl(t, func(t *testing.T, im *impl) {
		xq := make([]byte, len(wantQ))
		im.quantQ8_K(x, xq)
		if !bytes.Equal(xq, wantQ) {
			t.Fatal("Q8_K activations differ from ggml's quantize_row_q8_K_ref")
		}
		for _, q := range []qtype{q2_K, q3_K, q5_K, iq4_XS} {
			qi := &qinfo[q]
			w := ggmlTestdata(t, files[q]+".bin")
			want := dots[files[q]]
			nb := len(w) / qi.wBytes
			if len(want) != nb+1 {
				t.Fatalf("%s: %d ggml dot products, want %d", qi.name, len(want), nb+1)
			}
			check := func(what string, w, xq []byte, nb int, ggml float32) {
				got := im.dotQ[q](w, xq, nb)
				exact, mag := exactDot(q, w, xq, nb)
				if !relClose(got, float64(ggml), mag, intTol) || !relClose(ggml, exact, mag, intTol) {
					t.Errorf("%s %s: got %g, ggml %g, exact %g (scale %g)", qi.name, what, got, ggml, exact, mag)
				}
			}
			for b := range nb {
				check("block "+strconv.Itoa(b), w[b*qi.wBytes:(b+1)*qi.wBytes], xq[b*Q8_KBytes:(b+1)*Q8_KBytes], 1, want[b])
			}
			check("row", w, xq, nb, want[nb])
		}
	})
}

// TestActivationTypeEveryQType checks that [ActivationType] knows every
// quantized weight type the package has kernels for, and names the
// activation block that the kernels read (its size is qinfo's xBytes): the
// engine quantizes activations by it, so a type it misses would be fed the
// wrong blocks.
func TestActivationTypeEveryQType(t *testing.T) {
	for q := range numQ {
		qi := &qinfo[q]
		act, ok := ActivationType(qtypeOf[q])
		if !ok {
			t.Errorf("ActivationType(%s) not ok", qi.name)
			continue
		}
		if n, err := quant.RowBytes(act, uint64(qi.values)); err != nil || n != uint64(qi.xBytes) {
			t.Errorf("ActivationType(%s) = %s: %d bytes per %d values (%v), the kernels read %d",
				qi.name, act, n, qi.values, err, qi.xBytes)
		}
	}
}

package kernels

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/baton-serving/baton/kernels/internal/kerneltest"
	"github.com/baton-serving/baton/kernels/quant"
)

// The extended operations (ExtendedOps) are tested against straightforward
// float64 references, and GELU against ggml's own output.

var _ ExtendedOps = (*CPU)(nil)

// closeTo fails unless got and want have the same length and each got[i]
// is want[i] (the same infinity, or a NaN where want has one) or within
// tol of it, naming only the first element that is not.
func closeTo(t testing.TB, name string, got, want []float32, tol float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: len %d, want %d", name, len(got), len(want))
	}
	for i, w := range want {
		g := got[i]
		if g == w || (w != w && g != g) || math.Abs(float64(g)-float64(w)) <= tol {
			continue
		}
		t.Fatalf("%s: [%d] = %v, want %v (of %d)", name, i, g, w, len(want))
	}
}

// ggmlGELUDigest is the SHA-256 of ggml_gelu's results (c392e50, CPU
// backend, built with -O3 -march=native by gcc 12.2 on x86-64) over every
// binary16 value that is not a NaN, taken as an F32 input, in order of the
// binary16 bits, each result as 4 little-endian bytes. docs/kernels.md
// ("Extended operations") gives the program that printed it.
const ggmlGELUDigest = "8ebf59c5946ac49d0bba5e5230711f2e3e3b5d0d98ea0d778f3097de16a73def"

func TestGELUMatchesGGML(t *testing.T) {
	h := sha256.New()
	var b [4]byte
	for i := range 1 << 16 {
		if i&0x7c00 == 0x7c00 && i&0x3ff != 0 {
			continue // NaN payloads are not part of the contract
		}
		binary.LittleEndian.PutUint32(b[:], math.Float32bits(GELU(quant.F16ToF32(uint16(i)))))
		h.Write(b[:])
	}
	if got := fmt.Sprintf("%x", h.Sum(nil)); got != ggmlGELUDigest {
		t.Errorf("GELU over every binary16 value: digest %s, want ggml's %s", got, ggmlGELUDigest)
	}
	// Values ggml_gelu gave on the same build, including the tails it
	// does not look up.
	for _, c := range []struct{ x, want float32 }{
		{0, 0}, {1, 0.84130859375}, {-1, -0.1588134765625}, {0.5, 0.345703125},
		{-10, 0}, {-10.5, 0}, {10, 10}, {12.25, 12.25}, {-3, -0.0036373138427734375},
	} {
		if got := GELU(c.x); got != c.want {
			t.Errorf("GELU(%v) = %v, want %v", c.x, got, c.want)
		}
	}
	if !math.IsNaN(float64(GELU(float32(math.NaN())))) {
		t.Error("GELU(NaN) is not NaN")
	}
}

// geluExact is the tanh approximation of GELU in float64.
func geluExact(x float64) float64 {
	return 0.5 * x * (1 + math.Tanh(math.Sqrt(2/math.Pi)*x*(1+0.044715*x*x)))
}

func TestGELUNearFormula(t *testing.T) {
	rng := rand.New(rand.NewPCG(31, 32))
	for range 10000 {
		x := (2*rng.Float64() - 1) * 12
		got, want := float64(GELU(float32(x))), geluExact(x)
		// Two binary16 roundings (of x and of the result) and the slope
		// of GELU, at most ~1.13.
		if tol := 2.5e-3*math.Abs(want) + 1.2*math.Abs(x)*1e-3 + 1e-7; math.Abs(got-want) > tol {
			t.Fatalf("GELU(%v) = %v, formula %v", x, got, want)
		}
	}
}

func TestCPUGELUMul(t *testing.T) {
	rng := rand.New(rand.NewPCG(33, 34))
	for _, n := range []int{1, 7, 300, 5000} {
		c := newTestCPU(t, 3)
		g := kerneltest.RandFloats(rng, n, 12)
		if n > 4 {
			g[0], g[1], g[2], g[3] = -10, 10, -40, 40
		}
		u := kerneltest.RandFloats(rng, n, 2)
		want := make([]float32, n)
		for i := range want {
			want[i] = GELU(g[i]) * u[i]
		}
		for _, alias := range []string{"none", "gate", "up"} {
			gb, ub := mustUpload(t, c, g), mustUpload(t, c, u)
			dst := gb
			switch alias {
			case "none":
				dst, _ = c.Alloc(n)
			case "up":
				dst = ub
			}
			if err := c.GELUMul(dst, gb, ub); err != nil {
				t.Fatal(err)
			}
			closeTo(t, fmt.Sprintf("n=%d dst=%s", n, alias), mustRead(t, c, dst), want, 0)
		}
	}
}

func TestCPUScaleAndSoftCap(t *testing.T) {
	rng := rand.New(rand.NewPCG(35, 36))
	c := newTestCPU(t, 2)
	const n = 4099
	x := kerneltest.RandFloats(rng, n, 100)
	x[0], x[1], x[2], x[3] = 1e30, -1e30, float32(math.Inf(1)), float32(math.Inf(-1))
	xb := mustUpload(t, c, x)
	dst, _ := c.Alloc(n)
	if err := c.Scale(dst, xb, -0.125); err != nil {
		t.Fatal(err)
	}
	want := make([]float32, n)
	for i, v := range x {
		want[i] = -0.125 * v
	}
	closeTo(t, "scale", mustRead(t, c, dst), want, 0)
	if err := c.Scale(xb, xb, 3); err != nil { // in place
		t.Fatal(err)
	}
	for i, v := range x {
		want[i] = 3 * v
	}
	closeTo(t, "scale in place", mustRead(t, c, xb), want, 0)

	for _, cap := range []float32{30, 50, 0.5} {
		xb := mustUpload(t, c, x)
		if err := c.SoftCap(xb, cap); err != nil {
			t.Fatal(err)
		}
		got := mustRead(t, c, xb)
		for i, v := range x {
			w := float64(cap) * math.Tanh(float64(v)/float64(cap))
			if math.Abs(float64(got[i])-w) > 2e-7*float64(cap) || math.Abs(float64(got[i])) > float64(cap) {
				t.Fatalf("softcap %v of %v = %v, want %v", cap, v, got[i], w)
			}
		}
		if got[0] != cap || got[1] != -cap || got[2] != cap || got[3] != -cap {
			t.Errorf("softcap %v of huge scores: %v", cap, got[:4])
		}
	}
}

func TestCPUExtendedOpsRejectBadOperands(t *testing.T) {
	c := newTestCPU(t, 1)
	other := newTestCPU(t, 1)
	a, _ := c.Alloc(8)
	b, _ := c.Alloc(8)
	foreign, _ := other.Alloc(8)
	freed, _ := c.Alloc(8)
	if err := c.Free(freed); err != nil {
		t.Fatal(err)
	}
	l := KVLayout{Layers: 1, KVHeads: 1, HeadDim: 4, PageSize: 2, DType: quant.F32}
	kv, _ := c.NewKVCache(l, 2)
	otherKV, _ := other.NewKVCache(l, 2)
	row := []AttnRow{{Pages: []int32{0}, Len: 2}}
	q, out := a.Slice(0, 4), b.Slice(0, 4)
	nan := float32(math.NaN())
	tests := []struct {
		name string
		err  error
		op   func() error
	}{
		{"gelu lengths", ErrShape, func() error { return c.GELUMul(a, a, b.Slice(0, 4)) }},
		{"gelu foreign", ErrForeign, func() error { return c.GELUMul(a, foreign, b) }},
		{"gelu freed", ErrForeign, func() error { return c.GELUMul(freed, a, b) }},
		// The output split over the pool in blocks must be its inputs or apart
		// from them: at an offset, one block would read what another wrote.
		{"gelu output overlaps gate", ErrShape, func() error { return c.GELUMul(a.Slice(0, 4), a.Slice(2, 6), b.Slice(0, 4)) }},
		{"gelu output overlaps up", ErrShape, func() error { return c.GELUMul(a.Slice(2, 6), b.Slice(0, 4), a.Slice(0, 4)) }},
		{"gelu in place on gate", nil, func() error { return c.GELUMul(a, a, b) }},
		{"gelu in place on up", nil, func() error { return c.GELUMul(b, a, b) }},
		{"gelu gate and up overlapping", nil, func() error { return c.GELUMul(b.Slice(0, 4), a.Slice(0, 4), a.Slice(2, 6)) }},
		{"scale lengths", ErrShape, func() error { return c.Scale(a.Slice(0, 3), b, 2) }},
		{"scale partly in place", ErrShape, func() error { return c.Scale(a.Slice(0, 4), a.Slice(2, 6), 2) }},
		{"scale foreign", ErrForeign, func() error { return c.Scale(a, foreign, 2) }},
		{"softcap zero", ErrShape, func() error { return c.SoftCap(a, 0) }},
		{"softcap negative", ErrShape, func() error { return c.SoftCap(a, -1) }},
		{"softcap NaN", ErrShape, func() error { return c.SoftCap(a, nan) }},
		{"softcap infinite", ErrShape, func() error { return c.SoftCap(a, float32(math.Inf(1))) }},
		{"softcap freed", ErrForeign, func() error { return c.SoftCap(freed, 1) }},
		// 1/c overflows float32 below about 2.9e-39, and 0·Inf is NaN.
		{"softcap with an infinite reciprocal", ErrShape, func() error { return c.SoftCap(a, 1e-39) }},
		{"softcap smallest with a finite reciprocal", nil, func() error { return c.SoftCap(a, 3e-39) }},
		{"attend softcap with an infinite reciprocal", ErrShape, func() error {
			return c.AttentionWith(out, q, kv, 0, row, AttnOptions{SoftCap: 1e-39})
		}},
		{"attend window negative", ErrShape, func() error { return c.AttentionWith(out, q, kv, 0, row, AttnOptions{Window: -1}) }},
		{"attend softcap negative", ErrShape, func() error { return c.AttentionWith(out, q, kv, 0, row, AttnOptions{SoftCap: -2}) }},
		{"attend softcap NaN", ErrShape, func() error { return c.AttentionWith(out, q, kv, 0, row, AttnOptions{SoftCap: nan}) }},
		{"attend scale NaN", ErrShape, func() error { return c.AttentionWith(out, q, kv, 0, row, AttnOptions{Scale: nan}) }},
		{"attend scale infinite", ErrShape, func() error {
			return c.AttentionWith(out, q, kv, 0, row, AttnOptions{Scale: float32(math.Inf(-1))})
		}},
		{"attend foreign KV", ErrForeign, func() error { return c.AttentionWith(out, q, otherKV, 0, row, AttnOptions{Window: 1}) }},
		{"attend foreign queries", ErrForeign, func() error { return c.AttentionWith(out, foreign.Slice(0, 4), kv, 0, row, AttnOptions{}) }},
		{"attend past the pages", ErrShape, func() error {
			return c.AttentionWith(out, q, kv, 0, []AttnRow{{Pages: []int32{0}, Len: 3}}, AttnOptions{Window: 1})
		}},
		{"attend a missing page in the window", ErrShape, func() error {
			return c.AttentionWith(out, q, kv, 0, []AttnRow{{Pages: []int32{0, 5}, Len: 3}}, AttnOptions{Window: 2})
		}},
		{"attend a negative page in the window", ErrShape, func() error {
			return c.AttentionWith(out, q, kv, 0, []AttnRow{{Pages: []int32{-1, 1}, Len: 4}}, AttnOptions{Window: 3})
		}},
		{"attend ragged queries", ErrShape, func() error { return c.AttentionWith(out, a.Slice(0, 3), kv, 0, row, AttnOptions{}) }},
		{"attend in place", ErrShape, func() error { return c.AttentionWith(q, q, kv, 0, row, AttnOptions{Window: 1}) }},
		{"attend layer", ErrShape, func() error { return c.AttentionWith(out, q, kv, 1, row, AttnOptions{Window: 1}) }},
	}
	for _, tc := range tests {
		if err := tc.op(); !errors.Is(err, tc.err) {
			t.Errorf("%s: err %v, want %v", tc.name, err, tc.err)
		}
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.GELUMul(a, a, b); !errors.Is(err, ErrClosed) {
		t.Errorf("GELUMul after Close: err %v, want ErrClosed", err)
	}
	if err := c.AttentionWith(out, q, kv, 0, row, AttnOptions{}); !errors.Is(err, ErrClosed) {
		t.Errorf("AttentionWith after Close: err %v, want ErrClosed", err)
	}
}

// attendRef is one head's attention with options over positions of
// contiguous rows k and v (stride elements apart, this head's elements at
// off), in float64: the definition the CPU backend is checked against.
func attendRef(q, k, v []float32, n, stride, off int, o AttnOptions) []float32 {
	d := len(q)
	scale := float64(o.Scale)
	if scale == 0 {
		scale = 1 / math.Sqrt(float64(d))
	}
	lo := 0
	if o.Window > 0 {
		lo = max(0, n-o.Window)
	}
	s := make([]float64, n)
	m := math.Inf(-1)
	for t := lo; t < n; t++ {
		var dot float64
		for i := range d {
			dot += float64(q[i]) * float64(k[t*stride+off+i])
		}
		s[t] = dot * scale
		if o.SoftCap > 0 {
			s[t] = float64(o.SoftCap) * math.Tanh(s[t]/float64(o.SoftCap))
		}
		m = max(m, s[t])
	}
	var sum float64
	for t := lo; t < n; t++ {
		s[t] = math.Exp(s[t] - m)
		sum += s[t]
	}
	out := make([]float32, d)
	for i := range d {
		var acc float64
		for t := lo; t < n; t++ {
			acc += s[t] * float64(v[t*stride+off+i])
		}
		out[i] = float32(acc / sum)
	}
	return out
}

// pagedSeq is one sequence of n positions stored in a fresh cache of
// pages of pageSize positions, in a scattered order, with its keys and
// values as they came back from the cache (F16 rounded).
type pagedSeq struct {
	kv    KVCache
	l     KVLayout
	table []int32
	k, v  []float32
}

func newPagedSeq(t testing.TB, c *CPU, rng *rand.Rand, l KVLayout, n int, kScale float32) pagedSeq {
	t.Helper()
	np := (n + l.PageSize - 1) / l.PageSize
	kv, err := c.NewKVCache(l, np+1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.FreeKVCache(kv) })
	s := pagedSeq{kv: kv, l: l, table: make([]int32, np)}
	// Pages in reverse order, skipping page 0.
	for i := range s.table {
		s.table[i] = int32(np - i)
	}
	re := l.RowElems()
	s.k = kerneltest.RandFloats(rng, n*re, kScale)
	s.v = kerneltest.RandFloats(rng, n*re, 1)
	slots := make([]int32, n)
	for p := range slots {
		slots[p] = s.table[p/l.PageSize]*int32(l.PageSize) + int32(p%l.PageSize)
	}
	kb, vb := c.Wrap(s.k), c.Wrap(s.v)
	if err := c.StoreKV(kv, 0, slots, kb, vb); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, re*KVElemSize(l.DType))
	for _, x := range [][]float32{s.k, s.v} { // as stored
		for p := range n {
			EncodeKV(buf, x[p*re:(p+1)*re], l.DType)
			DecodeKV(x[p*re:(p+1)*re], buf, l.DType)
		}
	}
	return s
}

// TestCPUAttentionWith checks AttentionWith against attendRef for every
// kernels/vec implementation the CPU has (AVX2's windows that start inside
// a group of positions do not run on an AVX-512 machine otherwise).
func TestCPUAttentionWith(t *testing.T) {
	forEachVecImpl(t, testCPUAttentionWith)
}

func testCPUAttentionWith(t *testing.T) {
	rng := rand.New(rand.NewPCG(37, 38))
	const hd, kvHeads, heads = 16, 2, 6
	opts := []AttnOptions{
		{}, {Scale: 0.03}, {Scale: 1, SoftCap: 50}, {SoftCap: 5},
		{Window: 1}, {Window: 2}, {Window: 3}, {Window: 4}, {Window: 5}, {Window: 9}, {Window: 10}, {Window: 1000},
		{Window: 7, Scale: 0.5, SoftCap: 20},
	}
	for _, dtype := range []quant.Type{quant.F32, quant.F16} {
		for _, ps := range []int{1, 3, 4, 16} {
			t.Run(fmt.Sprintf("%s/page=%d", dtype, ps), func(t *testing.T) {
				c := newTestCPU(t, 3)
				l := KVLayout{Layers: 1, KVHeads: kvHeads, HeadDim: hd, PageSize: ps, DType: dtype}
				s := newPagedSeq(t, c, rng, l, 37, 2)
				// Windows start mid-page, on page boundaries and before
				// position 0; rows end mid-page and on a boundary.
				var rows []AttnRow
				for _, n := range []int{1, 4, 13, 16, 37} {
					rows = append(rows, AttnRow{Pages: s.table, Len: n})
				}
				q := kerneltest.RandFloats(rng, len(rows)*heads*hd, 1)
				qb := mustUpload(t, c, q)
				out, _ := c.Alloc(len(q))
				plain, _ := c.Alloc(len(q))
				if err := c.Attention(plain, qb, s.kv, 0, rows); err != nil {
					t.Fatal(err)
				}
				for _, o := range opts {
					if err := c.AttentionWith(out, qb, s.kv, 0, rows, o); err != nil {
						t.Fatal(err)
					}
					got := mustRead(t, c, out)
					if o == (AttnOptions{}) {
						closeTo(t, "AttnOptions{} against Attention", got, mustRead(t, c, plain), 0)
					}
					for i, r := range rows {
						for h := range heads {
							off := (i*heads + h) * hd
							want := attendRef(q[off:off+hd], s.k, s.v, r.Len, l.RowElems(), (h/(heads/kvHeads))*hd, o)
							closeTo(t, fmt.Sprintf("%+v row %d head %d", o, i, h), got[off:off+hd], want, 2e-5)
						}
					}
				}
			})
		}
	}
}

// With F32 pages, a windowed result is the same bit for bit however the
// sequence is paged, as Attention's is.
func TestCPUAttentionWithPagingInvariant(t *testing.T) {
	const hd, n = 32, 45
	var first []float32
	for _, ps := range []int{1, 2, 3, 4, 5, 8, 16, 64} {
		c := newTestCPU(t, 2)
		rng := rand.New(rand.NewPCG(39, 40)) // the same data each time
		l := KVLayout{Layers: 1, KVHeads: 1, HeadDim: hd, PageSize: ps, DType: quant.F32}
		s := newPagedSeq(t, c, rng, l, n, 2)
		q := kerneltest.RandFloats(rng, 2*hd, 1)
		out, _ := c.Alloc(len(q))
		var got []float32
		for _, w := range []int{1, 6, 17, 30} {
			rows := []AttnRow{{Pages: s.table, Len: n}, {Pages: s.table, Len: n - 3}}
			if err := c.AttentionWith(out, mustUpload(t, c, q), s.kv, 0, rows, AttnOptions{Window: w, SoftCap: 10}); err != nil {
				t.Fatal(err)
			}
			got = append(got, mustRead(t, c, out)...)
		}
		if first == nil {
			first = got
			continue
		}
		closeTo(t, fmt.Sprintf("page size %d against 1", ps), got, first, 0)
	}
}

// Pages wholly before a row's window are not read: their ids are not even
// checked, so a sequence may release them.
func TestCPUAttentionWithSkipsPagesBeforeWindow(t *testing.T) {
	rng := rand.New(rand.NewPCG(41, 42))
	const hd = 8
	c := newTestCPU(t, 1)
	l := KVLayout{Layers: 1, KVHeads: 1, HeadDim: hd, PageSize: 4, DType: quant.F32}
	s := newPagedSeq(t, c, rng, l, 22, 1)
	q := kerneltest.RandFloats(rng, hd, 1)
	qb := mustUpload(t, c, q)
	out, _ := c.Alloc(hd)
	// Window 9 over 22 positions starts at 13, in the fourth page (12…15).
	table := append([]int32(nil), s.table...)
	table[0], table[1], table[2] = -1, 1<<30, -7
	o := AttnOptions{Window: 9}
	if err := c.AttentionWith(out, qb, s.kv, 0, []AttnRow{{Pages: table, Len: 22}}, o); err != nil {
		t.Fatal(err)
	}
	closeTo(t, "window over released pages", mustRead(t, c, out), attendRef(q, s.k, s.v, 22, hd, 0, o), 2e-5)
	// The page the window starts in is read.
	table[3] = -1
	if err := c.AttentionWith(out, qb, s.kv, 0, []AttnRow{{Pages: table, Len: 22}}, o); !errors.Is(err, ErrShape) {
		t.Errorf("window starting in a released page: err %v, want ErrShape", err)
	}
}

// Soft-capping keeps scores that would overflow the softmax finite, and
// the result is the capped one.
func TestCPUAttentionWithSoftCapHugeScores(t *testing.T) {
	rng := rand.New(rand.NewPCG(43, 44))
	const hd = 16
	c := newTestCPU(t, 1)
	l := KVLayout{Layers: 1, KVHeads: 1, HeadDim: hd, PageSize: 4, DType: quant.F32}
	s := newPagedSeq(t, c, rng, l, 10, 1e15)
	q := kerneltest.RandFloats(rng, hd, 1e15) // scores ~1e30
	out, _ := c.Alloc(hd)
	o := AttnOptions{SoftCap: 30, Scale: 1}
	if err := c.AttentionWith(out, mustUpload(t, c, q), s.kv, 0, []AttnRow{{Pages: s.table, Len: 10}}, o); err != nil {
		t.Fatal(err)
	}
	got := mustRead(t, c, out)
	for i, v := range got {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			t.Fatalf("element %d is %v", i, v)
		}
	}
	closeTo(t, "capped huge scores", got, attendRef(q, s.k, s.v, 10, hd, 0, o), 2e-5)
}

// BenchmarkAttentionWindow is one decoding step's attention over an
// 8192-token sequence (8 query heads over 2 KV heads of 128, F16 pages of
// 16): all of it, and a window of the last 4096 positions, which reads
// half the pages.
func BenchmarkAttentionWindow(b *testing.B) {
	const n, hd, heads = 8192, 128, 8
	c := NewCPU(1)
	defer c.Close()
	rng := rand.New(rand.NewPCG(45, 46))
	l := KVLayout{Layers: 1, KVHeads: 2, HeadDim: hd, PageSize: 16, DType: quant.F16}
	s := newPagedSeq(b, c, rng, l, n, 1)
	q := c.Wrap(kerneltest.RandFloats(rng, heads*hd, 1))
	out := c.Wrap(make([]float32, heads*hd))
	rows := []AttnRow{{Pages: s.table, Len: n}}
	for _, w := range []int{0, 4096} {
		name := "full"
		if w > 0 {
			name = fmt.Sprintf("window=%d", w)
		}
		b.Run(name, func(b *testing.B) {
			o := AttnOptions{Window: w}
			read := len(s.table) - WindowStart(n, w)/l.PageSize
			for b.Loop() {
				if err := c.AttentionWith(out, q, s.kv, 0, rows, o); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(read), "pages/op")
			b.ReportMetric(float64(len(s.table)-read), "skipped-pages/op")
		})
	}
}

// BenchmarkAttentionPrefill is a 1024-token prompt's attention, each
// query row over the positions up to its own (8 query heads over 2 KV
// heads of 64, pages of 16): Attention, AttentionWith with no options
// (the same), and with a soft-cap and a window.
func BenchmarkAttentionPrefill(b *testing.B) {
	const n, hd, heads = 1024, 64, 8
	for _, dtype := range []quant.Type{quant.F32, quant.F16} {
		c := NewCPU(0)
		rng := rand.New(rand.NewPCG(47, 48))
		l := KVLayout{Layers: 1, KVHeads: 2, HeadDim: hd, PageSize: 16, DType: dtype}
		s := newPagedSeq(b, c, rng, l, n, 1)
		q := c.Wrap(kerneltest.RandFloats(rng, n*heads*hd, 1))
		out := c.Wrap(make([]float32, n*heads*hd))
		rows := make([]AttnRow, n)
		for i := range rows {
			rows[i] = AttnRow{Pages: s.table, Len: i + 1}
		}
		for _, bc := range []struct {
			name string
			o    *AttnOptions
		}{
			{"Attention", nil}, {"With{}", &AttnOptions{}},
			{"With{SoftCap}", &AttnOptions{SoftCap: 50}}, {"With{Window:256}", &AttnOptions{Window: 256}},
		} {
			b.Run(dtype.String()+"/"+bc.name, func(b *testing.B) {
				for b.Loop() {
					var err error
					if bc.o == nil {
						err = c.Attention(out, q, s.kv, 0, rows)
					} else {
						err = c.AttentionWith(out, q, s.kv, 0, rows, *bc.o)
					}
					if err != nil {
						b.Fatal(err)
					}
				}
			})
		}
		c.Close()
	}
}

package kernels

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"github.com/baton-serving/baton/kernels/internal/kerneltest"
	"github.com/baton-serving/baton/kernels/quant"
	"github.com/baton-serving/baton/kernels/vec"
)

// The CPU backend is tested against the reference operations of this
// package and of quant, on random data.

func newTestCPU(t *testing.T, threads int) *CPU {
	t.Helper()
	c := NewCPU(threads)
	t.Cleanup(func() { c.Close() })
	return c
}

// randMatrix returns rows×cols weights of typ in ggml's layout, and their
// float32 values.
func randMatrix(t *testing.T, rng *rand.Rand, typ quant.Type, rows, cols int) ([]byte, []float32) {
	t.Helper()
	f := kerneltest.RandFloats(rng, rows*cols, 1)
	rb, err := quant.RowBytes(typ, uint64(cols))
	if err != nil {
		t.Fatal(err)
	}
	data := make([]byte, rows*int(rb))
	if err := quant.Quantize(typ, f, data); err != nil {
		t.Fatal(err)
	}
	if err := quant.Dequantize(typ, data, f); err != nil {
		t.Fatal(err)
	}
	return data, f
}

func mustUpload(t *testing.T, b Backend, x []float32) Buffer {
	t.Helper()
	buf, err := Upload(b, x)
	if err != nil {
		t.Fatal(err)
	}
	return buf
}

func mustRead(t *testing.T, b Backend, buf Buffer) []float32 {
	t.Helper()
	out := make([]float32, buf.Len())
	if err := b.Read(out, buf); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestCPUMatMulMatchesReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	const rows = 37 // not a multiple of any tile height
	for _, typ := range quant.SupportedTypes() {
		cols := 96
		if typ.BlockSize() == 256 {
			cols = 512
		}
		for _, threads := range []int{1, 3} {
			t.Run(fmt.Sprintf("%s/threads=%d", typ, threads), func(t *testing.T) {
				c := newTestCPU(t, threads)
				data, wf := randMatrix(t, rng, typ, rows, cols)
				w, err := c.LoadMatrix(typ, rows, cols, data)
				if err != nil {
					t.Fatal(err)
				}
				for _, tokens := range []int{1, 2, 5, 9} {
					x := kerneltest.ExactActivations(rng, tokens*cols)
					dst, err := c.Alloc(tokens * rows)
					if err != nil {
						t.Fatal(err)
					}
					if err := c.MatMul(dst, w, c.Wrap(x)); err != nil {
						t.Fatal(err)
					}
					got := mustRead(t, c, dst)
					for tok := range tokens {
						xt := x[tok*cols : (tok+1)*cols]
						for r := range rows {
							want := quant.Dot(typ, data[r*len(data)/rows:(r+1)*len(data)/rows], xt)
							var mag float64
							for k, v := range xt {
								mag += math.Abs(float64(wf[r*cols+k] * v))
							}
							if g := got[tok*rows+r]; math.Abs(float64(g-want)) > 1e-5*mag+1e-30 {
								t.Fatalf("tokens %d: [%d][%d] = %v, reference %v (Σ|w·x| = %v)", tokens, tok, r, g, want, mag)
							}
						}
					}
				}
			})
		}
	}
}

// A token's products must not depend on the other tokens of the call, nor
// on the thread count: decode must reproduce prefill bit for bit.
func TestCPUMatMulBatchInvariant(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	// Enough rows that the split over workers changes with the token
	// count.
	const rows = 300
	for _, typ := range quant.SupportedTypes() {
		t.Run(typ.String(), func(t *testing.T) {
			cols := 64
			if typ.BlockSize() == 256 {
				cols = 256
			}
			data, _ := randMatrix(t, rng, typ, rows, cols)
			x := kerneltest.RandFloats(rng, 9*cols, 2)
			var first []float32
			for _, threads := range []int{1, 2, 4} {
				c := newTestCPU(t, threads)
				w, err := c.LoadMatrix(typ, rows, cols, data)
				if err != nil {
					t.Fatal(err)
				}
				for tokens := 1; tokens <= 9; tokens++ {
					dst, _ := c.Alloc(tokens * rows)
					if err := c.MatMul(dst, w, c.Wrap(x[:tokens*cols])); err != nil {
						t.Fatal(err)
					}
					got := mustRead(t, c, dst)
					if first == nil {
						first = got
					}
					// Token 0 is the same in every call.
					if !slices.Equal(got[:rows], first[:rows]) {
						t.Fatalf("threads %d, tokens %d: token 0 = %v, alone %v", threads, tokens, got[:rows], first[:rows])
					}
				}
			}
		})
	}
}

func TestCPUMatMulMisalignedF32(t *testing.T) {
	// F32 weights at an odd address are decoded once and still multiply.
	rng := rand.New(rand.NewPCG(5, 6))
	c := newTestCPU(t, 2)
	data, _ := randMatrix(t, rng, quant.F32, 5, 8)
	odd := make([]byte, len(data)+1)[1:]
	copy(odd, data)
	w, err := c.LoadMatrix(quant.F32, 5, 8, odd)
	if err != nil {
		t.Fatal(err)
	}
	x := kerneltest.RandFloats(rng, 8, 1)
	dst, _ := c.Alloc(5)
	if err := c.MatMul(dst, w, c.Wrap(x)); err != nil {
		t.Fatal(err)
	}
	got := mustRead(t, c, dst)
	for r := range 5 {
		if want := quant.Dot(quant.F32, data[r*32:(r+1)*32], x); !near(got[r], want, 1e-5) {
			t.Errorf("row %d = %v, want %v", r, got[r], want)
		}
	}
}

func TestCPUEmbed(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	c := newTestCPU(t, 1)
	for _, typ := range quant.SupportedTypes() {
		cols := 256
		data, wf := randMatrix(t, rng, typ, 10, cols)
		w, err := c.LoadMatrix(typ, 10, cols, data)
		if err != nil {
			t.Fatal(err)
		}
		ids := []int32{3, 0, 9, 3}
		dst, _ := c.Alloc(len(ids) * cols)
		if err := c.Embed(dst, w, ids); err != nil {
			t.Fatal(err)
		}
		got := mustRead(t, c, dst)
		for i, id := range ids {
			if !slices.Equal(got[i*cols:(i+1)*cols], wf[int(id)*cols:(int(id)+1)*cols]) {
				t.Fatalf("%s: row %d (id %d) differs from the dequantized weights", typ, i, id)
			}
		}
		if err := c.Embed(dst, w, []int32{1, 2, 10, 0}); !errors.Is(err, ErrShape) {
			t.Errorf("%s: id 10 of 10 rows: err %v, want ErrShape", typ, err)
		}
	}
}

// TestCPURowOps checks the row-wise operations against the reference
// loops, for a decoding step's few rows (on the caller) and a prompt's
// many (spread over the pool; at 500 rows, SiLU·mul's blocks and a long
// residual add's pieces are spread too).
func TestCPURowOps(t *testing.T) {
	for _, rows := range []int{3, 37, 500} {
		t.Run(fmt.Sprintf("%d rows", rows), func(t *testing.T) { testCPURowOps(t, rows) })
	}
}

func testCPURowOps(t *testing.T, rows int) {
	rng := rand.New(rand.NewPCG(9, uint64(rows)))
	c := newTestCPU(t, 2)
	const dim = 40

	t.Run("rmsnorm", func(t *testing.T) {
		x := kerneltest.RandFloats(rng, rows*dim, 3)
		w := kerneltest.RandFloats(rng, dim, 1)
		dst, _ := c.Alloc(rows * dim)
		if err := c.RMSNorm(dst, mustUpload(t, c, x), mustUpload(t, c, w), 1e-5); err != nil {
			t.Fatal(err)
		}
		got := mustRead(t, c, dst)
		want := make([]float32, rows*dim)
		for r := range rows {
			RMSNorm(want[r*dim:(r+1)*dim], x[r*dim:(r+1)*dim], w, 1e-5)
		}
		if !slices.Equal(got, want) {
			t.Errorf("got %v, want %v", got, want)
		}
		// In place.
		xb := mustUpload(t, c, x)
		if err := c.RMSNorm(xb, xb, mustUpload(t, c, w), 1e-5); err != nil {
			t.Fatal(err)
		}
		if got := mustRead(t, c, xb); !slices.Equal(got, want) {
			t.Errorf("in place: got %v, want %v", got, want)
		}
	})

	for _, layout := range []RopeLayout{RopeNormal, RopeNeoX} {
		t.Run("rope/"+layout.String(), func(t *testing.T) {
			const heads, hd, half = 3, 10, 4 // rotates 8 of 10
			x := kerneltest.RandFloats(rng, rows*heads*hd, 1)
			cos, sin := make([]float32, rows*half), make([]float32, rows*half)
			for r := range rows {
				RopeTable(cos[r*half:(r+1)*half], sin[r*half:(r+1)*half], 7*r+1, 10000, 1, nil)
			}
			xb := mustUpload(t, c, x)
			if err := c.Rope(xb, mustUpload(t, c, cos), mustUpload(t, c, sin), rows, hd, layout); err != nil {
				t.Fatal(err)
			}
			got := mustRead(t, c, xb)
			for r := range rows {
				for h := range heads {
					off := (r*heads + h) * hd
					Rope(x[off:off+hd], cos[r*half:(r+1)*half], sin[r*half:(r+1)*half], layout)
				}
			}
			if !slices.Equal(got, x) {
				t.Errorf("got %v, want %v", got, x)
			}
		})
	}

	t.Run("softmax", func(t *testing.T) {
		x := kerneltest.RandFloats(rng, rows*dim, 30)
		xb := mustUpload(t, c, x)
		if err := c.Softmax(xb, rows); err != nil {
			t.Fatal(err)
		}
		got := mustRead(t, c, xb)
		for r := range rows {
			Softmax(x[r*dim : (r+1)*dim])
		}
		assertSlice(t, "softmax", got, x, 1e-6)
	})

	t.Run("silu-mul", func(t *testing.T) {
		// 172 values per row: rows are not a multiple of 8 long, yet a
		// row's results must not depend on the other rows. The values
		// at the end of each row are ones whose exponentials differ
		// between vec.ExpSum's vector code and its scalar code for a
		// slice's last len mod 8 elements (where the CPU has vector
		// code), so that a row computed alone would differ if its end
		// took the scalar path.
		const width = 172
		g := kerneltest.RandFloats(rng, rows*width, 8)
		u := kerneltest.RandFloats(rng, rows*width, 1)
		tricky := expPathSensitive(rng, 4)
		for r := range rows {
			copy(g[(r+1)*width-len(tricky):], tricky)
		}
		dst, _ := c.Alloc(rows * width)
		if err := c.SiLUMul(dst, mustUpload(t, c, g), mustUpload(t, c, u)); err != nil {
			t.Fatal(err)
		}
		got := mustRead(t, c, dst)
		want := make([]float32, len(g))
		SiLUMul(want, g, u)
		for i := range got {
			if math.Abs(float64(got[i]-want[i])) > 1e-6*(1+math.Abs(float64(want[i]))) {
				t.Fatalf("[%d] = %v, want %v", i, got[i], want[i])
			}
		}
		for r := range rows {
			one, _ := c.Alloc(width)
			if err := c.SiLUMul(one, c.Wrap(g[r*width:(r+1)*width]), c.Wrap(u[r*width:(r+1)*width])); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(mustRead(t, c, one), got[r*width:(r+1)*width]) {
				t.Fatalf("row %d alone differs from the batch", r)
			}
		}
	})

	t.Run("add", func(t *testing.T) {
		a := kerneltest.RandFloats(rng, rows*dim, 1)
		bias := kerneltest.RandFloats(rng, dim, 1)
		dst, _ := c.Alloc(rows * dim)
		if err := c.Add(dst, mustUpload(t, c, a), mustUpload(t, c, bias)); err != nil {
			t.Fatal(err)
		}
		got := mustRead(t, c, dst)
		for i := range got {
			if got[i] != a[i]+bias[i%dim] {
				t.Fatalf("bias add [%d] = %v, want %v", i, got[i], a[i]+bias[i%dim])
			}
		}
		ab := mustUpload(t, c, a)
		if err := c.Add(ab, ab, dst); err != nil { // residual add in place
			t.Fatal(err)
		}
		for i, v := range mustRead(t, c, ab) {
			if v != a[i]+got[i] {
				t.Fatalf("residual add [%d] = %v, want %v", i, v, a[i]+got[i])
			}
		}
	})
}

// expPathSensitive returns up to n values v whose silu differs when
// vec.ExpSum computes e^(−v) in its vector code (an 8-aligned run) and in
// its scalar tail; none where the two agree (the pure-Go build).
func expPathSensitive(rng *rand.Rand, n int) []float32 {
	var out []float32
	for range 1 << 16 {
		if len(out) == n {
			break
		}
		v := (2*rng.Float32() - 1) * 8
		var vecE [8]float32
		vecE[0] = -v
		vec.ExpSum(vecE[:], vecE[:], 0)
		tail := []float32{-v}
		vec.ExpSum(tail, tail, 0)
		if v/(1+vecE[0]) != v/(1+tail[0]) {
			out = append(out, v)
		}
	}
	return out
}

// kvFixture is a paged cache with two sequences stored in scattered pages.
type kvFixture struct {
	l      KVLayout
	pages  int
	layer  int
	tables [][]int32
	k, v   [][]float32 // per sequence, rows of RowElems
}

func newKVFixture(rng *rand.Rand, dtype quant.Type, headDim int) kvFixture {
	f := kvFixture{
		l:      KVLayout{Layers: 2, KVHeads: 2, HeadDim: headDim, PageSize: 4, DType: dtype},
		pages:  12,
		layer:  1,
		tables: [][]int32{{5, 2, 9}, {0, 7, 3, 11, 1, 4, 6}},
	}
	for _, n := range []int{11, 27} {
		f.k = append(f.k, kerneltest.RandFloats(rng, n*f.l.RowElems(), 2))
		f.v = append(f.v, kerneltest.RandFloats(rng, n*f.l.RowElems(), 1))
	}
	return f
}

// store writes both sequences' keys and values with b.StoreKV.
func (f kvFixture) store(t *testing.T, b Backend, kv KVCache) {
	t.Helper()
	for s, table := range f.tables {
		n := len(f.k[s]) / f.l.RowElems()
		slots := make([]int32, n)
		for p := range slots {
			slots[p] = table[p/f.l.PageSize]*int32(f.l.PageSize) + int32(p%f.l.PageSize)
		}
		if err := b.StoreKV(kv, f.layer, slots, mustUpload(t, b, f.k[s]), mustUpload(t, b, f.v[s])); err != nil {
			t.Fatal(err)
		}
	}
}

// attnRows are query rows over both sequences at several lengths.
func (f kvFixture) attnRows() []AttnRow {
	return []AttnRow{
		{Pages: f.tables[0], Len: 11}, {Pages: f.tables[1], Len: 1}, {Pages: f.tables[1], Len: 5},
		{Pages: f.tables[1], Len: 27}, {Pages: f.tables[0], Len: 8},
	}
}

func TestCPUKVCacheAndAttention(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	for _, dtype := range []quant.Type{quant.F32, quant.F16} {
		t.Run(dtype.String(), func(t *testing.T) {
			c := newTestCPU(t, 3)
			f := newKVFixture(rng, dtype, 16)
			kv, err := c.NewKVCache(f.l, f.pages)
			if err != nil {
				t.Fatal(err)
			}
			f.store(t, c, kv)
			data, err := c.KVBytes(kv)
			if err != nil {
				t.Fatal(err)
			}
			// The bytes are where KVLayout says, as EncodeKV writes them.
			re, rb := f.l.RowElems(), f.l.RowBytes()
			for s, table := range f.tables {
				for p := range len(f.k[s]) / re {
					off := int(table[p/f.l.PageSize])*f.l.PageBytes() + f.l.LayerOffset(f.layer) + (p%f.l.PageSize)*rb
					want := make([]byte, rb)
					EncodeKV(want, f.k[s][p*re:(p+1)*re], dtype)
					if !slices.Equal(data[off:off+rb], want) {
						t.Fatalf("sequence %d position %d: keys not at offset %d", s, p, off)
					}
					EncodeKV(want, f.v[s][p*re:(p+1)*re], dtype)
					if !slices.Equal(data[off+f.l.BlockBytes():off+f.l.BlockBytes()+rb], want) {
						t.Fatalf("sequence %d position %d: values not BlockBytes after the keys", s, p)
					}
				}
			}

			rows := f.attnRows()
			const heads = 6 // 3 query heads per KV head
			q := kerneltest.RandFloats(rng, len(rows)*heads*f.l.HeadDim, 1)
			out, _ := c.Alloc(len(q))
			if err := c.Attention(out, mustUpload(t, c, q), kv, f.layer, rows); err != nil {
				t.Fatal(err)
			}
			got := mustRead(t, c, out)
			hd := f.l.HeadDim
			for i, r := range rows {
				var kp, vp [][]byte
				for _, p := range r.Pages {
					blk := data[int(p)*f.l.PageBytes()+f.l.LayerOffset(f.layer):]
					kp = append(kp, blk[:f.l.BlockBytes()])
					vp = append(vp, blk[f.l.BlockBytes():2*f.l.BlockBytes()])
				}
				for h := range heads {
					want := make([]float32, hd)
					off := (i*heads + h) * hd
					AttendHeadPaged(want, q[off:off+hd], kp, vp, r.Len, f.l.PageSize, re, (h/3)*hd, dtype, make([]float32, r.Len))
					assertSlice(t, fmt.Sprintf("row %d head %d", i, h), got[off:off+hd], want, 1e-5)
				}
			}
		})
	}
}

func TestCPUKVPageIO(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 14))
	c := newTestCPU(t, 1)
	f := newKVFixture(rng, quant.F16, 8)
	kv, _ := c.NewKVCache(f.l, f.pages)
	f.store(t, c, kv)
	page := make([]byte, 2*f.l.BlockBytes())
	if err := c.ExportKV(page, kv, 7, f.layer); err != nil {
		t.Fatal(err)
	}
	other, _ := c.NewKVCache(f.l, f.pages)
	if err := c.ImportKV(other, 3, f.layer, page); err != nil {
		t.Fatal(err)
	}
	back := make([]byte, len(page))
	if err := c.ExportKV(back, other, 3, f.layer); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(back, page) {
		t.Error("a page exported, imported elsewhere and exported again changed")
	}
	if err := c.CopyKVPage(kv, 8, 7); err != nil {
		t.Fatal(err)
	}
	data, _ := c.KVBytes(kv)
	pb := f.l.PageBytes()
	if !slices.Equal(data[8*pb:9*pb], data[7*pb:8*pb]) {
		t.Error("CopyKVPage left the pages different")
	}
	for _, tc := range []struct {
		name        string
		page, layer int
		n           int
	}{
		{"page out of range", f.pages, 0, len(page)},
		{"negative layer", 0, -1, len(page)},
		{"layer out of range", 0, f.l.Layers, len(page)},
		{"short buffer", 0, 0, len(page) - 1},
	} {
		if err := c.ExportKV(make([]byte, tc.n), kv, tc.page, tc.layer); !errors.Is(err, ErrShape) {
			t.Errorf("ExportKV %s: err %v, want ErrShape", tc.name, err)
		}
		if err := c.ImportKV(kv, tc.page, tc.layer, make([]byte, tc.n)); !errors.Is(err, ErrShape) {
			t.Errorf("ImportKV %s: err %v, want ErrShape", tc.name, err)
		}
	}
}

func TestCPUWrapShareMemory(t *testing.T) {
	c := newTestCPU(t, 1)
	x := []float32{1, 2, 3, 4}
	b := c.Wrap(x)
	if err := c.Add(b, b, c.Wrap([]float32{10})); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(x, []float32{11, 12, 13, 14}) {
		t.Errorf("an operation on a wrapped slice left it %v", x)
	}
	got, err := c.Floats(b.Slice(1, 3))
	if err != nil || !slices.Equal(got, []float32{12, 13}) {
		t.Errorf("Floats of a slice = %v, %v", got, err)
	}
	l := KVLayout{Layers: 1, KVHeads: 1, HeadDim: 2, PageSize: 2, DType: quant.F32}
	mem := make([]byte, 2*l.PageBytes())
	kv, err := c.WrapKV(l, mem)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.StoreKV(kv, 0, []int32{3}, c.Wrap([]float32{1, 2}), c.Wrap([]float32{3, 4})); err != nil {
		t.Fatal(err)
	}
	want := make([]byte, 8)
	EncodeKV(want, []float32{1, 2}, quant.F32)
	if off := l.PageBytes() + 8; !slices.Equal(mem[off:off+8], want) {
		t.Errorf("StoreKV into slot 3 did not write the wrapped memory")
	}
	if _, err := c.WrapKV(l, mem[1:]); !errors.Is(err, ErrShape) {
		t.Errorf("WrapKV of a partial page: err %v, want ErrShape", err)
	}
}

func TestCPURejectsBadOperands(t *testing.T) {
	c := newTestCPU(t, 1)
	other := newTestCPU(t, 1)
	a, _ := c.Alloc(8)
	b, _ := c.Alloc(8)
	w, err := c.LoadMatrix(quant.F32, 2, 4, make([]byte, 32))
	if err != nil {
		t.Fatal(err)
	}
	foreign, _ := other.Alloc(8)
	freed, _ := c.Alloc(8)
	if err := c.Free(freed); err != nil {
		t.Fatal(err)
	}
	l := KVLayout{Layers: 1, KVHeads: 1, HeadDim: 4, PageSize: 2, DType: quant.F32}
	kv, _ := c.NewKVCache(l, 2)
	tests := []struct {
		name string
		err  error
		op   func() error
	}{
		{"matmul wrong output", ErrShape, func() error { return c.MatMul(a.Slice(0, 3), w, b) }},
		{"matmul ragged input", ErrShape, func() error { return c.MatMul(a, w, b.Slice(0, 7)) }},
		{"matmul in place", ErrShape, func() error { return c.MatMul(a.Slice(0, 4), w, a) }},
		{"foreign buffer", ErrForeign, func() error { return c.Add(a, a, foreign) }},
		{"freed buffer", ErrForeign, func() error { return c.Add(a, a, freed) }},
		{"free a slice", ErrShape, func() error { return c.Free(a.Slice(0, 4)) }},
		{"free a wrapped slice", ErrShape, func() error { return c.Free(c.Wrap(make([]float32, 2))) }},
		{"rmsnorm ragged", ErrShape, func() error { return c.RMSNorm(a, a, b.Slice(0, 3), 0) }},
		{"rope too many pairs", ErrShape, func() error { return c.Rope(a, b.Slice(0, 3), b.Slice(0, 3), 1, 4, RopeNormal) }},
		{"softmax ragged", ErrShape, func() error { return c.Softmax(a, 3) }},
		{"silu lengths", ErrShape, func() error { return c.SiLUMul(a, a, b.Slice(0, 4)) }},
		{"add ragged bias", ErrShape, func() error { return c.Add(a, a, b.Slice(0, 3)) }},
		{"unsupported matrix", ErrUnsupported, func() error { _, err := c.LoadMatrix(quant.IQ2_XXS, 1, 256, make([]byte, 66)); return err }},
		{"short matrix", ErrShape, func() error { _, err := c.LoadMatrix(quant.F32, 2, 4, make([]byte, 31)); return err }},
		{"store slot out of range", ErrShape, func() error { return c.StoreKV(kv, 0, []int32{4}, a.Slice(0, 4), b.Slice(0, 4)) }},
		{"store layer out of range", ErrShape, func() error { return c.StoreKV(kv, 1, []int32{0}, a.Slice(0, 4), b.Slice(0, 4)) }},
		{"attend past the pages", ErrShape, func() error {
			return c.Attention(a.Slice(0, 4), b.Slice(0, 4), kv, 0, []AttnRow{{Pages: []int32{0}, Len: 3}})
		}},
		{"attend a missing page", ErrShape, func() error {
			return c.Attention(a.Slice(0, 4), b.Slice(0, 4), kv, 0, []AttnRow{{Pages: []int32{2}, Len: 1}})
		}},
		{"attend heads not a multiple of KV heads", ErrShape, func() error {
			return c.Attention(a.Slice(0, 4), b.Slice(0, 4), kv, 0, []AttnRow{{Pages: []int32{0}, Len: 1}, {Pages: []int32{0}, Len: 1}})
		}},
		{"KV layout F16 pages of Q8_0", ErrUnsupported, func() error {
			_, err := c.NewKVCache(KVLayout{Layers: 1, KVHeads: 1, HeadDim: 4, PageSize: 2, DType: quant.Q8_0}, 1)
			return err
		}},
		{"copy page out of range", ErrShape, func() error { return c.CopyKVPage(kv, 2, 0) }},
	}
	for _, tc := range tests {
		if err := tc.op(); !errors.Is(err, tc.err) {
			t.Errorf("%s: err %v, want %v", tc.name, err, tc.err)
		}
	}

	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.MatMul(a.Slice(0, 2), w, b.Slice(0, 4)); !errors.Is(err, ErrClosed) {
		t.Errorf("MatMul after Close: err %v, want ErrClosed", err)
	}
	if _, err := c.Alloc(1); !errors.Is(err, ErrClosed) {
		t.Errorf("Alloc after Close: err %v, want ErrClosed", err)
	}
}

// Goroutines sharing a backend (and its pool) must not disturb each
// other's results; run with -race.
func TestCPUConcurrentUse(t *testing.T) {
	rng := rand.New(rand.NewPCG(15, 16))
	c := newTestCPU(t, 3)
	const rows, cols = 64, 256
	data, _ := randMatrix(t, rng, quant.Q8_0, rows, cols)
	w, _ := c.LoadMatrix(quant.Q8_0, rows, cols, data)
	x := kerneltest.RandFloats(rng, 3*cols, 1)
	want, _ := c.Alloc(3 * rows)
	if err := c.MatMul(want, w, c.Wrap(x)); err != nil {
		t.Fatal(err)
	}
	wantF := mustRead(t, c, want)
	concurrently(t, 4, 20, func(int) func() error {
		dst, _ := c.Alloc(3 * rows)
		return func() error {
			if err := c.MatMul(dst, w, c.Wrap(x)); err != nil {
				return err
			}
			if got, _ := c.Floats(dst); !slices.Equal(got, wantF) {
				return errors.New("a concurrent product differs")
			}
			return nil
		}
	})
}

// concurrently runs n goroutines at once, each calling the check that
// newCheck makes for it rounds times, and fails t with every error a
// goroutine stops on.
func concurrently(t *testing.T, n, rounds int, newCheck func(g int) func() error) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for g := range n {
		wg.Go(func() {
			check := newCheck(g)
			for range rounds {
				if err := check(); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func BenchmarkCPUMatVec(b *testing.B) {
	rng := rand.New(rand.NewPCG(17, 18))
	for _, typ := range []quant.Type{quant.F32, quant.F16, quant.Q8_0} {
		for _, shape := range [][2]int{{2048, 2048}, {5632, 2048}} {
			rows, cols := shape[0], shape[1]
			b.Run(fmt.Sprintf("%s/%dx%d", typ, rows, cols), func(b *testing.B) {
				c := NewCPU(0)
				defer c.Close()
				f := kerneltest.RandFloats(rng, rows*cols, 1)
				rb, _ := quant.RowBytes(typ, uint64(cols))
				data := make([]byte, rows*int(rb))
				if err := quant.Quantize(typ, f, data); err != nil {
					b.Fatal(err)
				}
				w, err := c.LoadMatrix(typ, rows, cols, data)
				if err != nil {
					b.Fatal(err)
				}
				x := c.Wrap(kerneltest.RandFloats(rng, cols, 1))
				dst, _ := c.Alloc(rows)
				b.ResetTimer()
				for b.Loop() {
					if err := c.MatMul(dst, w, x); err != nil {
						b.Fatal(err)
					}
				}
				sec := b.Elapsed().Seconds() / float64(b.N)
				b.ReportMetric(float64(len(data))/sec/1e9, "GB/s")
				b.ReportMetric(2*float64(rows*cols)/sec/1e9, "GFLOP/s")
			})
		}
	}
}

// TestCPUMatMuls checks grouped products against one MatMul each: groups
// of the same type and width, of mixed types, of more products than one
// pass takes, and of widths that read different token counts from x; and
// that outputs which overlap are refused.
func TestCPUMatMuls(t *testing.T) {
	rng := rand.New(rand.NewPCG(21, 22))
	c := newTestCPU(t, 2)
	load := func(typ quant.Type, rows, cols int) Matrix {
		data, _ := randMatrix(t, rng, typ, rows, cols)
		m, err := c.LoadMatrix(typ, rows, cols, data)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	x := mustUpload(t, c, kerneltest.RandFloats(rng, 5*256, 1))
	for _, tc := range []struct {
		name string
		ws   []Matrix
	}{
		{"q/k/v", []Matrix{load(quant.Q8_0, 96, 256), load(quant.Q8_0, 32, 256), load(quant.Q8_0, 32, 256)}},
		{"mixed types", []Matrix{load(quant.F16, 40, 256), load(quant.Q4_K, 24, 256)}},
		{"five", []Matrix{load(quant.F32, 16, 256), load(quant.F32, 17, 256), load(quant.F32, 18, 256), load(quant.F32, 19, 256), load(quant.F32, 20, 256)}},
		{"two widths", []Matrix{load(quant.F32, 16, 256), load(quant.F32, 16, 128)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var ps []Product
			var want [][]float32
			for _, w := range tc.ws {
				n := x.Len() / w.Cols() * w.Rows()
				one, _ := c.Alloc(n)
				if err := c.MatMul(one, w, x); err != nil {
					t.Fatal(err)
				}
				want = append(want, mustRead(t, c, one))
				dst, _ := c.Alloc(n)
				ps = append(ps, Product{Dst: dst, W: w})
			}
			if err := MatMuls(c, x, ps...); err != nil {
				t.Fatal(err)
			}
			for i, p := range ps {
				if !slices.Equal(mustRead(t, c, p.Dst), want[i]) {
					t.Errorf("product %d differs from its MatMul alone", i)
				}
			}
		})
	}
	w := load(quant.Q8_0, 32, 256)
	out, _ := c.Alloc(2 * 5 * 32)
	err := c.MatMuls(x, Product{Dst: out.Slice(0, 5*32), W: w}, Product{Dst: out.Slice(5*32-1, 2*5*32-1), W: w})
	if !errors.Is(err, ErrShape) {
		t.Errorf("overlapping outputs: %v, want ErrShape", err)
	}
}

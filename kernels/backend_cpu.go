package kernels

import (
	"encoding/binary"
	"fmt"
	"math"
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/baton-serving/baton/kernels/quant"
	"github.com/baton-serving/baton/kernels/vec"
)

// CPU is the Backend that runs on this machine's cores: the kernels of
// kernels/vec (assembly chosen for the CPU at start, or the pure-Go twins
// under the purego build tag) and the reference operations of this
// package, with weight products and attention split over a persistent pool
// of worker goroutines.
//
// Its memory is ordinary Go memory, and it offers what only such memory
// allows: [CPU.Wrap] and [CPU.Floats] turn float32 slices into buffers and
// back without a copy, and [CPU.WrapKV] ([HostKV]) and [CPU.KVBytes] do
// the same for a KV cache's pages, so the engine's page pool is computed
// on where it lies. Operations run synchronously: Sync has nothing to
// wait for.
//
// Weight products go through vec's matrix-matrix kernels, whose every
// tile (one-token tiles included) sums an output in the same order;
// quantized weights multiply activations quantized to Q8_0 or Q8_K
// blocks, and rows are split among the workers at multiples of 16 (see
// cpu_matmul.go). So a token's result is the same bit for bit whatever the
// number of tokens and threads, and so is every other operation's: each
// is local to a row, or to a (row, head) pair for attention.
type CPU struct {
	threads int
	pool    *pool
	mm      *matmuls
	mu      sync.RWMutex // held shared by operations on the pool, exclusively by Close
	closed  atomic.Bool
	attn    sync.Pool // *attnCall
}

// NewCPU returns a CPU backend that splits work over threads goroutines
// (the caller's and threads-1 workers); threads ≤ 0 means GOMAXPROCS.
func NewCPU(threads int) *CPU {
	if threads <= 0 {
		threads = runtime.GOMAXPROCS(0)
	}
	p := newPool(threads)
	return &CPU{threads: threads, pool: p, mm: newMatmuls(p)}
}

// Name implements Backend.
func (c *CPU) Name() string {
	return fmt.Sprintf("cpu (%s, %d threads)", vec.Implementation(), c.threads)
}

// open fails once the backend is closed.
func (c *CPU) open() error {
	if c.closed.Load() {
		return ErrClosed
	}
	return nil
}

// enter takes the shared lock that keeps the pool running, failing once
// the backend is closed.
func (c *CPU) enter() error {
	c.mu.RLock()
	if err := c.open(); err != nil {
		c.mu.RUnlock()
		return err
	}
	return nil
}

func (c *CPU) leave() { c.mu.RUnlock() }

// Close stops the worker pool. Operations afterwards return ErrClosed.
func (c *CPU) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.closed.Swap(true) {
		c.pool.close()
	}
	return nil
}

// Sync implements Backend; the CPU backend's operations are done when
// they return.
func (c *CPU) Sync() error { return c.open() }

// cpuAlloc is the state an allocation's slices share.
type cpuAlloc struct {
	freed atomic.Bool
	n     int // elements of the whole allocation
}

// cpuBuffer is a Buffer in Go memory.
type cpuBuffer struct {
	owner *CPU
	alloc *cpuAlloc
	data  []float32
	whole bool
}

func (b *cpuBuffer) Len() int { return len(b.data) }

func (b *cpuBuffer) Slice(lo, hi int) Buffer {
	return &cpuBuffer{owner: b.owner, alloc: b.alloc, data: b.data[lo:hi:hi]}
}

// Alloc implements Backend.
func (c *CPU) Alloc(n int) (Buffer, error) {
	if err := c.open(); err != nil {
		return nil, err
	}
	if n < 0 {
		return nil, fmt.Errorf("%w: buffer of %d elements", ErrShape, n)
	}
	return &cpuBuffer{owner: c, alloc: &cpuAlloc{n: n}, data: make([]float32, n), whole: true}, nil
}

// Wrap returns a buffer over x itself: operations on it read and write x.
// Free does not apply to it.
func (c *CPU) Wrap(x []float32) Buffer {
	return &cpuBuffer{owner: c, alloc: &cpuAlloc{n: len(x)}, data: x[:len(x):len(x)]}
}

// Floats returns the memory of a buffer of this backend.
func (c *CPU) Floats(b Buffer) ([]float32, error) {
	return c.buf(b, "buffer")
}

func (c *CPU) buf(b Buffer, what string) ([]float32, error) {
	if err := c.open(); err != nil {
		return nil, err
	}
	cb, ok := b.(*cpuBuffer)
	if !ok || cb == nil || cb.owner != c {
		return nil, fmt.Errorf("%w: %s is not a buffer of this CPU backend", ErrForeign, what)
	}
	if cb.alloc.freed.Load() {
		return nil, fmt.Errorf("%w: %s has been freed", ErrForeign, what)
	}
	return cb.data, nil
}

// bufs checks up to four operands at once. It allocates nothing unless
// one is bad: it runs for every operation of a forward pass.
func (c *CPU) bufs(what string, bs ...Buffer) (ops [4][]float32, err error) {
	if err := c.open(); err != nil {
		return ops, err
	}
	for i, b := range bs {
		cb, ok := b.(*cpuBuffer)
		if !ok || cb == nil || cb.owner != c || cb.alloc.freed.Load() {
			_, err := c.buf(b, fmt.Sprintf("%s operand %d", what, i))
			return ops, err
		}
		ops[i] = cb.data
	}
	return ops, nil
}

// Free implements Backend. The memory goes back to the garbage collector
// once nothing refers to it.
func (c *CPU) Free(b Buffer) error {
	if _, err := c.buf(b, "the buffer to free"); err != nil {
		return err
	}
	cb := b.(*cpuBuffer)
	if !cb.whole {
		return fmt.Errorf("%w: freeing a slice or a wrapped slice rather than an allocated buffer", ErrShape)
	}
	cb.alloc.freed.Store(true)
	return nil
}

// Write implements Backend.
func (c *CPU) Write(dst Buffer, src []float32) error {
	d, err := c.buf(dst, "write destination")
	if err != nil {
		return err
	}
	if len(src) != len(d) {
		return fmt.Errorf("%w: writing %d values to a buffer of %d", ErrShape, len(src), len(d))
	}
	copy(d, src)
	return nil
}

// Read implements Backend.
func (c *CPU) Read(dst []float32, src Buffer) error {
	s, err := c.buf(src, "read source")
	if err != nil {
		return err
	}
	if len(dst) != len(s) {
		return fmt.Errorf("%w: reading a buffer of %d into %d values", ErrShape, len(s), len(dst))
	}
	copy(dst, s)
	return nil
}

// Copy implements Backend.
func (c *CPU) Copy(dst, src Buffer) error {
	ops, err := c.bufs("copy", dst, src)
	if err != nil {
		return err
	}
	if len(ops[0]) != len(ops[1]) {
		return fmt.Errorf("%w: copying %d values into %d", ErrShape, len(ops[1]), len(ops[0]))
	}
	copy(ops[0], ops[1])
	return nil
}

// overlap reports whether a and b share memory.
func overlap(a, b []float32) bool {
	if len(a) == 0 || len(b) == 0 {
		return false
	}
	pa, pb := uintptr(unsafe.Pointer(&a[0])), uintptr(unsafe.Pointer(&b[0]))
	return pa < pb+4*uintptr(len(b)) && pb < pa+4*uintptr(len(a))
}

// cpuMatrix is a Matrix computed from in place.
type cpuMatrix struct {
	owner                *CPU
	typ                  quant.Type
	rows, cols, rowBytes int
	data                 []byte
	f32                  []float32 // F32 weights as float32s
	freed                atomic.Bool
}

func (m *cpuMatrix) Type() quant.Type { return m.typ }
func (m *cpuMatrix) Rows() int        { return m.rows }
func (m *cpuMatrix) Cols() int        { return m.cols }

func (c *CPU) mat(w Matrix) (*cpuMatrix, error) {
	if err := c.open(); err != nil {
		return nil, err
	}
	m, ok := w.(*cpuMatrix)
	if !ok || m == nil || m.owner != c {
		return nil, fmt.Errorf("%w: the matrix is not one of this CPU backend", ErrForeign)
	}
	if m.freed.Load() {
		return nil, fmt.Errorf("%w: the matrix has been freed", ErrForeign)
	}
	return m, nil
}

// nativeLE reports whether float32s in memory are little-endian, as the
// weight files store them.
func nativeLE() bool { return binary.NativeEndian.Uint16([]byte{1, 0}) == 1 }

// LoadMatrix implements Backend. The matrix computes from data in place
// (a memory-mapped file stays mapped, not copied), except F32 data that
// is not 4-byte aligned or not in the machine's byte order, which is
// decoded once.
func (c *CPU) LoadMatrix(typ quant.Type, rows, cols int, data []byte) (Matrix, error) {
	if err := c.open(); err != nil {
		return nil, err
	}
	rb, err := CheckMatrix(typ, rows, cols, len(data))
	if err != nil {
		return nil, err
	}
	m := &cpuMatrix{owner: c, typ: typ, rows: rows, cols: cols, rowBytes: rb, data: data}
	if typ == quant.F32 {
		if nativeLE() && uintptr(unsafe.Pointer(&data[0]))%4 == 0 {
			m.f32 = unsafe.Slice((*float32)(unsafe.Pointer(&data[0])), len(data)/4)
		} else {
			m.f32 = make([]float32, len(data)/4)
			for i := range m.f32 {
				m.f32[i] = math.Float32frombits(binary.LittleEndian.Uint32(data[4*i:]))
			}
		}
	}
	return m, nil
}

// FreeMatrix implements Backend.
func (c *CPU) FreeMatrix(w Matrix) error {
	m, err := c.mat(w)
	if err != nil {
		return err
	}
	m.freed.Store(true)
	return nil
}

func growF32(s []float32, n int) []float32 {
	if cap(s) < n {
		return make([]float32, n)
	}
	return s[:n]
}

// MatMul implements Backend.
func (c *CPU) MatMul(dst Buffer, w Matrix, x Buffer) error {
	return c.MatMuls(x, Product{Dst: dst, W: w})
}

// MatMuls implements [ProductGrouper]: products of the same activations
// (a block's queries, keys and values; its gate and up projections) take
// one pass of the pool, with the activations quantized or packed once.
func (c *CPU) MatMuls(x Buffer, ps ...Product) error {
	if err := c.enter(); err != nil {
		return err
	}
	defer c.leave()
	xs, err := c.buf(x, "matmul activations")
	if err != nil {
		return err
	}
	for lo := 0; lo < len(ps); lo += maxGroup {
		if err := c.matmuls(xs, ps[lo:min(lo+maxGroup, len(ps))]); err != nil {
			return err
		}
	}
	return nil
}

// matmuls checks and runs up to maxGroup products of xs.
func (c *CPU) matmuls(xs []float32, ps []Product) error {
	var group [maxGroup]prod
	var tokens [maxGroup]int
	same := true
	for i, p := range ps {
		m, err := c.mat(p.W)
		if err != nil {
			return err
		}
		d, err := c.buf(p.Dst, "matmul output")
		if err != nil {
			return err
		}
		if tokens[i], err = CheckMatMul(m.rows, m.cols, len(d), len(xs)); err != nil {
			return err
		}
		if overlap(d, xs) {
			return fmt.Errorf("%w: matmul output overlaps its input", ErrShape)
		}
		for _, q := range group[:i] {
			if overlap(d, q.dst) {
				return fmt.Errorf("%w: matmul outputs overlap", ErrShape)
			}
		}
		group[i] = prod{dst: d, w: m}
		same = same && tokens[i] == tokens[0]
	}
	if len(ps) == 0 || tokens[0] == 0 {
		return nil
	}
	if !same {
		// Different widths read different token counts from x.
		for i, p := range group[:len(ps)] {
			c.mm.product(p.dst, p.w, xs, tokens[i])
		}
		return nil
	}
	c.mm.products(xs, tokens[0], group[:len(ps)]...)
	return nil
}

// Embed implements Backend.
func (c *CPU) Embed(dst Buffer, w Matrix, ids []int32) error {
	m, err := c.mat(w)
	if err != nil {
		return err
	}
	d, err := c.buf(dst, "embedding output")
	if err != nil {
		return err
	}
	if err := CheckEmbed(m.rows, m.cols, len(d), ids); err != nil {
		return err
	}
	for i, id := range ids {
		row := m.data[int(id)*m.rowBytes : (int(id)+1)*m.rowBytes]
		if err := quant.Dequantize(m.typ, row, d[i*m.cols:(i+1)*m.cols]); err != nil {
			return fmt.Errorf("kernels: embedding of token %d: %w", id, err)
		}
	}
	return nil
}

// rowGrain is the fewest rows of a row-wise operation (norms, RoPE,
// SiLU·mul, adds) worth handing to another goroutine: a prompt's rows are
// spread over the pool, a decoding step's few stay with the caller.
const rowGrain = 8

// eachRow calls fn over rows [0, n), split across the pool when there are
// many. Each row's arithmetic is the same however the rows are split.
func (c *CPU) eachRow(n int, fn func(lo, hi int)) {
	if n < 2*rowGrain {
		fn(0, n)
		return
	}
	c.pool.parallel(n, rowGrain, taskFunc(func(_, lo, hi int) { fn(lo, hi) }))
}

// RMSNorm implements Backend.
func (c *CPU) RMSNorm(dst, x, weight Buffer, eps float32) error {
	if err := c.enter(); err != nil {
		return err
	}
	defer c.leave()
	ops, err := c.bufs("rmsnorm", dst, x, weight)
	if err != nil {
		return err
	}
	d, xs, w := ops[0], ops[1], ops[2]
	if err := CheckRMSNorm(len(d), len(xs), len(w)); err != nil {
		return err
	}
	cols := len(w)
	c.eachRow(len(xs)/cols, func(lo, hi int) {
		for r := lo; r < hi; r++ {
			RMSNorm(d[r*cols:(r+1)*cols], xs[r*cols:(r+1)*cols], w, eps)
		}
	})
	return nil
}

// Rope implements Backend.
func (c *CPU) Rope(x, cos, sin Buffer, rows, headDim int, layout RopeLayout) error {
	if err := c.enter(); err != nil {
		return err
	}
	defer c.leave()
	ops, err := c.bufs("rope", x, cos, sin)
	if err != nil {
		return err
	}
	xs, cs, sn := ops[0], ops[1], ops[2]
	heads, half, err := CheckRope(len(xs), len(cs), len(sn), rows, headDim)
	if err != nil {
		return err
	}
	c.eachRow(rows, func(lo, hi int) {
		for r := lo; r < hi; r++ {
			cr, sr := cs[r*half:(r+1)*half], sn[r*half:(r+1)*half]
			for h := range heads {
				off := (r*heads + h) * headDim
				Rope(xs[off:off+headDim], cr, sr, layout)
			}
		}
	})
	return nil
}

// Softmax implements Backend.
func (c *CPU) Softmax(x Buffer, rows int) error {
	xs, err := c.buf(x, "softmax operand")
	if err != nil {
		return err
	}
	cols, err := CheckSoftmax(len(xs), rows)
	if err != nil {
		return err
	}
	for r := range rows {
		vec.Softmax(xs[r*cols : (r+1)*cols])
	}
	return nil
}

// siluBlock is the number of exponentials taken together, in a buffer on
// the stack; a multiple of 8, vec.ExpSum's vector width.
const siluBlock = 256

// SiLUMul implements Backend. The exponentials come from vec.ExpSum, whose
// vector code is many times faster than math.Exp but treats a slice's
// last len mod 8 elements apart: the last piece is padded to a multiple of
// 8, so that every element takes the vector path whatever its position,
// and results do not depend on how many rows the buffers hold.
func (c *CPU) SiLUMul(dst, gate, up Buffer) error {
	if err := c.enter(); err != nil {
		return err
	}
	defer c.leave()
	ops, err := c.bufs("silu·mul", dst, gate, up)
	if err != nil {
		return err
	}
	d, g, u := ops[0], ops[1], ops[2]
	if err := CheckSiLUMul(len(d), len(g), len(u)); err != nil {
		return err
	}
	if !aliasOrApart(d, g) || !aliasOrApart(d, u) {
		return fmt.Errorf("%w: silu·mul output overlaps an input without being it", ErrShape)
	}
	// Blocks of siluBlock elements stand in for rows.
	c.eachRow((len(d)+siluBlock-1)/siluBlock, func(lo, hi int) {
		var buf [siluBlock]float32
		for b := lo; b < hi; b++ {
			lo, hi := b*siluBlock, min((b+1)*siluBlock, len(d))
			gb, ub := g[lo:hi], u[lo:hi]
			e := buf[:(hi-lo+7)/8*8]
			clear(e[hi-lo:])
			for i, v := range gb {
				e[i] = -v
			}
			vec.ExpSum(e, e, 0)
			db := d[lo:hi]
			for i, v := range gb {
				db[i] = v / (1 + e[i]) * ub[i]
			}
		}
	})
	return nil
}

// Add implements Backend.
func (c *CPU) Add(dst, a, b Buffer) error {
	if err := c.enter(); err != nil {
		return err
	}
	defer c.leave()
	ops, err := c.bufs("add", dst, a, b)
	if err != nil {
		return err
	}
	d, as, bs := ops[0], ops[1], ops[2]
	if err := CheckAdd(len(d), len(as), len(bs)); err != nil || len(d) == 0 {
		return err
	}
	cols := len(bs)
	if cols == len(d) && len(d) >= 2*rowGrain*1024 {
		// One long residual: rows of 1024 stand in.
		cols = 1024
	}
	c.eachRow((len(d)+cols-1)/cols, func(lo, hi int) {
		for r := lo; r < hi; r++ {
			lo, hi := r*cols, min((r+1)*cols, len(d))
			vec.Add(d[lo:hi], as[lo:hi], bs[(lo%len(bs)):(lo%len(bs))+hi-lo])
		}
	})
	return nil
}

// cpuKV is a KVCache in Go memory.
type cpuKV struct {
	owner *CPU
	l     KVLayout
	pages int
	data  []byte
	freed atomic.Bool
}

func (k *cpuKV) Layout() KVLayout { return k.l }
func (k *cpuKV) Pages() int       { return k.pages }

func (c *CPU) kv(kv KVCache) (*cpuKV, error) {
	if err := c.open(); err != nil {
		return nil, err
	}
	k, ok := kv.(*cpuKV)
	if !ok || k == nil || k.owner != c {
		return nil, fmt.Errorf("%w: the KV cache is not one of this CPU backend", ErrForeign)
	}
	if k.freed.Load() {
		return nil, fmt.Errorf("%w: the KV cache has been freed", ErrForeign)
	}
	return k, nil
}

// NewKVCache implements Backend.
func (c *CPU) NewKVCache(l KVLayout, pages int) (KVCache, error) {
	if err := c.open(); err != nil {
		return nil, err
	}
	if err := CheckKVPages(l, pages); err != nil {
		return nil, err
	}
	if int64(pages)*int64(l.PageBytes()) > math.MaxInt {
		return nil, fmt.Errorf("%w: %d KV pages of %d bytes", ErrShape, pages, l.PageBytes())
	}
	return &cpuKV{owner: c, l: l, pages: pages, data: make([]byte, pages*l.PageBytes())}, nil
}

// WrapKV returns a KV cache over data itself, whole pages of layout l (an
// existing page pool, say): operations on it read and write data.
func (c *CPU) WrapKV(l KVLayout, data []byte) (KVCache, error) {
	if err := c.open(); err != nil {
		return nil, err
	}
	if err := l.Validate(); err != nil {
		return nil, err
	}
	pb := l.PageBytes()
	if len(data) == 0 || len(data)%pb != 0 {
		return nil, fmt.Errorf("%w: %d bytes are not whole KV pages of %d", ErrShape, len(data), pb)
	}
	if err := CheckKVPages(l, len(data)/pb); err != nil {
		return nil, err
	}
	return &cpuKV{owner: c, l: l, pages: len(data) / pb, data: data}, nil
}

// KVBytes returns the memory of a KV cache of this backend, laid out as
// KVLayout describes.
func (c *CPU) KVBytes(kv KVCache) ([]byte, error) {
	k, err := c.kv(kv)
	if err != nil {
		return nil, err
	}
	return k.data, nil
}

// FreeKVCache implements Backend.
func (c *CPU) FreeKVCache(kv KVCache) error {
	k, err := c.kv(kv)
	if err != nil {
		return err
	}
	k.freed.Store(true)
	return nil
}

// block returns the keys (v false) or values of layer in page.
func (k *cpuKV) block(page, layer int, v bool) []byte {
	bb := k.l.BlockBytes()
	off := page*k.l.PageBytes() + k.l.LayerOffset(layer)
	if v {
		off += bb
	}
	return k.data[off : off+bb : off+bb]
}

// StoreKV implements Backend.
func (c *CPU) StoreKV(kv KVCache, layer int, slots []int32, k, v Buffer) error {
	cache, err := c.kv(kv)
	if err != nil {
		return err
	}
	ops, err := c.bufs("store KV", k, v)
	if err != nil {
		return err
	}
	ks, vs := ops[0], ops[1]
	l := cache.l
	if err := CheckStoreKV(l, cache.pages, layer, slots, len(ks), len(vs)); err != nil {
		return err
	}
	re, rb := l.RowElems(), l.RowBytes()
	for i, s := range slots {
		page, pos := int(s)/l.PageSize, int(s)%l.PageSize
		EncodeKV(cache.block(page, layer, false)[pos*rb:(pos+1)*rb], ks[i*re:(i+1)*re], l.DType)
		EncodeKV(cache.block(page, layer, true)[pos*rb:(pos+1)*rb], vs[i*re:(i+1)*re], l.DType)
	}
	return nil
}

// Attention implements Backend: per query row and head, the scores
// against every key, their softmax, and the weighted sum of the values, on
// vec's kernels (cpu_attend.go), with the (row, head) pairs split over the
// pool. It is AttentionWith with no options.
func (c *CPU) Attention(out, q Buffer, kv KVCache, layer int, rows []AttnRow) error {
	return c.AttentionWith(out, q, kv, layer, rows, AttnOptions{})
}

// AttentionWith implements ExtendedOps: Attention's kernel, with the
// options' score scale and soft-cap applied to each score, and with a
// window, only the positions and pages in it. A window's positions are
// scored and summed in groups of four from a multiple of four, as a whole
// sequence's are, so that F32 results do not depend on the paging.
func (c *CPU) AttentionWith(out, q Buffer, kv KVCache, layer int, rows []AttnRow, o AttnOptions) error {
	if err := c.enter(); err != nil {
		return err
	}
	defer c.leave()
	cache, err := c.kv(kv)
	if err != nil {
		return err
	}
	ops, err := c.bufs("attention", out, q)
	if err != nil {
		return err
	}
	outs, qs := ops[0], ops[1]
	l := cache.l
	heads, err := CheckAttentionWith(l, cache.pages, layer, len(outs), len(qs), rows, o)
	if err != nil || len(rows) == 0 {
		return err
	}
	if overlap(outs, qs) {
		return fmt.Errorf("%w: attention output overlaps its queries", ErrShape)
	}
	maxLen := 0 // the most positions a row attends to
	for _, r := range rows {
		maxLen = max(maxLen, r.Len-WindowStart(r.Len, o.Window))
	}
	a, _ := c.attn.Get().(*attnCall)
	if a == nil {
		a = new(attnCall)
	}
	if len(a.parts) < c.threads {
		a.parts = make([]attnPart, c.threads)
	}
	for i := range a.parts {
		a.parts[i].sc.size(maxLen, l.HeadDim)
		a.parts[i].row = -1
	}
	a.kv, a.layer, a.rows, a.out, a.q, a.heads = cache, layer, rows, outs, qs, heads
	a.opts = newAttnOpts(o, l.HeadDim)
	// Each (row, head) pair costs about 2·positions·HeadDim multiply-adds;
	// keep chunks at ≥ 32k of them.
	grain := max(1, (1<<15)/(2*maxLen*l.HeadDim))
	c.pool.parallel(len(rows)*heads, grain, a)
	a.kv, a.rows, a.out, a.q = nil, nil, nil, nil
	c.attn.Put(a)
	return nil
}

// attnCall is one Attention in flight, the task the pool runs over its
// (row, head) pairs; recycled with its scratch space.
type attnCall struct {
	kv     *cpuKV
	layer  int
	rows   []AttnRow
	out, q []float32
	heads  int
	opts   attnOpts
	parts  []attnPart
}

// attnPart is one participant's scratch space: the page lists of the row
// it is working on (from the first page of its window), and attendPaged's
// buffers.
type attnPart struct {
	row    int // the row kp and vp belong to, or -1
	kp, vp [][]byte
	sc     attnScratch
}

func (a *attnCall) run(part, lo, hi int) {
	p := &a.parts[part]
	l := a.kv.l
	hd := l.HeadDim
	group := a.heads / l.KVHeads
	for j := lo; j < hi; j++ {
		i, h := j/a.heads, j%a.heads
		r := a.rows[i]
		first := WindowStart(r.Len, a.opts.window) / l.PageSize
		if p.row != i {
			p.kp, p.vp = p.kp[:0], p.vp[:0]
			for _, id := range r.Pages[first : (r.Len+l.PageSize-1)/l.PageSize] {
				p.kp = append(p.kp, a.kv.block(int(id), a.layer, false))
				p.vp = append(p.vp, a.kv.block(int(id), a.layer, true))
			}
			p.row = i
		}
		off := (i*a.heads + h) * hd
		base := first * l.PageSize // the position p.kp[0] starts at
		span := posSpan{lo: WindowStart(r.Len, a.opts.window) - base, n: r.Len - base, align: base % 4}
		attendPaged(a.out[off:off+hd], a.q[off:off+hd], p.kp, p.vp, span, l.PageSize, l.RowElems(), (h/group)*hd, l.DType, &p.sc, &a.opts)
	}
}

// ExportKV implements Backend.
func (c *CPU) ExportKV(dst []byte, kv KVCache, page, layer int) error {
	k, err := c.kv(kv)
	if err != nil {
		return err
	}
	if err := CheckKVPageIO(k.l, k.pages, page, layer, len(dst)); err != nil {
		return err
	}
	bb := k.l.BlockBytes()
	copy(dst[:bb], k.block(page, layer, false))
	copy(dst[bb:], k.block(page, layer, true))
	return nil
}

// ImportKV implements Backend.
func (c *CPU) ImportKV(kv KVCache, page, layer int, src []byte) error {
	k, err := c.kv(kv)
	if err != nil {
		return err
	}
	if err := CheckKVPageIO(k.l, k.pages, page, layer, len(src)); err != nil {
		return err
	}
	bb := k.l.BlockBytes()
	copy(k.block(page, layer, false), src[:bb])
	copy(k.block(page, layer, true), src[bb:])
	return nil
}

// CopyKVPage implements Backend.
func (c *CPU) CopyKVPage(kv KVCache, dst, src int) error {
	k, err := c.kv(kv)
	if err != nil {
		return err
	}
	if dst < 0 || dst >= k.pages || src < 0 || src >= k.pages {
		return fmt.Errorf("%w: copying KV page %d to %d of %d", ErrShape, src, dst, k.pages)
	}
	pb := k.l.PageBytes()
	copy(k.data[dst*pb:(dst+1)*pb], k.data[src*pb:(src+1)*pb])
	return nil
}

var (
	_ Backend        = (*CPU)(nil)
	_ HostKV         = (*CPU)(nil)
	_ ProductGrouper = (*CPU)(nil)
)

//go:build cuda

package cuda

import (
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"path"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"unsafe"

	"gorgonia.org/cu"

	"github.com/baton-serving/baton/kernels"
	"github.com/baton-serving/baton/kernels/quant"
)

//go:embed ptx
var ptxFiles embed.FS

// Launch geometry; each must match its #define in kernels.cu.
const (
	mmWarps       = 4   // MM_WARPS: weight rows per block
	mmTok         = 8   // MM_TOK: tokens per block
	attWarps      = 8   // ATT_WARPS
	attMaxHeadDim = 256 // ATT_MAXD
	rowThreads    = 256 // threads of the one-block-per-row kernels
	kvThreads     = 128 // threads of kv_store
	maxGridY      = 65535
	maxElemBlocks = 4096 // grid of the grid-stride elementwise kernels
)

// mmKernels names the matrix kernel of each weight type the GPU computes
// with.
var mmKernels = map[quant.Type]string{
	quant.F32:  "mm_f32",
	quant.F16:  "mm_f16",
	quant.BF16: "mm_bf16",
	quant.Q8_0: "mm_q8_0",
	quant.Q4_0: "mm_q4_0",
	// The types without a kernel of their own share one that dequantizes
	// element by element (RowDeq in kernels.cu).
	quant.Q4_1:   "mm_q4_1",
	quant.Q5_0:   "mm_q5_0",
	quant.Q5_1:   "mm_q5_1",
	quant.IQ4_NL: "mm_iq4_nl",
	quant.Q2_K:   "mm_q2_k",
	quant.Q3_K:   "mm_q3_k",
	quant.Q4_K:   "mm_q4_k",
	quant.Q5_K:   "mm_q5_k",
	quant.Q6_K:   "mm_q6_k",
	quant.IQ4_XS: "mm_iq4_xs",
}

// backend is the CUDA implementation of kernels.Backend. Every method
// takes mu, makes the context current on a locked OS thread, and issues
// its work to the default stream, which orders it after everything issued
// before.
type backend struct {
	mu     sync.Mutex
	dev    cu.Device
	ctx    cu.CUContext
	mod    cu.Module
	name   string
	uuid   string
	closed bool

	// allocs holds every live allocation, for Close to free; held sums
	// their bytes by use.
	allocs map[*allocation]struct{}
	held   [numUses]int64
	// scratch holds the index arrays of one operation (token ids, slots,
	// block tables) on their way to a kernel, and temporary copies.
	scratch *allocation

	// gelu holds the GELU table that gelu_mul looks up (geluTable),
	// uploaded once by New and freed by Close.
	gelu *allocation

	// copyStream carries the KV pages' copies to and from the host
	// (copy_cuda.go), through page-locked staging buffers: stagingAll
	// holds every one, stagingFree those not in use (both guarded by
	// stagingMu, which copies take without mu). copies counts the copies
	// whose callers wait for them without mu; Close waits for them.
	copyStream              cu.Stream
	stagingMu               sync.Mutex
	stagingAll, stagingFree []*staging
	copies                  sync.WaitGroup

	mm                                                         map[quant.Type]cu.Function
	embed, rmsnorm, rope, softmax, siluMul, add, store, attend cu.Function
	geluMul, scale, softCap                                    cu.Function
}

var (
	_ kernels.ExtendedOps    = (*backend)(nil)
	_ kernels.MemoryReporter = (*backend)(nil)
)

// New opens GPU opts.Device: it retains the device's primary context and
// loads the kernels (the embedded PTX for the GPU's compute capability,
// or opts.PTX), which the driver compiles for the GPU.
func New(opts Options) (kernels.Backend, error) {
	if err := initErr(); err != nil {
		return nil, err
	}
	n, err := cu.NumDevices()
	if err != nil {
		return nil, fmt.Errorf("kernels/cuda: counting devices: %w", err)
	}
	if opts.Device < 0 || opts.Device >= n {
		return nil, fmt.Errorf("%w: device %d, the driver sees %d", ErrNoDevice, opts.Device, n)
	}
	dev, err := cu.GetDevice(opts.Device)
	if err != nil {
		return nil, fmt.Errorf("kernels/cuda: device %d: %w", opts.Device, err)
	}
	major, err1 := dev.Attribute(cu.ComputeCapabilityMajor)
	minor, err2 := dev.Attribute(cu.ComputeCapabilityMinor)
	if err := errors.Join(err1, err2); err != nil {
		return nil, fmt.Errorf("kernels/cuda: compute capability of device %d: %w", opts.Device, err)
	}
	ptx, ptxName, err := choosePTX(opts.PTX, 10*major+minor)
	if err != nil {
		return nil, err
	}
	devName, _ := dev.Name()
	mem, _ := dev.TotalMem()
	var uuid string
	if u, err := dev.UUID(); err == nil {
		uuid = u.String()
	}
	ctx, err := dev.RetainPrimaryCtx()
	if err != nil {
		return nil, fmt.Errorf("kernels/cuda: retaining the primary context of device %d: %w", opts.Device, err)
	}
	b := &backend{
		dev:    dev,
		ctx:    ctx,
		uuid:   uuid,
		allocs: make(map[*allocation]struct{}),
		mm:     make(map[quant.Type]cu.Function),
		name: fmt.Sprintf("cuda: %s (device %d, compute %d.%d, %.1f GiB, %s)",
			strings.TrimSpace(devName), opts.Device, major, minor, float64(mem)/(1<<30), ptxName),
	}
	if err := b.inContext(func() error {
		if err := b.load(ptx); err != nil {
			return err
		}
		if err := b.newCopyStream(); err != nil {
			return errors.Join(err, b.mod.Unload())
		}
		if err := b.uploadGELU(); err != nil {
			return errors.Join(err, b.copyStream.Destroy(), b.mod.Unload())
		}
		return nil
	}); err != nil {
		return nil, errors.Join(err, dev.ReleasePrimaryCtx())
	}
	return b, nil
}

// choosePTX returns override if set, otherwise the embedded PTX for the
// highest compute capability (×10) at most cc.
func choosePTX(override string, cc int) (ptx, name string, err error) {
	if override != "" {
		return override, "PTX from Options", nil
	}
	files, _ := fs.Glob(ptxFiles, "ptx/kernels_sm*.ptx")
	best := -1
	for _, f := range files {
		nn, err := strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(path.Base(f), "kernels_sm"), ".ptx"))
		if err == nil && nn <= cc && nn > best {
			best, name = nn, f
		}
	}
	if name == "" {
		if len(files) == 0 {
			return "", "", errors.New("kernels/cuda: no PTX embedded in this build: run gen-ptx.sh where nvcc is, then rebuild (or set Options.PTX)")
		}
		return "", "", fmt.Errorf("kernels/cuda: no embedded PTX runs on compute capability %d.%d (have %s)", cc/10, cc%10, strings.Join(files, ", "))
	}
	data, err := ptxFiles.ReadFile(name)
	if err != nil {
		return "", "", fmt.Errorf("kernels/cuda: reading embedded %s: %w", name, err)
	}
	return string(data), path.Base(name), nil
}

// load loads the kernels' module and looks its functions up.
func (b *backend) load(ptx string) error {
	mod, err := cu.LoadData(ptx)
	if err != nil {
		// Load again asking for the JIT compiler's log, which says why.
		log := make([]byte, 8<<10)
		if _, err2 := cu.LoadDataEx(ptx, &cu.JITErrorLogBuffer{Buffer: log}); err2 != nil {
			if i := strings.IndexByte(string(log), 0); i >= 0 {
				log = log[:i]
			}
			return fmt.Errorf("kernels/cuda: loading the kernels: %w (JIT log: %q)", err, strings.TrimSpace(string(log)))
		}
		return fmt.Errorf("kernels/cuda: loading the kernels: %w", err)
	}
	b.mod = mod
	fn := func(name string) (f cu.Function) {
		if err != nil {
			return f
		}
		if f, err = mod.Function(name); err != nil {
			err = fmt.Errorf("kernels/cuda: kernel %s: %w (is the PTX older than kernels.cu?)", name, err)
		}
		return f
	}
	for typ, name := range mmKernels {
		b.mm[typ] = fn(name)
	}
	b.embed, b.rmsnorm, b.rope = fn("embed"), fn("rmsnorm"), fn("rope")
	b.softmax, b.siluMul, b.add = fn("softmax_rows"), fn("silu_mul"), fn("add_bcast")
	b.store, b.attend = fn("kv_store"), fn("attention")
	b.geluMul, b.scale, b.softCap = fn("gelu_mul"), fn("scale_f32"), fn("soft_cap")
	if err != nil {
		return errors.Join(err, mod.Unload())
	}
	return nil
}

// geluTable is kernels.GELU at every binary16 value, as float32: the
// table gelu_mul looks activations in -10 < x < 10 up in, rounded to
// binary16, so that the GPU's GELU·mul is the CPU's bit for bit.
func geluTable() []float32 {
	t := make([]float32, 1<<16)
	for i := range t {
		t[i] = kernels.GELU(quant.F16ToF32(uint16(i)))
	}
	return t
}

// uploadGELU copies geluTable to the device (256 KiB), once.
func (b *backend) uploadGELU() error {
	t := geluTable()
	a, err := b.alloc(4*int64(len(t)), useBuffers, "the GELU table")
	if err != nil {
		return err
	}
	if err := cu.MemcpyHtoD(a.ptr, unsafe.Pointer(&t[0]), a.bytes); err != nil {
		return errors.Join(fmt.Errorf("kernels/cuda: uploading the GELU table: %w", err), b.free(a))
	}
	b.gelu = a
	return nil
}

// inContext runs f with the backend's context current on a locked OS
// thread; CUDA contexts are per thread, goroutines are not.
func (b *backend) inContext(f func() error) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := cu.PushCurrentCtx(b.ctx); err != nil {
		return fmt.Errorf("kernels/cuda: making the context current: %w", err)
	}
	err := f()
	if _, perr := cu.PopCurrentCtx(); perr != nil && err == nil {
		err = fmt.Errorf("kernels/cuda: releasing the context: %w", perr)
	}
	return err
}

// do runs f under the backend's lock, in its context.
func (b *backend) do(f func() error) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return kernels.ErrClosed
	}
	return b.inContext(f)
}

func (b *backend) Name() string { return b.name }

// UUID is the GPU's UUID as the driver reports it, "" if it did not:
// what matches the device to NVML's, which numbers GPUs in another order.
func (b *backend) UUID() string { return b.uuid }

// Arguments of a kernel launch. cu's Launch reads 8 bytes behind every
// parameter pointer and the driver takes as many as the parameter's PTX
// type has, so every value travels as a little-endian uint64.
func ptrArg(p cu.DevicePtr) uint64 { return uint64(p) }
func intArg(v int) uint64          { return uint64(uint32(int32(v))) }
func longArg(v int) uint64         { return uint64(int64(v)) }
func floatArg(v float32) uint64    { return uint64(math.Float32bits(v)) }

func (b *backend) launch(fn cu.Function, what string, gx, gy, bx, by int, args ...uint64) error {
	params := make([]unsafe.Pointer, len(args))
	for i := range args {
		params[i] = unsafe.Pointer(&args[i])
	}
	if err := fn.Launch(gx, gy, 1, bx, by, 1, 0, cu.Stream{}, params); err != nil {
		return fmt.Errorf("kernels/cuda: launching %s: %w", what, err)
	}
	return nil
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }

// allocation is one piece of device memory. Operands point to theirs,
// and check it is not freed: the driver reuses the addresses of freed
// memory, so an address alone cannot tell.
type allocation struct {
	ptr   cu.DevicePtr
	bytes int64
	use   memUse
	freed bool
}

// memUse is what an allocation is for, as kernels.Memory counts it.
type memUse int

const (
	useBuffers memUse = iota
	useWeights
	useKV
	numUses
)

// alloc allocates bytes bytes (at least 4) for use and records them.
func (b *backend) alloc(bytes int64, use memUse, what string) (*allocation, error) {
	bytes = max(bytes, 4)
	p, err := cu.MemAlloc(bytes)
	if err != nil {
		free, total, _ := cu.MemInfo()
		return nil, fmt.Errorf("kernels/cuda: allocating %d bytes for %s (%d of the device's %d bytes free): %w", bytes, what, free, total, err)
	}
	a := &allocation{ptr: p, bytes: bytes, use: use}
	b.allocs[a] = struct{}{}
	b.held[use] += bytes
	return a, nil
}

// Memory implements kernels.MemoryReporter.
func (b *backend) Memory() (kernels.Memory, error) {
	var m kernels.Memory
	err := b.do(func() error {
		m.Weights, m.KV, m.Buffers = b.held[useWeights], b.held[useKV], b.held[useBuffers]
		var err error
		m.Free, m.Total, err = cu.MemInfo()
		if err != nil {
			return fmt.Errorf("kernels/cuda: device memory: %w", err)
		}
		return nil
	})
	return m, err
}

// free releases an allocation once the work queued before it is done.
func (b *backend) free(a *allocation) error {
	if err := cu.Synchronize(); err != nil {
		return fmt.Errorf("kernels/cuda: waiting for the device before a free: %w", err)
	}
	delete(b.allocs, a)
	a.freed = true
	b.held[a.use] -= a.bytes
	if err := cu.MemFree(a.ptr); err != nil {
		return fmt.Errorf("kernels/cuda: freeing device memory: %w", err)
	}
	return nil
}

// ensureScratch makes the scratch allocation at least bytes long.
// Replacing it waits for the work that may still read the old one.
func (b *backend) ensureScratch(bytes int64) error {
	if b.scratch != nil && bytes <= b.scratch.bytes {
		return nil
	}
	if b.scratch != nil {
		if err := b.free(b.scratch); err != nil {
			return err
		}
		b.scratch = nil
	}
	size := int64(64 << 10)
	for size < bytes {
		size *= 2
	}
	a, err := b.alloc(size, useBuffers, "scratch")
	if err != nil {
		return err
	}
	b.scratch = a
	return nil
}

// upload copies v to the scratch allocation. A copy from pageable host
// memory waits for the work queued before it, so nothing still reads what
// it overwrites.
func (b *backend) upload(v []int32) (cu.DevicePtr, error) {
	if err := b.ensureScratch(4 * int64(len(v))); err != nil {
		return 0, err
	}
	if len(v) > 0 {
		if err := cu.MemcpyHtoD(b.scratch.ptr, unsafe.Pointer(&v[0]), 4*int64(len(v))); err != nil {
			return 0, fmt.Errorf("kernels/cuda: uploading %d indices: %w", len(v), err)
		}
	}
	return b.scratch.ptr, nil
}

// buffer is a kernels.Buffer in device memory.
type buffer struct {
	b   *backend
	a   *allocation // the allocation it belongs to
	ptr cu.DevicePtr
	n   int
}

func (x *buffer) Len() int { return x.n }

func (x *buffer) Slice(lo, hi int) kernels.Buffer {
	if lo < 0 || hi < lo || hi > x.n {
		panic(fmt.Sprintf("kernels/cuda: slice [%d:%d] of a buffer of %d", lo, hi, x.n))
	}
	return &buffer{b: x.b, a: x.a, ptr: x.ptr + cu.DevicePtr(4*lo), n: hi - lo}
}

func (x *buffer) end() cu.DevicePtr { return x.ptr + cu.DevicePtr(4*x.n) }

// overlaps reports whether x and y share memory.
func (x *buffer) overlaps(y *buffer) bool {
	return x.n > 0 && y.n > 0 && x.ptr < y.end() && y.ptr < x.end()
}

func (b *backend) buf(x kernels.Buffer, what string) (*buffer, error) {
	d, ok := x.(*buffer)
	if !ok || d == nil || d.b != b {
		return nil, fmt.Errorf("%w: %s is not a buffer of this CUDA backend", kernels.ErrForeign, what)
	}
	if d.a.freed {
		return nil, fmt.Errorf("%w: %s has been freed", kernels.ErrForeign, what)
	}
	return d, nil
}

// bufs checks several operands at once.
func (b *backend) bufs(what string, xs ...kernels.Buffer) ([]*buffer, error) {
	out := make([]*buffer, len(xs))
	for i, x := range xs {
		d, err := b.buf(x, fmt.Sprintf("%s operand %d", what, i))
		if err != nil {
			return nil, err
		}
		out[i] = d
	}
	return out, nil
}

func (b *backend) Alloc(n int) (kernels.Buffer, error) {
	if n < 0 || n > math.MaxInt64/4 {
		return nil, fmt.Errorf("%w: buffer of %d elements", kernels.ErrShape, n)
	}
	var out *buffer
	err := b.do(func() error {
		a, err := b.alloc(4*int64(n), useBuffers, "a buffer")
		if err != nil {
			return err
		}
		if err := cu.MemsetD32(a.ptr, 0, a.bytes/4); err != nil {
			return errors.Join(fmt.Errorf("kernels/cuda: zeroing a buffer: %w", err), b.free(a))
		}
		out = &buffer{b: b, a: a, ptr: a.ptr, n: n}
		return nil
	})
	return out, err
}

func (b *backend) Free(x kernels.Buffer) error {
	return b.do(func() error {
		d, err := b.buf(x, "the buffer to free")
		if err != nil {
			return err
		}
		if d.ptr != d.a.ptr || max(4*int64(d.n), 4) != d.a.bytes {
			return fmt.Errorf("%w: freeing a slice of a buffer rather than the buffer", kernels.ErrShape)
		}
		return b.free(d.a)
	})
}

func (b *backend) Write(dst kernels.Buffer, src []float32) error {
	return b.do(func() error {
		d, err := b.buf(dst, "write destination")
		if err != nil {
			return err
		}
		if len(src) != d.n {
			return fmt.Errorf("%w: writing %d values to a buffer of %d", kernels.ErrShape, len(src), d.n)
		}
		if d.n == 0 {
			return nil
		}
		if err := cu.MemcpyHtoD(d.ptr, unsafe.Pointer(&src[0]), 4*int64(d.n)); err != nil {
			return fmt.Errorf("kernels/cuda: copying %d values to the device: %w", d.n, err)
		}
		return nil
	})
}

func (b *backend) Read(dst []float32, src kernels.Buffer) error {
	return b.do(func() error {
		s, err := b.buf(src, "read source")
		if err != nil {
			return err
		}
		if len(dst) != s.n {
			return fmt.Errorf("%w: reading a buffer of %d into %d values", kernels.ErrShape, s.n, len(dst))
		}
		if s.n == 0 {
			return nil
		}
		if err := cu.MemcpyDtoH(unsafe.Pointer(&dst[0]), s.ptr, 4*int64(s.n)); err != nil {
			return fmt.Errorf("kernels/cuda: copying %d values from the device: %w", s.n, err)
		}
		return nil
	})
}

func (b *backend) Copy(dst, src kernels.Buffer) error {
	return b.do(func() error {
		ops, err := b.bufs("copy", dst, src)
		if err != nil {
			return err
		}
		d, s := ops[0], ops[1]
		if d.n != s.n {
			return fmt.Errorf("%w: copying %d values into %d", kernels.ErrShape, s.n, d.n)
		}
		bytes := 4 * int64(d.n)
		if d.n == 0 || d.ptr == s.ptr {
			return nil
		}
		if d.overlaps(s) {
			// Device-to-device copies do not handle overlap: go through
			// the scratch allocation.
			if err := b.ensureScratch(bytes); err != nil {
				return err
			}
			if err := cu.MemcpyDtoD(b.scratch.ptr, s.ptr, bytes); err != nil {
				return fmt.Errorf("kernels/cuda: copying %d values: %w", d.n, err)
			}
			s = &buffer{ptr: b.scratch.ptr, n: s.n}
		}
		if err := cu.MemcpyDtoD(d.ptr, s.ptr, bytes); err != nil {
			return fmt.Errorf("kernels/cuda: copying %d values: %w", d.n, err)
		}
		return nil
	})
}

// matrix is a kernels.Matrix in device memory.
type matrix struct {
	b                    *backend
	a                    *allocation
	typ                  quant.Type
	rows, cols, rowBytes int
}

func (m *matrix) Type() quant.Type { return m.typ }
func (m *matrix) Rows() int        { return m.rows }
func (m *matrix) Cols() int        { return m.cols }

func (b *backend) mat(w kernels.Matrix) (*matrix, error) {
	m, ok := w.(*matrix)
	if !ok || m == nil || m.b != b {
		return nil, fmt.Errorf("%w: the matrix is not one of this CUDA backend", kernels.ErrForeign)
	}
	if m.a.freed {
		return nil, fmt.Errorf("%w: the matrix has been freed", kernels.ErrForeign)
	}
	return m, nil
}

func (b *backend) LoadMatrix(typ quant.Type, rows, cols int, data []byte) (kernels.Matrix, error) {
	rowBytes, err := kernels.CheckMatrix(typ, rows, cols, len(data))
	if err != nil {
		return nil, err
	}
	if _, ok := mmKernels[typ]; !ok {
		return nil, fmt.Errorf("%w: the CUDA backend computes with F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K and IQ4_XS weights, not %s", kernels.ErrUnsupported, typ)
	}
	if rows > math.MaxInt32 || cols > math.MaxInt32 {
		return nil, fmt.Errorf("%w: a %d×%d matrix exceeds the kernels' 32-bit sizes", kernels.ErrUnsupported, rows, cols)
	}
	var m *matrix
	err = b.do(func() error {
		a, err := b.alloc(int64(len(data)), useWeights, "a weight matrix")
		if err != nil {
			return err
		}
		if err := cu.MemcpyHtoD(a.ptr, unsafe.Pointer(&data[0]), int64(len(data))); err != nil {
			return errors.Join(fmt.Errorf("kernels/cuda: uploading a %d×%d %s matrix: %w", rows, cols, typ, err), b.free(a))
		}
		m = &matrix{b: b, a: a, typ: typ, rows: rows, cols: cols, rowBytes: rowBytes}
		return nil
	})
	return m, err
}

func (b *backend) FreeMatrix(w kernels.Matrix) error {
	return b.do(func() error {
		m, err := b.mat(w)
		if err != nil {
			return err
		}
		return b.free(m.a)
	})
}

func (b *backend) MatMul(dst kernels.Buffer, w kernels.Matrix, x kernels.Buffer) error {
	return b.do(func() error {
		m, err := b.mat(w)
		if err != nil {
			return err
		}
		ops, err := b.bufs("matmul", dst, x)
		if err != nil {
			return err
		}
		d, xb := ops[0], ops[1]
		tokens, err := kernels.CheckMatMul(m.rows, m.cols, d.n, xb.n)
		if err != nil {
			return err
		}
		if d.overlaps(xb) {
			return fmt.Errorf("%w: matmul output overlaps its input", kernels.ErrShape)
		}
		// The grid's y dimension counts token tiles and is limited.
		const step = maxGridY * mmTok
		for t0 := 0; t0 < tokens; t0 += step {
			nt := min(tokens-t0, step)
			err := b.launch(b.mm[m.typ], "matmul", ceilDiv(m.rows, mmWarps), ceilDiv(nt, mmTok), 32, mmWarps,
				ptrArg(d.ptr+cu.DevicePtr(4*t0*m.rows)), ptrArg(m.a.ptr), ptrArg(xb.ptr+cu.DevicePtr(4*t0*m.cols)),
				intArg(m.rows), intArg(m.cols), intArg(nt), longArg(m.rowBytes))
			if err != nil {
				return err
			}
		}
		return nil
	})
}

func (b *backend) Embed(dst kernels.Buffer, w kernels.Matrix, ids []int32) error {
	return b.do(func() error {
		m, err := b.mat(w)
		if err != nil {
			return err
		}
		d, err := b.buf(dst, "embedding output")
		if err != nil {
			return err
		}
		if err := kernels.CheckEmbed(m.rows, m.cols, d.n, ids); err != nil {
			return err
		}
		if len(ids) == 0 {
			return nil
		}
		p, err := b.upload(ids)
		if err != nil {
			return err
		}
		return b.launch(b.embed, "embed", len(ids), 1, rowThreads, 1,
			ptrArg(d.ptr), ptrArg(m.a.ptr), ptrArg(p), intArg(m.cols), longArg(m.rowBytes), intArg(int(m.typ)))
	})
}

func (b *backend) RMSNorm(dst, x, weight kernels.Buffer, eps float32) error {
	return b.do(func() error {
		ops, err := b.bufs("rmsnorm", dst, x, weight)
		if err != nil {
			return err
		}
		d, xb, wb := ops[0], ops[1], ops[2]
		if err := kernels.CheckRMSNorm(d.n, xb.n, wb.n); err != nil {
			return err
		}
		if xb.n == 0 {
			return nil
		}
		return b.launch(b.rmsnorm, "rmsnorm", xb.n/wb.n, 1, rowThreads, 1,
			ptrArg(d.ptr), ptrArg(xb.ptr), ptrArg(wb.ptr), intArg(wb.n), floatArg(eps))
	})
}

func (b *backend) Rope(x, cos, sin kernels.Buffer, rows, headDim int, layout kernels.RopeLayout) error {
	return b.do(func() error {
		ops, err := b.bufs("rope", x, cos, sin)
		if err != nil {
			return err
		}
		xb, cb, sb := ops[0], ops[1], ops[2]
		heads, half, err := kernels.CheckRope(xb.n, cb.n, sb.n, rows, headDim)
		if err != nil {
			return err
		}
		neox := 0
		if layout == kernels.RopeNeoX {
			neox = 1
		}
		return b.launch(b.rope, "rope", rows, 1, rowThreads, 1,
			ptrArg(xb.ptr), ptrArg(cb.ptr), ptrArg(sb.ptr), intArg(heads), intArg(headDim), intArg(half), intArg(neox))
	})
}

func (b *backend) Softmax(x kernels.Buffer, rows int) error {
	return b.do(func() error {
		xb, err := b.buf(x, "softmax operand")
		if err != nil {
			return err
		}
		cols, err := kernels.CheckSoftmax(xb.n, rows)
		if err != nil || cols == 0 {
			return err
		}
		return b.launch(b.softmax, "softmax", rows, 1, rowThreads, 1, ptrArg(xb.ptr), intArg(cols))
	})
}

// elemGrid is the grid of a grid-stride kernel over n elements.
func elemGrid(n int) int { return min(ceilDiv(n, rowThreads), maxElemBlocks) }

func (b *backend) SiLUMul(dst, gate, up kernels.Buffer) error {
	return b.do(func() error {
		ops, err := b.bufs("silu·mul", dst, gate, up)
		if err != nil {
			return err
		}
		d, g, u := ops[0], ops[1], ops[2]
		if err := kernels.CheckSiLUMul(d.n, g.n, u.n); err != nil || d.n == 0 {
			return err
		}
		return b.launch(b.siluMul, "silu_mul", elemGrid(d.n), 1, rowThreads, 1,
			ptrArg(d.ptr), ptrArg(g.ptr), ptrArg(u.ptr), longArg(d.n))
	})
}

func (b *backend) Add(dst, a, c kernels.Buffer) error {
	return b.do(func() error {
		ops, err := b.bufs("add", dst, a, c)
		if err != nil {
			return err
		}
		d, ab, cb := ops[0], ops[1], ops[2]
		if err := kernels.CheckAdd(d.n, ab.n, cb.n); err != nil || d.n == 0 {
			return err
		}
		return b.launch(b.add, "add", elemGrid(d.n), 1, rowThreads, 1,
			ptrArg(d.ptr), ptrArg(ab.ptr), ptrArg(cb.ptr), longArg(d.n), longArg(cb.n))
	})
}

// aliasOrApart reports whether an element-wise kernel may write d while
// reading x: d is x, or the two do not overlap (at an offset, one thread
// would read what another had already written).
func aliasOrApart(d, x *buffer) bool { return !d.overlaps(x) || (d.ptr == x.ptr && d.n == x.n) }

// GELUMul implements kernels.ExtendedOps with gelu_mul, which looks
// ggml's GELU up in the table that New uploaded: the CPU's result bit for
// bit.
func (b *backend) GELUMul(dst, gate, up kernels.Buffer) error {
	return b.do(func() error {
		ops, err := b.bufs("gelu·mul", dst, gate, up)
		if err != nil {
			return err
		}
		d, g, u := ops[0], ops[1], ops[2]
		if err := kernels.CheckGELUMul(d.n, g.n, u.n); err != nil {
			return err
		}
		if !aliasOrApart(d, g) || !aliasOrApart(d, u) {
			return fmt.Errorf("%w: gelu·mul output overlaps an input without being it", kernels.ErrShape)
		}
		if d.n == 0 {
			return nil
		}
		return b.launch(b.geluMul, "gelu_mul", elemGrid(d.n), 1, rowThreads, 1,
			ptrArg(d.ptr), ptrArg(g.ptr), ptrArg(u.ptr), ptrArg(b.gelu.ptr), longArg(d.n))
	})
}

// Scale implements kernels.ExtendedOps; exact, as on the CPU.
func (b *backend) Scale(dst, x kernels.Buffer, s float32) error {
	return b.do(func() error {
		ops, err := b.bufs("scale", dst, x)
		if err != nil {
			return err
		}
		d, xb := ops[0], ops[1]
		if err := kernels.CheckScale(d.n, xb.n); err != nil {
			return err
		}
		if !aliasOrApart(d, xb) {
			return fmt.Errorf("%w: scale output overlaps its input without being it", kernels.ErrShape)
		}
		if d.n == 0 {
			return nil
		}
		return b.launch(b.scale, "scale_f32", elemGrid(d.n), 1, rowThreads, 1,
			ptrArg(d.ptr), ptrArg(xb.ptr), floatArg(s), longArg(d.n))
	})
}

// SoftCap implements kernels.ExtendedOps. The device's tanhf is within 2
// ulp of the correctly rounded tanh the CPU uses, so each result may
// differ from the CPU's by a few ulp of c (kernels.cu, soft_cap).
func (b *backend) SoftCap(x kernels.Buffer, c float32) error {
	return b.do(func() error {
		xb, err := b.buf(x, "soft-cap operand")
		if err != nil {
			return err
		}
		if err := kernels.CheckSoftCap(c); err != nil || xb.n == 0 {
			return err
		}
		return b.launch(b.softCap, "soft_cap", elemGrid(xb.n), 1, rowThreads, 1,
			ptrArg(xb.ptr), floatArg(c), longArg(xb.n))
	})
}

// kvCache is a kernels.KVCache in device memory.
type kvCache struct {
	b     *backend
	a     *allocation
	l     kernels.KVLayout
	pages int
}

func (c *kvCache) Layout() kernels.KVLayout { return c.l }
func (c *kvCache) Pages() int               { return c.pages }

func (b *backend) kv(kv kernels.KVCache) (*kvCache, error) {
	c, ok := kv.(*kvCache)
	if !ok || c == nil || c.b != b {
		return nil, fmt.Errorf("%w: the KV cache is not one of this CUDA backend", kernels.ErrForeign)
	}
	if c.a.freed {
		return nil, fmt.Errorf("%w: the KV cache has been freed", kernels.ErrForeign)
	}
	return c, nil
}

func (b *backend) NewKVCache(l kernels.KVLayout, pages int) (kernels.KVCache, error) {
	if err := kernels.CheckKVPages(l, pages); err != nil {
		return nil, err
	}
	var c *kvCache
	err := b.do(func() error {
		bytes := int64(pages) * int64(l.PageBytes())
		a, err := b.alloc(bytes, useKV, "a KV cache")
		if err != nil {
			return err
		}
		if err := cu.MemsetD8(a.ptr, 0, bytes); err != nil {
			return errors.Join(fmt.Errorf("kernels/cuda: zeroing a KV cache: %w", err), b.free(a))
		}
		c = &kvCache{b: b, a: a, l: l, pages: pages}
		return nil
	})
	return c, err
}

func (b *backend) FreeKVCache(kv kernels.KVCache) error {
	return b.do(func() error {
		c, err := b.kv(kv)
		if err != nil {
			return err
		}
		return b.free(c.a)
	})
}

func boolArg(v bool) uint64 {
	if v {
		return 1
	}
	return 0
}

func (b *backend) StoreKV(kv kernels.KVCache, layer int, slots []int32, k, v kernels.Buffer) error {
	return b.do(func() error {
		c, err := b.kv(kv)
		if err != nil {
			return err
		}
		ops, err := b.bufs("store KV", k, v)
		if err != nil {
			return err
		}
		kb, vb := ops[0], ops[1]
		l := c.l
		if err := kernels.CheckStoreKV(l, c.pages, layer, slots, kb.n, vb.n); err != nil || len(slots) == 0 {
			return err
		}
		p, err := b.upload(slots)
		if err != nil {
			return err
		}
		return b.launch(b.store, "kv_store", len(slots), 1, kvThreads, 1,
			ptrArg(c.a.ptr), ptrArg(kb.ptr), ptrArg(vb.ptr), ptrArg(p), intArg(l.RowElems()), intArg(l.PageSize),
			longArg(l.PageBytes()), longArg(l.LayerOffset(layer)), longArg(l.BlockBytes()), boolArg(l.DType == quant.F16))
	})
}

func (b *backend) Attention(out, q kernels.Buffer, kv kernels.KVCache, layer int, rows []kernels.AttnRow) error {
	return b.AttentionWith(out, q, kv, layer, rows, kernels.AttnOptions{})
}

// AttentionWith implements kernels.ExtendedOps: the attention kernel with
// a score scale, a soft-cap and a sliding window, whose pages wholly
// before the window are neither checked nor read (their block table
// entries travel to the device, unread).
func (b *backend) AttentionWith(out, q kernels.Buffer, kv kernels.KVCache, layer int, rows []kernels.AttnRow, o kernels.AttnOptions) error {
	return b.do(func() error {
		c, err := b.kv(kv)
		if err != nil {
			return err
		}
		ops, err := b.bufs("attention", out, q)
		if err != nil {
			return err
		}
		ob, qb := ops[0], ops[1]
		l := c.l
		heads, err := kernels.CheckAttentionWith(l, c.pages, layer, ob.n, qb.n, rows, o)
		if err != nil || len(rows) == 0 {
			return err
		}
		if l.HeadDim > attMaxHeadDim || heads > maxGridY {
			return fmt.Errorf("%w: attention with %d heads of %d (the CUDA kernel takes heads of at most %d, at most %d heads)",
				kernels.ErrUnsupported, heads, l.HeadDim, attMaxHeadDim, maxGridY)
		}
		if o.Window > math.MaxInt32 {
			o.Window = 0 // wider than any row: no window
		}
		scale := o.Scale
		if scale == 0 {
			scale = float32(1 / math.Sqrt(float64(l.HeadDim)))
		}
		idx, err := attentionIndex(rows, l.PageSize)
		if err != nil {
			return err
		}
		p, err := b.upload(idx)
		if err != nil {
			return err
		}
		info, tables := p, p+cu.DevicePtr(8*len(rows))
		return b.launch(b.attend, "attention", len(rows), heads, 32, attWarps,
			ptrArg(ob.ptr), ptrArg(qb.ptr), ptrArg(c.a.ptr), ptrArg(tables), ptrArg(info),
			intArg(heads), intArg(l.KVHeads), intArg(l.HeadDim), intArg(l.PageSize),
			longArg(l.PageBytes()), longArg(l.LayerOffset(layer)), longArg(l.BlockBytes()),
			boolArg(l.DType == quant.F16), floatArg(scale), floatArg(o.SoftCap), intArg(o.Window))
	})
}

func (b *backend) CopyKVPage(kv kernels.KVCache, dst, src int) error {
	return b.do(func() error {
		c, err := b.kv(kv)
		if err != nil {
			return err
		}
		if dst < 0 || dst >= c.pages || src < 0 || src >= c.pages {
			return fmt.Errorf("%w: copying KV page %d to %d of %d", kernels.ErrShape, src, dst, c.pages)
		}
		if dst == src {
			return nil
		}
		pb := int64(c.l.PageBytes())
		if err := cu.MemcpyDtoD(c.a.ptr+cu.DevicePtr(int64(dst)*pb), c.a.ptr+cu.DevicePtr(int64(src)*pb), pb); err != nil {
			return fmt.Errorf("kernels/cuda: copying KV page %d to %d: %w", src, dst, err)
		}
		return nil
	})
}

func (b *backend) Sync() error {
	return b.do(func() error {
		if err := cu.Synchronize(); err != nil {
			return fmt.Errorf("kernels/cuda: %w", err)
		}
		return nil
	})
}

func (b *backend) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil
	}
	b.closed = true
	// Copies in flight finish (nothing new starts: closed is set).
	b.copies.Wait()
	err := b.inContext(func() error {
		errs := []error{cu.Synchronize(), b.closeCopies()}
		for a := range b.allocs {
			a.freed = true
			errs = append(errs, cu.MemFree(a.ptr))
		}
		clear(b.allocs)
		b.held = [numUses]int64{}
		b.scratch = nil
		errs = append(errs, b.mod.Unload())
		return errors.Join(errs...)
	})
	if rerr := b.dev.ReleasePrimaryCtx(); rerr != nil {
		err = errors.Join(err, rerr)
	}
	if err != nil {
		return fmt.Errorf("kernels/cuda: closing: %w", err)
	}
	return nil
}

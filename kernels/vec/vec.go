package vec

import (
	"errors"
	"fmt"
	"math"
)

// Block geometry of the quantized activation types. The byte sizes match
// [quant.RowBytes] for quant.Q8_0 and quant.Q8_K.
const (
	// Q8_0Values is the number of values in a Q8_0 (and Q4_0) block.
	Q8_0Values = 32
	// Q8_0Bytes is the size of a Q8_0 block: binary16 scale d, 32 int8.
	Q8_0Bytes = 34
	// Q8_KValues is the number of values in a Q8_K (and Q4_K, Q6_K) block.
	Q8_KValues = 256
	// Q8_KBytes is the size of a Q8_K block: float32 scale d, 256 int8
	// values, 16 int16 sums of consecutive 16-value groups.
	Q8_KBytes = 292
)

// ErrShape reports buffers whose lengths do not fit together.
var ErrShape = errors.New("vec: shape mismatch")

// qtype indexes the quantized weight types.
type qtype int

const (
	q8_0 qtype = iota
	q4_0
	q4_K
	q6_K
	q4_1 // q4_1 … iq4_nl: legacy.go
	q5_0
	q5_1
	iq4_nl
	q2_K // q2_K … iq4_XS: kquant2.go
	q3_K
	q5_K
	iq4_XS
	numQ
)

// qinfo describes a quantized weight type and the activation type it pairs
// with.
var qinfo = [numQ]struct {
	name   string
	values int // values per block
	wBytes int // bytes per weight block
	xBytes int // bytes per activation block
}{
	q8_0:   {"Q8_0", 32, 34, Q8_0Bytes},
	q4_0:   {"Q4_0", 32, 18, Q8_0Bytes},
	q4_K:   {"Q4_K", 256, 144, Q8_KBytes},
	q6_K:   {"Q6_K", 256, 210, Q8_KBytes},
	q4_1:   {"Q4_1", 32, 20, Q8_1Bytes},
	q5_0:   {"Q5_0", 32, 22, Q8_0Bytes},
	q5_1:   {"Q5_1", 32, 24, Q8_1Bytes},
	iq4_nl: {"IQ4_NL", 32, 18, Q8_0Bytes},
	q2_K:   {"Q2_K", 256, 84, Q8_KBytes},
	q3_K:   {"Q3_K", 256, 110, Q8_KBytes},
	q5_K:   {"Q5_K", 256, 176, Q8_KBytes},
	iq4_XS: {"IQ4_XS", 256, 136, Q8_KBytes},
}

// impl is one implementation of every kernel. The exported functions check
// shapes and then call the chosen implementation, so an impl may assume
// consistent, non-negative sizes.
type impl struct {
	name string

	dotF32 func(a, b []float32) float32
	// dot4F32 sets dst[i] = w[i·stride:]·x for i < 4 (shapes checked).
	dot4F32 func(dst *[4]float32, w []float32, stride int, x []float32)
	// dot4F16 is dot4F32 for binary16 rows, stride in values.
	dot4F16 func(dst *[4]float32, w []byte, stride int, x []float32)
	dotF16  func(w []byte, x []float32) float32
	dotBF16 func(w []byte, x []float32) float32

	matVecF32  func(dst, w, x []float32, rows, cols int)
	matVecF16  func(dst []float32, w []byte, x []float32, rows, cols int)
	matVecBF16 func(dst []float32, w []byte, x []float32, rows, cols int)

	// The float matrix-matrix kernels take the activations as rows (x)
	// and, where packLen is not zero, optionally already packed (xp, from
	// pack; nil packs them per call).
	matMulF32  func(dst []float32, ldd int, w, x, xp []float32, rows, cols, tokens int)
	matMulF16  func(dst []float32, ldd int, w []byte, x, xp []float32, rows, cols, tokens int)
	matMulBF16 func(dst []float32, ldd int, w []byte, x, xp []float32, rows, cols, tokens int)
	packLen    func(cols, tokens int) int
	pack       func(dst, x []float32, cols, tokens int)

	// The quantized kernels count in blocks: nb blocks per row.
	dotQ    [numQ]func(w, xq []byte, nb int) float32
	matVecQ [numQ]func(dst []float32, w, xq []byte, rows, nb int)
	matMulQ [numQ]func(dst []float32, ldd int, w, xq []byte, rows, nb, tokens int)

	quantQ8_0 func(x []float32, dst []byte)
	quantQ8_K func(x []float32, dst []byte)
	quantQ8_1 func(x []float32, dst []byte)

	expSum func(dst, x []float32, shift float32) float32

	// axpy4 and axpy4F16 take rows of len(y) values (float32, or 2·len(y)
	// bytes of binary16).
	axpy4    func(y []float32, e *[4]float32, v0, v1, v2, v3 []float32)
	axpy4F16 func(y []float32, e *[4]float32, v0, v1, v2, v3 []byte)
}

// active is the implementation chosen at package initialisation; only
// the test hook [SetImplementation] changes it afterwards.
var active = chooseImpl()

// Implementation names the kernels in use: "avx512", "avx2" or "purego".
func Implementation() string { return active.name }

func nan32() float32 { return float32(math.NaN()) }

func fillNaN(dst []float32) {
	nan := nan32()
	for i := range dst {
		dst[i] = nan
	}
}

// DotF32 returns Σ a[i]·b[i], or NaN if the lengths differ.
func DotF32(a, b []float32) float32 {
	if len(a) != len(b) {
		return nan32()
	}
	return active.dotF32(a, b)
}

// Dot4F32 sets dst[i] to the dot product of x with the row of len(x)
// values at w[i·stride:], for the four rows i = 0…3: attention's scores of
// four cached positions, whose keys are stride apart. It computes the four
// together (one pass over x), which costs much less than four DotF32
// calls on short rows; its results can differ from DotF32's in the last
// places (another order of additions). If w is too short it sets dst to
// NaN.
func Dot4F32(dst *[4]float32, w []float32, stride int, x []float32) {
	if stride < len(x) || len(w) < 3*stride+len(x) {
		*dst = [4]float32{nan32(), nan32(), nan32(), nan32()}
		return
	}
	active.dot4F32(dst, w, stride, x)
}

// Dot4F16 is [Dot4F32] for rows of little-endian IEEE binary16 values, as
// an F16 KV cache stores keys: row i is the 2·len(x) bytes at
// w[2·i·stride:], converted in registers.
func Dot4F16(dst *[4]float32, w []byte, stride int, x []float32) {
	if stride < len(x) || len(w) < 2*(3*stride+len(x)) {
		*dst = [4]float32{nan32(), nan32(), nan32(), nan32()}
		return
	}
	active.dot4F16(dst, w, stride, x)
}

func dot4F16Go(dst *[4]float32, w []byte, stride int, x []float32) {
	for i := range dst {
		dst[i] = dotF16Go(w[2*i*stride:2*(i*stride+len(x))], x)
	}
}

func dot4F32Go(dst *[4]float32, w []float32, stride int, x []float32) {
	for i := range dst {
		dst[i] = dotF32Go(w[i*stride:i*stride+len(x)], x)
	}
}

// DotF16 returns the dot product of the little-endian IEEE binary16 row w
// with x, or NaN unless len(w) == 2·len(x).
func DotF16(w []byte, x []float32) float32 {
	if len(w) != 2*len(x) {
		return nan32()
	}
	return active.dotF16(w, x)
}

// DotBF16 returns the dot product of the little-endian bfloat16 row w with
// x, or NaN unless len(w) == 2·len(x).
func DotBF16(w []byte, x []float32) float32 {
	if len(w) != 2*len(x) {
		return nan32()
	}
	return active.dotBF16(w, x)
}

// qBlocks checks that w holds a row of n values of type q and xq the
// matching quantized activations, and returns the block count.
func qBlocks(q qtype, w, xq []byte, n int) (int, bool) {
	qi := &qinfo[q]
	if n < 0 || n%qi.values != 0 {
		return 0, false
	}
	nb := n / qi.values
	wl, ok1 := prod(nb, qi.wBytes)
	xl, ok2 := prod(nb, qi.xBytes)
	return nb, ok1 && ok2 && len(w) == wl && len(xq) == xl
}

func dotQ(q qtype, w, xq []byte, n int) float32 {
	nb, ok := qBlocks(q, w, xq, n)
	if !ok {
		return nan32()
	}
	return active.dotQ[q](w, xq, nb)
}

// DotQ8_0 returns the dot product of a Q8_0 row of n values with
// activations quantized by [QuantizeQ8_0], or NaN if n is not a multiple
// of 32 or a slice has the wrong length for n.
func DotQ8_0(w, xq []byte, n int) float32 { return dotQ(q8_0, w, xq, n) }

// DotQ4_0 returns the dot product of a Q4_0 row of n values with
// activations quantized by [QuantizeQ8_0], or NaN if n is not a multiple
// of 32 or a slice has the wrong length for n.
func DotQ4_0(w, xq []byte, n int) float32 { return dotQ(q4_0, w, xq, n) }

// DotQ4_K returns the dot product of a Q4_K row of n values with
// activations quantized by [QuantizeQ8_K], or NaN if n is not a multiple
// of 256 or a slice has the wrong length for n.
func DotQ4_K(w, xq []byte, n int) float32 { return dotQ(q4_K, w, xq, n) }

// DotQ6_K returns the dot product of a Q6_K row of n values with
// activations quantized by [QuantizeQ8_K], or NaN if n is not a multiple
// of 256 or a slice has the wrong length for n.
func DotQ6_K(w, xq []byte, n int) float32 { return dotQ(q6_K, w, xq, n) }

// prod returns a·b for non-negative a and b, or false if either is
// negative or the product overflows an int.
func prod(a, b int) (int, bool) {
	if a < 0 || b < 0 || (b != 0 && a > math.MaxInt/b) {
		return 0, false
	}
	return a * b, true
}

// matVecOK checks a matrix-vector shape: dst and x have rows and cols
// elements and w holds rows rows of rowLen units each.
func matVecOK(dst, w, x, rowLen, rows, cols int) bool {
	wl, ok := prod(rows, rowLen)
	return ok && cols >= 0 && dst == rows && x == cols && w == wl
}

// MatVecF32 sets dst[r] = Σ_k w[r·cols+k]·x[k] for r < rows. If
// len(dst) != rows, len(x) != cols or len(w) != rows·cols, it fills dst
// with NaN instead.
func MatVecF32(dst, w, x []float32, rows, cols int) {
	if !matVecOK(len(dst), len(w), len(x), cols, rows, cols) {
		fillNaN(dst)
		return
	}
	active.matVecF32(dst, w, x, rows, cols)
}

// MatVecF16 is [MatVecF32] for binary16 weights: w holds rows·cols
// little-endian binary16 values (2·rows·cols bytes).
func MatVecF16(dst []float32, w []byte, x []float32, rows, cols int) {
	if rl, ok := prod(2, cols); !ok || !matVecOK(len(dst), len(w), len(x), rl, rows, cols) {
		fillNaN(dst)
		return
	}
	active.matVecF16(dst, w, x, rows, cols)
}

// MatVecBF16 is [MatVecF32] for bfloat16 weights: w holds rows·cols
// little-endian bfloat16 values (2·rows·cols bytes).
func MatVecBF16(dst []float32, w []byte, x []float32, rows, cols int) {
	if rl, ok := prod(2, cols); !ok || !matVecOK(len(dst), len(w), len(x), rl, rows, cols) {
		fillNaN(dst)
		return
	}
	active.matVecBF16(dst, w, x, rows, cols)
}

func matVecQ(q qtype, dst []float32, w, xq []byte, rows, cols int) {
	qi := &qinfo[q]
	if cols < 0 || cols%qi.values != 0 {
		fillNaN(dst)
		return
	}
	nb := cols / qi.values
	wl, ok1 := prod(nb, qi.wBytes)
	xl, ok2 := prod(nb, qi.xBytes)
	if !ok1 || !ok2 || len(xq) != xl || !matVecOK(len(dst), len(w), cols, wl, rows, cols) {
		fillNaN(dst)
		return
	}
	active.matVecQ[q](dst, w, xq, rows, nb)
}

// MatVecQ8_0 sets dst[r] to the dot product of row r of the Q8_0 matrix w
// (rows rows of cols values) with the activations xq, quantized by
// [QuantizeQ8_0]. On inconsistent shapes it fills dst with NaN.
func MatVecQ8_0(dst []float32, w, xq []byte, rows, cols int) {
	matVecQ(q8_0, dst, w, xq, rows, cols)
}

// MatVecQ4_0 is [MatVecQ8_0] for Q4_0 weights (activations from
// [QuantizeQ8_0]).
func MatVecQ4_0(dst []float32, w, xq []byte, rows, cols int) {
	matVecQ(q4_0, dst, w, xq, rows, cols)
}

// MatVecQ4_K is [MatVecQ8_0] for Q4_K weights; the activations come from
// [QuantizeQ8_K].
func MatVecQ4_K(dst []float32, w, xq []byte, rows, cols int) {
	matVecQ(q4_K, dst, w, xq, rows, cols)
}

// MatVecQ6_K is [MatVecQ8_0] for Q6_K weights; the activations come from
// [QuantizeQ8_K].
func MatVecQ6_K(dst []float32, w, xq []byte, rows, cols int) {
	matVecQ(q6_K, dst, w, xq, rows, cols)
}

// matMulOK checks a matrix-matrix shape: w holds rows rows of rowLen
// units, x holds tokens rows of xRow units, ldd ≥ rows, and dst reaches
// element (tokens−1)·ldd + rows − 1.
func matMulOK(dst, ldd, w, rowLen, x, xRow, rows, tokens int) bool {
	wl, ok1 := prod(rows, rowLen)
	xl, ok2 := prod(tokens, xRow)
	if !ok1 || !ok2 || ldd < rows || w != wl || x != xl {
		return false
	}
	if tokens == 0 || rows == 0 {
		return true
	}
	last, ok := prod(tokens-1, ldd)
	return ok && last <= math.MaxInt-rows && dst >= last+rows
}

// MatMulF32 multiplies the rows×cols matrix w by tokens activation rows x
// (tokens×cols, row-major): dst[t·ldd + r] = Σ_k w[r·cols+k]·x[t·cols+k]
// for r < rows and t < tokens. Elements of dst outside those positions are
// left alone. Register tiles reuse every loaded weight for several tokens,
// which makes this much faster per token than [MatVecF32]. If the shapes
// are inconsistent (including ldd < rows or dst too short) it fills dst
// with NaN instead.
func MatMulF32(dst []float32, ldd int, w, x []float32, rows, cols, tokens int) {
	MatMulF32Packed(dst, ldd, w, x, nil, rows, cols, tokens)
}

// PackLen returns the length of the copy of tokens activation rows of cols
// values that [Pack] lays out for the float matrix-matrix kernels, or 0 if
// the kernels in use read the rows as they are.
func PackLen(cols, tokens int) int {
	if cols <= 0 || tokens <= 1 {
		return 0
	}
	return active.packLen(cols, tokens)
}

// Pack lays out tokens activation rows of cols values (x) in dst, which
// holds PackLen(cols, tokens) values, in the order the register tiles of
// the float kernels read them. The MatMul*Packed functions take it, so
// that several products of the same activations (or the row pieces of one
// product, computed by several goroutines) copy them once instead of once
// per call. It does nothing if the lengths do not fit.
func Pack(dst, x []float32, cols, tokens int) {
	if n := PackLen(cols, tokens); n > 0 && len(dst) == n && len(x) >= cols*tokens {
		active.pack(dst, x, cols, tokens)
	}
}

// packOK reports whether xp is a packing of tokens rows of cols values
// from Pack, or nil (the kernels pack per call).
func packOK(xp []float32, cols, tokens int) bool {
	return xp == nil || len(xp) == PackLen(cols, tokens)
}

// MatMulF32Packed is [MatMulF32] with the activations also packed
// beforehand by [Pack] (xp; nil packs them per call, and so does an empty
// xp where PackLen is 0). The results are the same bits either way. A
// packing of the wrong length fills dst with NaN.
func MatMulF32Packed(dst []float32, ldd int, w, x, xp []float32, rows, cols, tokens int) {
	if xp, ok := floatMatMulArgs(dst, ldd, len(w), cols, cols >= 0, x, xp, rows, cols, tokens); ok {
		active.matMulF32(dst, ldd, w, x, xp, rows, cols, tokens)
	}
}

// floatMatMulArgs checks the operands of a product of float weights, rows
// of rowLen elements (rowOK false when that length is out of range), and
// fills dst with NaN where they do not fit. It returns the packing to use
// (nil for an empty one) and whether there is anything to compute.
func floatMatMulArgs(dst []float32, ldd, wLen, rowLen int, rowOK bool, x, xp []float32, rows, cols, tokens int) ([]float32, bool) {
	if !rowOK || !matMulOK(len(dst), ldd, wLen, rowLen, len(x), cols, rows, tokens) || !packOK(xp, cols, tokens) {
		fillNaN(dst)
		return nil, false
	}
	if len(xp) == 0 {
		xp = nil
	}
	return xp, rows > 0 && tokens > 0
}

// MatMulF16 is [MatMulF32] for binary16 weights (2·rows·cols bytes).
func MatMulF16(dst []float32, ldd int, w []byte, x []float32, rows, cols, tokens int) {
	MatMulF16Packed(dst, ldd, w, x, nil, rows, cols, tokens)
}

// MatMulF16Packed is [MatMulF32Packed] for binary16 weights.
func MatMulF16Packed(dst []float32, ldd int, w []byte, x, xp []float32, rows, cols, tokens int) {
	matMulHalf(active.matMulF16, dst, ldd, w, x, xp, rows, cols, tokens)
}

// matMulHalf checks the operands of a product of 16-bit float weights (2
// bytes an element) and runs kernel on them.
func matMulHalf(kernel func(dst []float32, ldd int, w []byte, x, xp []float32, rows, cols, tokens int),
	dst []float32, ldd int, w []byte, x, xp []float32, rows, cols, tokens int) {
	rl, rowOK := prod(2, cols)
	if xp, ok := floatMatMulArgs(dst, ldd, len(w), rl, rowOK, x, xp, rows, cols, tokens); ok {
		kernel(dst, ldd, w, x, xp, rows, cols, tokens)
	}
}

// MatMulBF16 is [MatMulF32] for bfloat16 weights (2·rows·cols bytes).
func MatMulBF16(dst []float32, ldd int, w []byte, x []float32, rows, cols, tokens int) {
	MatMulBF16Packed(dst, ldd, w, x, nil, rows, cols, tokens)
}

// MatMulBF16Packed is [MatMulF32Packed] for bfloat16 weights.
func MatMulBF16Packed(dst []float32, ldd int, w []byte, x, xp []float32, rows, cols, tokens int) {
	matMulHalf(active.matMulBF16, dst, ldd, w, x, xp, rows, cols, tokens)
}

func matMulQ(q qtype, dst []float32, ldd int, w, xq []byte, rows, cols, tokens int) {
	qi := &qinfo[q]
	if cols < 0 || cols%qi.values != 0 {
		fillNaN(dst)
		return
	}
	nb := cols / qi.values
	wl, ok1 := prod(nb, qi.wBytes)
	xl, ok2 := prod(nb, qi.xBytes)
	if !ok1 || !ok2 || !matMulOK(len(dst), ldd, len(w), wl, len(xq), xl, rows, tokens) {
		fillNaN(dst)
		return
	}
	if rows > 0 && tokens > 0 {
		active.matMulQ[q](dst, ldd, w, xq, rows, nb, tokens)
	}
}

// MatMulQ8_0 is [MatMulF32] for a Q8_0 weight matrix: xq holds tokens rows
// of activations, each quantized by [QuantizeQ8_0] (cols/32·34 bytes per
// token).
func MatMulQ8_0(dst []float32, ldd int, w, xq []byte, rows, cols, tokens int) {
	matMulQ(q8_0, dst, ldd, w, xq, rows, cols, tokens)
}

// MatMulQ4_0 is [MatMulQ8_0] for Q4_0 weights.
func MatMulQ4_0(dst []float32, ldd int, w, xq []byte, rows, cols, tokens int) {
	matMulQ(q4_0, dst, ldd, w, xq, rows, cols, tokens)
}

// MatMulQ4_K is [MatMulF32] for a Q4_K weight matrix: xq holds tokens rows
// of activations, each quantized by [QuantizeQ8_K] (cols/256·292 bytes per
// token).
func MatMulQ4_K(dst []float32, ldd int, w, xq []byte, rows, cols, tokens int) {
	matMulQ(q4_K, dst, ldd, w, xq, rows, cols, tokens)
}

// MatMulQ6_K is [MatMulQ4_K] for Q6_K weights.
func MatMulQ6_K(dst []float32, ldd int, w, xq []byte, rows, cols, tokens int) {
	matMulQ(q6_K, dst, ldd, w, xq, rows, cols, tokens)
}

// QuantizeQ8_0 quantizes x, whose length must be a multiple of 32, into
// len(x)/32 Q8_0 blocks in dst (34 bytes each), the activation format of
// the Q8_0 and Q4_0 kernels. Each block gets d = max|x|/127, stored as
// binary16, and values x·(127/max|x|) rounded to nearest, ties to even, bit
// for bit as ggml's quantize_row_q8_0 of llama.cpp's x86 builds (its AVX
// code, which every x86-64 CPU with AVX runs) computes them, down to the
// −128 of a block so small that 127/max|x| is +Inf. ggml's scalar
// reference, which ARM and baseline builds run, multiplies by 1/d and
// rounds halves away from zero: Baton follows x86. A block holding a NaN
// or an infinity gets the binary16 NaN as d and zero values (ggml's result
// there depends on where the NaN sits). Several rows of activations are
// quantized by quantizing each and laying the results end to end.
func QuantizeQ8_0(x []float32, dst []byte) error {
	if len(x)%Q8_0Values != 0 || len(dst) != len(x)/Q8_0Values*Q8_0Bytes {
		return fmt.Errorf("%w: %d values need %d bytes of Q8_0 blocks (a multiple of %d values), dst has %d",
			ErrShape, len(x), len(x)/Q8_0Values*Q8_0Bytes, Q8_0Values, len(dst))
	}
	active.quantQ8_0(x, dst)
	return nil
}

// QuantizeQ8_K quantizes x, whose length must be a multiple of 256, into
// len(x)/256 Q8_K blocks in dst (292 bytes each), the activation format of
// the Q4_K and Q6_K kernels. As in ggml's quantize_row_q8_K reference,
// which llama.cpp's x86 builds run too (ggml has no x86 SIMD Q8_K
// quantizer), each block takes the value v of largest magnitude (the
// first, on a tie), sets iscale = −127/v, stores d = 1/iscale as a float32
// and the values min(127, round-half-even(iscale·x)), and appends the int16
// sums of each 16 consecutive values. An all-zero block stores d = 0; a
// block so small that iscale is infinite stores d = ±0 and zero values
// (ggml's nearest_int of ±Inf and NaN).
func QuantizeQ8_K(x []float32, dst []byte) error {
	if len(x)%Q8_KValues != 0 || len(dst) != len(x)/Q8_KValues*Q8_KBytes {
		return fmt.Errorf("%w: %d values need %d bytes of Q8_K blocks (a multiple of %d values), dst has %d",
			ErrShape, len(x), len(x)/Q8_KValues*Q8_KBytes, Q8_KValues, len(dst))
	}
	active.quantQ8_K(x, dst)
	return nil
}

// Package vec holds Baton's single-threaded CPU vector kernels: dot
// products, matrix-vector and small matrix-matrix products for every weight
// type the engine computes with (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0,
// Q5_1, IQ4_NL, the K-quants Q2_K to Q6_K, IQ4_XS), quantization of
// activations to Q8_0, Q8_1 and Q8_K, and a few elementwise helpers of the
// forward pass. Callers split work across threads themselves, typically by
// giving each worker a range of weight rows.
//
// # Dispatch
//
// Each kernel exists as a pure-Go twin and, on amd64, as assembly generated
// by kernels/internal/avogen (see the go:generate line in gen.go). One
// implementation is chosen once, when the package is initialised, from the
// CPU's features as golang.org/x/sys/cpu reports them, and kept in an
// unexported variable that nothing changes afterwards; the tests run every
// implementation the CPU supports against the pure-Go one:
//
//   - "avx512": AVX-512 F, BW, VL, DQ and VNNI (with AVX2, FMA, F16C).
//     Float kernels use 16-lane zmm vectors and 4×4 register tiles (rows ×
//     tokens); Q8_0, Q4_0 and the other 32-value types (Q4_1, Q5_0,
//     Q5_1, IQ4_NL) use vpdpbusd on zmm vectors, two
//     32-value blocks per instruction, with 4×4 tiles.
//   - "avx2": AVX2, FMA and F16C. Float kernels use 8-lane ymm vectors and
//     3×4 tiles; integer kernels use vpmaddubsw/vpmaddwd, with 2×4 tiles
//     for Q8_0, Q4_0 and the other 32-value types.
//   - "purego": the portable Go code, also selected by the purego build tag
//     and on other architectures.
//
// The Q4_K and Q6_K kernels (1×4 tiles), the activation quantizers and the
// exponential of [ExpSum] are AVX2 code in both assembly implementations:
// AVX-512 versions of the K-quant kernels measured no faster. Q2_K, Q3_K,
// Q5_K and IQ4_XS (kquant2.go, Q8_K activations, 1×4 tiles) have AVX-512
// variants that are their AVX2 code with vpmaddwd+vpaddd fused into
// vpdpwssd; see kernels/internal/avogen/kquant2.go. AVX_VNNI
// without AVX-512 is not used, as the Go assembler has no VEX encoding of
// vpdpbusd. [Implementation] names the choice.
//
// Matrix-vector products stream the weights once, a few rows at a time,
// and are bound by memory bandwidth. Matrix-matrix products reuse each
// weight loaded into a register for several tokens, and work on row pieces
// of 2 KiB so that a tile's data stays in L1 while it moves across the
// tokens; for float weights they first copy the activations of up to
// 512 KiB worth of tokens into a packed, tile-friendly order, which
// allocates that much per call.
//
// # Shapes and bad input
//
// Weight matrices are row-major with cols elements per row, stored in the
// ggml byte layout of their type ([quant.RowBytes] bytes per row).
// Matrix-matrix products take tokens activation rows of cols elements,
// row-major, and write dst[t*ldd + r]: ldd lets a worker that owns rows
// r0..r1 of a larger output pass dst[r0:] and the full row count. The
// kernels check shapes in O(1) and never panic or touch memory outside the
// slices they are given: a dot product of mismatched lengths returns NaN,
// and a product with inconsistent shapes fills its output with NaN, so an
// error poisons what it feeds instead of crashing the server.
//
// # Numeric behaviour
//
// Float kernels multiply in float32 and accumulate in float32, in several
// independent partial sums (vector lanes times unrolled accumulators) added
// together at the end, so results differ from a sequential sum by rounding
// only: the tests bound the difference by 1e-5·Σ|aᵢbᵢ|. F16 and BF16
// weights are widened exactly to float32 first.
//
// The quantized types follow ggml's vec_dot functions: activations are
// quantized first, Q8_0 per 32 values for Q8_0, Q4_0, Q5_0 and IQ4_NL
// weights ([QuantizeQ8_0], ggml's quantize_row_q8_0 reference rounding, bit
// for bit), Q8_1 for Q4_1 and Q5_1 (the same blocks plus s = d·Σq, whose
// product with the weights' offset m is the offset's share of the block;
// [QuantizeQ8_1]) and Q8_K per 256 values for the K-quants and IQ4_XS
// ([QuantizeQ8_K], ggml's quantize_row_q8_K reference, bit for bit). Each
// block's dot product is then an exact integer, scaled by the float32
// product of the block scales and summed in float32 vector lanes. Against the same products summed in
// float64 the kernels agree to 1e-6 of Σ over blocks of |scales|·Σ|integer
// products|. Against the float path (dequantized weights times the
// unquantized activations, [quant.Dot]) the difference is the activation
// quantization error: at most Σ|wᵢ|·(d/2 + 2⁻¹¹·|xᵢ|), d = amax/127 the
// step of xᵢ's block (half a step of rounding, plus for Q8_0 the binary16
// rounding of d), plus float rounding.
//
// A block of activations that holds a NaN or an infinity is stored with a
// NaN scale and zero values, so every dot product it takes part in is NaN.
package vec

// Baton's CUDA kernels: the device side of kernels/cuda's Backend.
//
// gen-ptx.sh compiles this file to PTX, which the Go package embeds and
// the driver compiles for the GPU at hand when the backend starts. Every
// kernel is extern "C", so its PTX name is its C name, and takes its
// operands in the order backend_cuda.go launches it with; a change of
// parameters here must change the launch there.
//
// Conventions: matrices are row-major; a weight row of type T holds cols
// elements in ggml's block layout (rowBytes bytes); activations are
// float32. Sizes that can exceed 2^31 (byte offsets, element counts of
// whole buffers) are long long. Host code checks every index before a
// launch, so kernels trust them.

#include <cuda_fp16.h>
#include <math.h>

typedef unsigned char u8;
typedef unsigned short u16;
typedef long long i64;

// ggml type ids, as quant.Type numbers them.
#define T_F32 0
#define T_F16 1
#define T_Q4_0 2
#define T_Q4_1 3
#define T_Q5_0 6
#define T_Q5_1 7
#define T_Q8_0 8
#define T_Q2_K 10
#define T_Q3_K 11
#define T_Q4_K 12
#define T_Q5_K 13
#define T_Q6_K 14
#define T_IQ4_NL 20
#define T_IQ4_XS 23
#define T_BF16 30

__device__ __forceinline__ float f16_to_f32(u16 h) { return __half2float(__ushort_as_half(h)); }
__device__ __forceinline__ u16 f32_to_f16(float f) { return __half_as_ushort(__float2half_rn(f)); }
__device__ __forceinline__ float bf16_to_f32(u16 h) { return __uint_as_float(((unsigned)h) << 16); }

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ double warp_sum_d(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Block-wide reductions for one-dimensional blocks of whole warps (at most
// 1024 threads). Every thread gets the result.
__device__ double block_sum_d(double v) {
    __shared__ double part[32];
    __shared__ double total;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    v = warp_sum_d(v);
    if (lane == 0) part[warp] = v;
    __syncthreads();
    if (warp == 0) {
        double s = lane < warps ? part[lane] : 0.0;
        s = warp_sum_d(s);
        if (lane == 0) total = s;
    }
    __syncthreads();
    return total;
}

__device__ float block_sum(float v) {
    __shared__ float part[32];
    __shared__ float total;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    v = warp_sum(v);
    if (lane == 0) part[warp] = v;
    __syncthreads();
    if (warp == 0) {
        float s = lane < warps ? part[lane] : 0.0f;
        s = warp_sum(s);
        if (lane == 0) total = s;
    }
    __syncthreads();
    return total;
}

__device__ float block_max(float v) {
    __shared__ float part[32];
    __shared__ float total;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    v = warp_max(v);
    if (lane == 0) part[warp] = v;
    __syncthreads();
    if (warp == 0) {
        float m = lane < warps ? part[lane] : -INFINITY;
        m = warp_max(m);
        if (lane == 0) total = m;
    }
    __syncthreads();
    return total;
}

// ---------------------------------------------------------------------------
// Weight products.
//
// A block is MM_WARPS warps (blockDim = 32 × MM_WARPS); warp y of block x
// computes weight row x·MM_WARPS + y for the tokens blockIdx.y·MM_TOK …
// +MM_TOK-1, reading the row once for all of them. Lanes split the row so
// that a warp's loads are contiguous; each lane keeps a partial sum per
// token, and the warp adds them up at the end. The weights are dequantized
// in registers. F16 and BF16 products round the activations to the
// weights' type as the CPU does; quantized weights multiply the float32
// activations directly, where the CPU (like ggml) first quantizes them to
// Q8_0, Q8_1 or Q8_K blocks: a GPU product of quantized weights differs
// from the CPU's by that quantization (each activation moves by up to 2⁻⁸
// of its block's largest; on random 2048-column rows the CPU's products
// were ~1e-4 rms, at most 4e-4, of Σ|w·x| from the float ones). The loops
// over a row are unrolled so that a warp has several loads in flight:
// a matrix-vector product is bound by memory latency and bandwidth.

#define MM_WARPS 4
#define MM_TOK 8

struct RowF32 {
    static __device__ __forceinline__ void dot(const u8* wr, const float* x, int cols, int nt, int lane, float* acc) {
        const float* w = (const float*)wr;
        if ((cols & 3) == 0 && (((size_t)w | (size_t)x) & 15) == 0) {
            const float4* w4 = (const float4*)w;
#pragma unroll 4
            for (int k = lane; k < cols / 4; k += 32) {
                float4 a = w4[k];
#pragma unroll
                for (int t = 0; t < MM_TOK; t++) {
                    if (t < nt) {
                        float4 b = ((const float4*)(x + (i64)t * cols))[k];
                        acc[t] += a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
                    }
                }
            }
            return;
        }
        for (int k = lane; k < cols; k += 32) {
            float a = w[k];
#pragma unroll
            for (int t = 0; t < MM_TOK; t++)
                if (t < nt) acc[t] += a * x[(i64)t * cols + k];
        }
    }
};

// round_bf16 rounds f to the nearest bfloat16 (ties to even; finite
// values may round to ±Inf; a NaN stays a quiet NaN), widened back: the
// CPU's vec.RoundBF16 and ggml_compute_fp32_to_bf16.
__device__ __forceinline__ float round_bf16(float f) {
    unsigned u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return __uint_as_float((u | 0x00400000u) & 0xffff0000u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return __uint_as_float(u & 0xffff0000u);
}

// Half-width floats, 8 per 16-byte load where the shapes allow. The
// activations are rounded to the weights' type (F16 or BF16, to nearest
// even) as they are loaded, as the CPU backend and ggml do before such a
// product (kernels/cpu_round.go): the products of two half-width values
// are exact in float32, so what remains different from the CPU is the
// order of the float32 additions.
template <bool BF>
struct RowHalf {
    static __device__ __forceinline__ float cvt(u16 h) { return BF ? bf16_to_f32(h) : f16_to_f32(h); }
    static __device__ __forceinline__ float rx(float v) { return BF ? round_bf16(v) : __half2float(__float2half_rn(v)); }
    static __device__ __forceinline__ void dot(const u8* wr, const float* x, int cols, int nt, int lane, float* acc) {
        const u16* w = (const u16*)wr;
        if ((cols & 7) == 0 && (((size_t)w | (size_t)x) & 15) == 0) {
            const uint4* w8 = (const uint4*)w;
#pragma unroll 4
            for (int k = lane; k < cols / 8; k += 32) {
                uint4 p = w8[k];
                float a[8];
                unsigned u[4] = {p.x, p.y, p.z, p.w};
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    a[2 * i] = cvt((u16)(u[i] & 0xffffu));
                    a[2 * i + 1] = cvt((u16)(u[i] >> 16));
                }
#pragma unroll
                for (int t = 0; t < MM_TOK; t++) {
                    if (t < nt) {
                        const float4* b = (const float4*)(x + (i64)t * cols) + 2 * k;
                        float4 b0 = b[0], b1 = b[1];
                        acc[t] += a[0] * rx(b0.x) + a[1] * rx(b0.y) + a[2] * rx(b0.z) + a[3] * rx(b0.w) +
                                  a[4] * rx(b1.x) + a[5] * rx(b1.y) + a[6] * rx(b1.z) + a[7] * rx(b1.w);
                    }
                }
            }
            return;
        }
        for (int k = lane; k < cols; k += 32) {
            float a = cvt(w[k]);
#pragma unroll
            for (int t = 0; t < MM_TOK; t++)
                if (t < nt) acc[t] += a * rx(x[(i64)t * cols + k]);
        }
    }
};

// Q8_0: blocks of 34 bytes, a binary16 scale d and 32 int8 values q, each
// value d·q. Eight lanes share a block, four values each, so a warp reads
// four consecutive blocks (136 bytes) per step. Blocks are 2-byte aligned.
struct RowQ8_0 {
    static __device__ __forceinline__ void dot(const u8* wr, const float* x, int cols, int nt, int lane, float* acc) {
        int nb = cols / 32, part = lane & 7;
#pragma unroll 4
        for (int b = lane >> 3; b < nb; b += 4) {
            const u8* bp = wr + (i64)b * 34;
            float d = f16_to_f32(*(const u16*)bp);
            const u16* q = (const u16*)(bp + 2 + 4 * part);
            u16 p0 = q[0], p1 = q[1];
            float w0 = d * (float)(signed char)(p0 & 0xff), w1 = d * (float)(signed char)(p0 >> 8);
            float w2 = d * (float)(signed char)(p1 & 0xff), w3 = d * (float)(signed char)(p1 >> 8);
            int k = b * 32 + 4 * part;
#pragma unroll
            for (int t = 0; t < MM_TOK; t++) {
                if (t < nt) {
                    const float* xt = x + (i64)t * cols + k;
                    acc[t] += w0 * xt[0] + w1 * xt[1] + w2 * xt[2] + w3 * xt[3];
                }
            }
        }
    }
};

// Q4_0: blocks of 18 bytes, a binary16 scale d and 16 bytes of 4-bit
// values: byte j holds value j in its low nibble and value j+16 in its
// high one, each d·(nibble − 8). Eight lanes share a block, two bytes
// (four values) each.
struct RowQ4_0 {
    static __device__ __forceinline__ void dot(const u8* wr, const float* x, int cols, int nt, int lane, float* acc) {
        int nb = cols / 32, part = lane & 7;
#pragma unroll 4
        for (int b = lane >> 3; b < nb; b += 4) {
            const u8* bp = wr + (i64)b * 18;
            float d = f16_to_f32(*(const u16*)bp);
            u16 p = *(const u16*)(bp + 2 + 2 * part);
            float w0 = d * (float)((int)(p & 0xf) - 8);         // value 2·part
            float w1 = d * (float)((int)((p >> 8) & 0xf) - 8);  // value 2·part+1
            float w2 = d * (float)((int)((p >> 4) & 0xf) - 8);  // value 2·part+16
            float w3 = d * (float)((int)(p >> 12) - 8);         // value 2·part+17
            int k = b * 32 + 2 * part;
#pragma unroll
            for (int t = 0; t < MM_TOK; t++) {
                if (t < nt) {
                    const float* xt = x + (i64)t * cols + k;
                    acc[t] += w0 * xt[0] + w1 * xt[1] + w2 * xt[16] + w3 * xt[17];
                }
            }
        }
    }
};

template <class R>
__device__ __forceinline__ void matmul(float* dst, const u8* w, const float* x, int rows, int cols, int tokens, i64 rowBytes) {
    int lane = threadIdx.x;
    int r = blockIdx.x * MM_WARPS + threadIdx.y;
    int t0 = blockIdx.y * MM_TOK;
    // r is the same for the whole warp, so warps leave whole and the
    // shuffles below always see 32 lanes.
    if (r >= rows || t0 >= tokens) return;
    int nt = min(MM_TOK, tokens - t0);
    float acc[MM_TOK];
#pragma unroll
    for (int t = 0; t < MM_TOK; t++) acc[t] = 0.0f;
    R::dot(w + (i64)r * rowBytes, x + (i64)t0 * cols, cols, nt, lane, acc);
#pragma unroll
    for (int t = 0; t < MM_TOK; t++) {
        if (t < nt) {
            float s = warp_sum(acc[t]);
            if (lane == 0) dst[(i64)(t0 + t) * rows + r] = s;
        }
    }
}

extern "C" __global__ void mm_f32(float* dst, const u8* w, const float* x, int rows, int cols, int tokens, i64 rowBytes) {
    matmul<RowF32>(dst, w, x, rows, cols, tokens, rowBytes);
}
extern "C" __global__ void mm_f16(float* dst, const u8* w, const float* x, int rows, int cols, int tokens, i64 rowBytes) {
    matmul<RowHalf<false> >(dst, w, x, rows, cols, tokens, rowBytes);
}
extern "C" __global__ void mm_bf16(float* dst, const u8* w, const float* x, int rows, int cols, int tokens, i64 rowBytes) {
    matmul<RowHalf<true> >(dst, w, x, rows, cols, tokens, rowBytes);
}
extern "C" __global__ void mm_q8_0(float* dst, const u8* w, const float* x, int rows, int cols, int tokens, i64 rowBytes) {
    matmul<RowQ8_0>(dst, w, x, rows, cols, tokens, rowBytes);
}
extern "C" __global__ void mm_q4_0(float* dst, const u8* w, const float* x, int rows, int cols, int tokens, i64 rowBytes) {
    matmul<RowQ4_0>(dst, w, x, rows, cols, tokens, rowBytes);
}

// ggml's kvalues_iq4nl: the 16 levels of IQ4_NL and IQ4_XS (quant's
// iq4nlValues).
__constant__ signed char iq4nl_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

__device__ __forceinline__ float f16_at(const u8* p) { return f16_to_f32((u16)(p[0] | (p[1] << 8))); }

// The 6-bit scale and minimum of sub-block j (0..7) of a Q4_K or Q5_K
// block, packed in 12 bytes s (quant's scaleMinK4).
__device__ __forceinline__ void scale_min_k4(int j, const u8* s, int* sc, int* m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0xf) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

// The 2-bit level i of a Q2_K or Q3_K block's 64 bytes qs.
__device__ __forceinline__ int q2_level(const u8* qs, int i) {
    int h = i / 128, k = i % 128 / 32, l = i % 32;
    return (qs[32 * h + l] >> (2 * k)) & 3;
}

// Element k of a weight row of type typ, dequantized exactly as quant's
// Go dequantizers do (the same float32 operations in the same order;
// __fmul_rn keeps nvcc from fusing a product and a difference into an
// FMA that would round once instead of twice), so that embedding rows
// equal the CPU's bit for bit. Block layouts as ggml-common.h declares
// them; blocks are only 2-byte aligned, so scales are read bytewise.
__device__ __forceinline__ float weight_at(const u8* row, int typ, int k) {
    switch (typ) {
    case T_Q4_1:
    case T_Q5_0:
    case T_Q5_1:
    case T_IQ4_NL: {
        int bb = typ == T_Q4_1 ? 20 : typ == T_Q5_0 ? 22 : typ == T_Q5_1 ? 24 : 18;
        const u8* bp = row + (i64)(k / 32) * bb;
        int j = k % 32;
        float d = f16_at(bp);
        const u8* qs = bp + (typ == T_Q4_1 ? 4 : typ == T_Q5_0 ? 6 : typ == T_Q5_1 ? 8 : 2);
        int q = j < 16 ? (qs[j] & 0xf) : (qs[j - 16] >> 4);
        if (typ == T_Q5_0 || typ == T_Q5_1) {
            const u8* h = bp + (typ == T_Q5_0 ? 2 : 4);
            unsigned qh = h[0] | (h[1] << 8) | (h[2] << 16) | ((unsigned)h[3] << 24);
            q |= ((qh >> j) & 1) << 4;
        }
        switch (typ) {
        case T_Q4_1:
        case T_Q5_1:
            return __fadd_rn(__fmul_rn((float)q, d), f16_at(bp + 2));
        case T_Q5_0:
            return (float)(q - 16) * d;
        default:
            return (float)iq4nl_values[q] * d;
        }
    }
    case T_Q2_K: {
        const u8* bp = row + (i64)(k / 256) * 84;
        int i = k % 256, sc = bp[i / 16];
        float dl = f16_at(bp + 80) * (float)(sc & 0xf), ml = f16_at(bp + 82) * (float)(sc >> 4);
        return __fsub_rn(__fmul_rn(dl, (float)q2_level(bp + 16, i)), ml);
    }
    case T_Q3_K: {
        const u8* bp = row + (i64)(k / 256) * 110;
        int i = k % 256, s = i / 16;
        const u8* sc = bp + 96;
        int lo = (sc[s % 8] >> (4 * (s / 8))) & 0xf, hi = (sc[8 + s % 4] >> (2 * (s / 4))) & 3;
        int q = q2_level(bp + 32, i);
        int h = i / 128, kk = i % 128 / 32, l = i % 32;
        if (((bp[l] >> (4 * h + kk)) & 1) == 0) q -= 4;
        float dl = f16_at(bp + 108) * (float)((lo | (hi << 4)) - 32);
        return dl * (float)q;
    }
    case T_Q4_K:
    case T_Q5_K: {
        int q5 = typ == T_Q5_K;
        const u8* bp = row + (i64)(k / 256) * (q5 ? 176 : 144);
        int i = k % 256, sc, m;
        scale_min_k4(i / 32, bp + 4, &sc, &m);
        int c = i / 64, l = i % 64;
        u8 b = bp[(q5 ? 48 : 16) + 32 * c + l % 32];
        int q = l < 32 ? (b & 0xf) : (b >> 4);
        if (q5) q |= ((bp[16 + l % 32] >> (2 * c + (l >= 32))) & 1) << 4;
        float dl = f16_at(bp) * (float)sc, ml = f16_at(bp + 2) * (float)m;
        return __fsub_rn(__fmul_rn(dl, (float)q), ml);
    }
    case T_Q6_K: {
        const u8* bp = row + (i64)(k / 256) * 210;
        int i = k % 256, h = i / 128, r = i % 128, l = r % 32, part = r / 32;
        const u8* ql = bp + 64 * h;
        u8 qhb = bp[128 + 32 * h + l];
        int lowb = (part & 1) ? ql[l + 32] : ql[l];
        int nib = part < 2 ? (lowb & 0xf) : (lowb >> 4);
        int q = (nib | (((qhb >> (2 * part)) & 3) << 4)) - 32;
        int g = l / 16;
        float d = f16_at(bp + 208);
        return d * (float)(signed char)bp[192 + 8 * h + g + 2 * part] * (float)q;
    }
    case T_IQ4_XS: {
        const u8* bp = row + (i64)(k / 256) * 136;
        int i = k % 256, s = i / 32, j = i % 32;
        unsigned hbits = bp[2] | (bp[3] << 8);
        int sc = (((bp[4 + s / 2] >> (4 * (s % 2))) & 0xf) | (((hbits >> (2 * s)) & 3) << 4)) - 32;
        u8 b = bp[8 + 16 * s + j % 16];
        int idx = j < 16 ? (b & 0xf) : (b >> 4);
        float dl = f16_at(bp) * (float)sc;
        return dl * (float)iq4nl_values[idx];
    }
    case T_F32:
        return ((const float*)row)[k];
    case T_F16:
        return f16_to_f32(((const u16*)row)[k]);
    case T_BF16:
        return bf16_to_f32(((const u16*)row)[k]);
    case T_Q8_0: {
        const u8* bp = row + (i64)(k / 32) * 34;
        return f16_to_f32(*(const u16*)bp) * (float)(signed char)bp[2 + k % 32];
    }
    case T_Q4_0: {
        const u8* bp = row + (i64)(k / 32) * 18;
        int j = k % 32;
        u8 q = bp[2 + (j & 15)];
        int nib = j < 16 ? (q & 0xf) : (q >> 4);
        return f16_to_f32(*(const u16*)bp) * (float)(nib - 8);
    }
    }
    return __int_as_float(0x7fc00000);  // NaN: the host never launches other types
}

// RowDeq: the types without a kernel of their own (Q4_1, Q5_0, Q5_1,
// IQ4_NL and the K-quants), dequantized one element at a time with
// weight_at; lane j takes elements j, j+32, …, so a warp's reads of a
// block are contiguous. Each element re-reads its block's scales (from
// cache), which costs ALU time that a kernel per type would not; the
// products are those of the dequantized weights with float32 activations
// (see the note on quantized products above).
template <int TYP>
struct RowDeq {
    static __device__ __forceinline__ void dot(const u8* wr, const float* x, int cols, int nt, int lane, float* acc) {
#pragma unroll 4
        for (int k = lane; k < cols; k += 32) {
            float a = weight_at(wr, TYP, k);
#pragma unroll
            for (int t = 0; t < MM_TOK; t++)
                if (t < nt) acc[t] += a * x[(i64)t * cols + k];
        }
    }
};

#define MM_DEQ(name, typ)                                                                                          \
    extern "C" __global__ void name(float* dst, const u8* w, const float* x, int rows, int cols, int tokens,       \
                                    i64 rowBytes) {                                                                \
        matmul<RowDeq<typ> >(dst, w, x, rows, cols, tokens, rowBytes);                                             \
    }
MM_DEQ(mm_q4_1, T_Q4_1)
MM_DEQ(mm_q5_0, T_Q5_0)
MM_DEQ(mm_q5_1, T_Q5_1)
MM_DEQ(mm_iq4_nl, T_IQ4_NL)
MM_DEQ(mm_q2_k, T_Q2_K)
MM_DEQ(mm_q3_k, T_Q3_K)
MM_DEQ(mm_q4_k, T_Q4_K)
MM_DEQ(mm_q5_k, T_Q5_K)
MM_DEQ(mm_q6_k, T_Q6_K)
MM_DEQ(mm_iq4_xs, T_IQ4_XS)

// embed: block i writes row ids[i] of w, as float32, to row i of dst.
extern "C" __global__ void embed(float* dst, const u8* w, const int* ids, int cols, i64 rowBytes, int typ) {
    const u8* row = w + (i64)ids[blockIdx.x] * rowBytes;
    float* d = dst + (i64)blockIdx.x * cols;
    for (int k = threadIdx.x; k < cols; k += blockDim.x) d[k] = weight_at(row, typ, k);
}

// ---------------------------------------------------------------------------
// Row operations: one block per row.

// rmsnorm: dst = x / sqrt(mean(x²) + eps) · w, rounded as the CPU's
// kernels.RMSNorm (ggml's rms_norm then mul): float32 squares summed in
// double, the mean rounded to float32, scale = 1/sqrtf(mean + eps) in
// float32 (both correctly rounded without fast math), then (x·scale)·w
// with two roundings (__fmul_rn: no contraction). Only the order of the
// double additions differs from the CPU's, which moves the float32 mean
// by an ulp only when it lies within ~2⁻²⁹ of a rounding tie. dst may be
// x: each thread rewrites only what it read, after the reduction.
extern "C" __global__ void rmsnorm(float* dst, const float* x, const float* w, int cols, float eps) {
    const float* xr = x + (i64)blockIdx.x * cols;
    float* dr = dst + (i64)blockIdx.x * cols;
    double ss = 0.0;
    for (int k = threadIdx.x; k < cols; k += blockDim.x) ss += (double)__fmul_rn(xr[k], xr[k]);
    ss = block_sum_d(ss);
    float mean = (float)(ss / (double)cols);
    float scale = 1.0f / sqrtf(mean + eps);
    for (int k = threadIdx.x; k < cols; k += blockDim.x) dr[k] = __fmul_rn(__fmul_rn(xr[k], scale), w[k]);
}

// rope: rotates pairs of every head of one row with that row's cos/sin
// table of half entries. neox pairs (j, j+half), otherwise (2j, 2j+1).
extern "C" __global__ void rope(float* x, const float* cs, const float* sn, int heads, int headDim, int half, int neox) {
    float* xr = x + (i64)blockIdx.x * heads * headDim;
    const float* c = cs + (i64)blockIdx.x * half;
    const float* s = sn + (i64)blockIdx.x * half;
    for (int i = threadIdx.x; i < heads * half; i += blockDim.x) {
        int h = i / half, j = i % half;
        float* xh = xr + (i64)h * headDim;
        int a = neox ? j : 2 * j, b = neox ? j + half : 2 * j + 1;
        float xa = xh[a], xb = xh[b];
        xh[a] = xa * c[j] - xb * s[j];
        xh[b] = xa * s[j] + xb * c[j];
    }
}

// softmax_rows: each row of cols elements becomes its softmax.
extern "C" __global__ void softmax_rows(float* x, int cols) {
    float* xr = x + (i64)blockIdx.x * cols;
    float m = -INFINITY;
    for (int k = threadIdx.x; k < cols; k += blockDim.x) m = fmaxf(m, xr[k]);
    m = block_max(m);
    float s = 0.0f;
    for (int k = threadIdx.x; k < cols; k += blockDim.x) {
        float e = expf(xr[k] - m);
        xr[k] = e;
        s += e;
    }
    s = block_sum(s);
    float inv = 1.0f / s;
    for (int k = threadIdx.x; k < cols; k += blockDim.x) xr[k] *= inv;
}

// ---------------------------------------------------------------------------
// Elementwise operations over n elements, grid-stride.

extern "C" __global__ void silu_mul(float* dst, const float* gate, const float* up, i64 n) {
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {
        float g = gate[i];
        dst[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

// gelu_mul: dst[i] = gelu(gate[i])·up[i], with ggml's binary16 GELU table
// as kernels.GELUMul computes it: gate ≤ −10 gives 0, gate ≥ 10 gives
// gate, any other gate is rounded to binary16 (round to nearest even, as
// quant.F32ToF16) and looked up in table, the 65,536 float32 entries the
// host uploads from kernels.GELU. The result is the CPU's bit for bit;
// evaluating the formula here would not be (tanhf differs from the CPU's
// tanh, and ggml rounds the table to binary16). dst may be gate or up.
extern "C" __global__ void gelu_mul(float* dst, const float* gate, const float* up, const float* table, i64 n) {
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {
        float g = gate[i];
        if (g <= -10.0f)
            g = 0.0f;
        else if (g < 10.0f)
            g = table[f32_to_f16(g)];
        dst[i] = g * up[i];
    }
}

// scale_f32: dst[i] = s·x[i]; dst may be x.
extern "C" __global__ void scale_f32(float* dst, const float* x, float s, i64 n) {
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x)
        dst[i] = s * x[i];
}

// soft_cap: x[i] = c·tanh(x[i]·(1/c)), the reciprocal rounded to float32
// as kernels.SoftCap does; tanhf is within 2 ulp of the CPU's correctly
// rounded tanh, so results may differ from the CPU's by a few ulp of c.
extern "C" __global__ void soft_cap(float* x, float c, i64 n) {
    float inv = 1.0f / c;
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x)
        x[i] = c * tanhf(x[i] * inv);
}

// add_bcast: dst[i] = a[i] + b[i mod bn].
extern "C" __global__ void add_bcast(float* dst, const float* a, const float* b, i64 n, i64 bn) {
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x)
        dst[i] = a[i] + b[bn == n ? i : i % bn];
}

// ---------------------------------------------------------------------------
// The paged KV cache: pages of pageBytes bytes; in each, layer l's keys
// start at layerOff = 2·l·blockBytes and its values blockBytes later, as
// [position][kv head][head dim] elements of F32 or (f16 ≠ 0) F16.

// kv_store: block i writes key and value row i to slot slots[i].
extern "C" __global__ void kv_store(u8* cache, const float* k, const float* v, const int* slots, int rowElems,
                                    int pageSize, i64 pageBytes, i64 layerOff, i64 blockBytes, int f16) {
    int s = slots[blockIdx.x];
    i64 es = f16 ? 2 : 4;
    u8* kb = cache + (i64)(s / pageSize) * pageBytes + layerOff + (i64)(s % pageSize) * rowElems * es;
    u8* vb = kb + blockBytes;
    const float* kr = k + (i64)blockIdx.x * rowElems;
    const float* vr = v + (i64)blockIdx.x * rowElems;
    for (int i = threadIdx.x; i < rowElems; i += blockDim.x) {
        if (f16) {
            ((u16*)kb)[i] = f32_to_f16(kr[i]);
            ((u16*)vb)[i] = f32_to_f16(vr[i]);
        } else {
            ((float*)kb)[i] = kr[i];
            ((float*)vb)[i] = vr[i];
        }
    }
}

#define ATT_WARPS 8
#define ATT_MAXD 256  // the largest head dimension; the host checks it
#define ATT_PER_LANE (ATT_MAXD / 32)

__device__ __forceinline__ float kv_at(const u8* row, int d, int f16) {
    return f16 ? f16_to_f32(((const u16*)row)[d]) : ((const float*)row)[d];
}

// attention: block (i, h) computes query head h of query row i, over
// positions lo…len-1 of the row's sequence, where rowInfo[2i] is the offset
// of its block table in tables and rowInfo[2i+1] is len, and lo is 0, or
// max(0, len−window) with a sliding window (window > 0): pages wholly
// before lo are never read, so their table entries may be anything. Each
// score is q·k·scale, then, when softCap > 0, softCap·tanh(score/softCap)
// as the CPU computes it (the reciprocal rounded to float32 first; tanhf
// is within 2 ulp of the CPU's correctly rounded tanh). Warp w takes
// positions lo+w, lo+w+ATT_WARPS, …, keeping a running maximum m, a running sum
// l of e^(score−m) and the e^(score−m)-weighted sum of value rows (online
// softmax, one pass over the cache); lane j holds head dimensions j,
// j+32, …. The warps' states are then merged in shared memory.
extern "C" __global__ void attention(float* out, const float* q, const u8* cache, const int* tables, const int* rowInfo,
                                     int heads, int kvHeads, int headDim, int pageSize, i64 pageBytes, i64 layerOff,
                                     i64 blockBytes, int f16, float scale, float softCap, int window) {
    __shared__ float sm[ATT_WARPS], sl[ATT_WARPS];
    __shared__ float sacc[ATT_WARPS][ATT_MAXD];
    int row = blockIdx.x, h = blockIdx.y, lane = threadIdx.x, warp = threadIdx.y;
    const int* table = tables + rowInfo[2 * row];
    int n = rowInfo[2 * row + 1];
    int kvh = h / (heads / kvHeads);
    i64 es = f16 ? 2 : 4;
    i64 rowBytes = (i64)kvHeads * headDim * es;
    i64 headOff = (i64)kvh * headDim * es;
    const float* qh = q + ((i64)row * heads + h) * headDim;

    float qv[ATT_PER_LANE], acc[ATT_PER_LANE];
#pragma unroll
    for (int i = 0; i < ATT_PER_LANE; i++) {
        int d = lane + 32 * i;
        qv[i] = d < headDim ? qh[d] : 0.0f;
        acc[i] = 0.0f;
    }
    int lo = window > 0 ? max(0, n - window) : 0;
    float capInv = softCap > 0 ? 1.0f / softCap : 0.0f;
    float m = -INFINITY, l = 0.0f;
    for (int t = lo + warp; t < n; t += ATT_WARPS) {
        const u8* kr = cache + (i64)table[t / pageSize] * pageBytes + layerOff + (i64)(t % pageSize) * rowBytes + headOff;
        const u8* vr = kr + blockBytes;
        float s = 0.0f;
#pragma unroll
        for (int i = 0; i < ATT_PER_LANE; i++) {
            int d = lane + 32 * i;
            if (d < headDim) s += qv[i] * kv_at(kr, d, f16);
        }
        s = warp_sum(s) * scale;
        if (softCap > 0) s = softCap * tanhf(s * capInv);
        float mn = fmaxf(m, s);
        float c = expf(m - mn), p = expf(s - mn);
        l = l * c + p;
#pragma unroll
        for (int i = 0; i < ATT_PER_LANE; i++) {
            int d = lane + 32 * i;
            if (d < headDim) acc[i] = acc[i] * c + p * kv_at(vr, d, f16);
        }
        m = mn;
    }
    if (lane == 0) {
        sm[warp] = m;
        sl[warp] = l;
    }
#pragma unroll
    for (int i = 0; i < ATT_PER_LANE; i++) {
        int d = lane + 32 * i;
        if (d < headDim) sacc[warp][d] = acc[i];
    }
    __syncthreads();
    if (warp != 0) return;
    // Warps that saw no position (n < ATT_WARPS) have m = −∞ and weigh 0;
    // a NaN score has made l NaN, which reaches the output as on the CPU.
    float M = -INFINITY;
    for (int w = 0; w < ATT_WARPS; w++) M = fmaxf(M, sm[w]);
    float L = 0.0f, f[ATT_WARPS];
    for (int w = 0; w < ATT_WARPS; w++) {
        f[w] = sm[w] == -INFINITY ? 0.0f : expf(sm[w] - M);
        L += sl[w] * f[w];
    }
    float inv = 1.0f / L;
    float* oh = out + ((i64)row * heads + h) * headDim;
    for (int d = lane; d < headDim; d += 32) {
        float o = 0.0f;
        for (int w = 0; w < ATT_WARPS; w++) o += sacc[w][d] * f[w];
        oh[d] = o * inv;
    }
}

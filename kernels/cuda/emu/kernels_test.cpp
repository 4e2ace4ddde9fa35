// Tests of kernels.cu's kernels on the CPU emulation of cuda_fp16.h,
// against references written here independently of the kernels (and of
// the Go code): weight products of every type and odd shape, embedding,
// the row and elementwise operations, KV stores at the layout's byte
// offsets, and paged attention over scattered pages.
#include "cuda_fp16.h"
#include "../kernels.cu"
#include <cstdio>
#include <random>
static std::mt19937 rng(1);
static float rnd(float lo = -1, float hi = 1) { return std::uniform_real_distribution<float>(lo, hi)(rng); }
static int fails = 0;
#define CHECK(cond, ...) do { if (!(cond)) { fails++; if (fails < 30) { printf("FAIL %s:%d: ", __FILE__, __LINE__); printf(__VA_ARGS__); printf("\n"); } } } while (0)
static uint16_t h(float f) { return __half_as_ushort(__float2half_rn(f)); }
static float hf(uint16_t u) { return __half2float(__ushort_as_half(u)); }

static const int kIQ4[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
static double f16le(const uint8_t* p) { uint16_t u; memcpy(&u, p, 2); return hf(u); }

// blockShape gives the values per block and bytes per block of the types
// dequantized block by block below; 0 for the others.
static void blockShape(int typ, int* n, int* bytes) {
  switch (typ) {
  case 3: *n = 32; *bytes = 20; return;   // Q4_1
  case 6: *n = 32; *bytes = 22; return;   // Q5_0
  case 7: *n = 32; *bytes = 24; return;   // Q5_1
  case 20: *n = 32; *bytes = 18; return;  // IQ4_NL
  case 10: *n = 256; *bytes = 84; return;   // Q2_K
  case 11: *n = 256; *bytes = 110; return;  // Q3_K
  case 12: *n = 256; *bytes = 144; return;  // Q4_K
  case 13: *n = 256; *bytes = 176; return;  // Q5_K
  case 14: *n = 256; *bytes = 210; return;  // Q6_K
  case 23: *n = 256; *bytes = 136; return;  // IQ4_XS
  }
  *n = *bytes = 0;
}

// deqBlock writes one block's values to y and, in mag, the size of the
// terms each is computed from (what float rounding is relative to),
// following ggml's dequantize_row_* loops: a block at a time, in the order
// ggml-common.h lays the bits out.
static void deqBlock(int typ, const uint8_t* b, double* y, double* mag) {
  auto put = [&](int i, double scale, double q, double off) { y[i] = scale * q - off; mag[i] = std::fabs(scale * q) + std::fabs(off); };
  switch (typ) {
  case 3: case 6: case 7: case 20: {
    double d = f16le(b), m = (typ == 3 || typ == 7) ? f16le(b + 2) : 0;
    const uint8_t* qs = b + (typ == 3 ? 4 : typ == 6 ? 6 : typ == 7 ? 8 : 2);
    uint32_t qh = 0;
    if (typ == 6) memcpy(&qh, b + 2, 4);
    if (typ == 7) memcpy(&qh, b + 4, 4);
    for (int j = 0; j < 16; j++) {
      int lo = qs[j] & 15, hi = qs[j] >> 4;
      if (typ == 6 || typ == 7) { lo |= ((qh >> j) & 1) << 4; hi |= ((qh >> (j + 16)) & 1) << 4; }
      if (typ == 6) { lo -= 16; hi -= 16; }
      if (typ == 20) { lo = kIQ4[lo]; hi = kIQ4[hi]; }
      put(j, d, lo, -m); put(j + 16, d, hi, -m);
    }
    return;
  }
  case 10: {  // Q2_K: scales[16] (low nibble scale, high nibble min), qs[64], d, dmin
    double d = f16le(b + 80), dmin = f16le(b + 82);
    const uint8_t* q = b + 16; int is = 0, n = 0;
    for (int half = 0; half < 2; half++, q += 32)
      for (int shift = 0; shift < 8; shift += 2)
        for (int sub = 0; sub < 2; sub++) {
          uint8_t sc = b[is++];
          for (int l = 0; l < 16; l++) put(n++, d * (sc & 15), (q[16 * sub + l] >> shift) & 3, dmin * (sc >> 4));
        }
    return;
  }
  case 11: {  // Q3_K: hmask[32], qs[64], scales[12], d
    double d = f16le(b + 108);
    const uint8_t* sc = b + 96;
    int scales[16];
    for (int j = 0; j < 16; j++) {
      int lo = j < 8 ? (sc[j] & 15) : (sc[j - 8] >> 4);
      int hi = (sc[8 + j % 4] >> (2 * (j / 4))) & 3;
      scales[j] = (lo | (hi << 4)) - 32;
    }
    const uint8_t* q = b + 32; int is = 0, n = 0; uint8_t m = 1;
    for (int half = 0; half < 2; half++, q += 32)
      for (int shift = 0; shift < 8; shift += 2, m <<= 1)
        for (int sub = 0; sub < 2; sub++) {
          double dl = d * scales[is++];
          for (int l = 0; l < 16; l++) {
            int idx = 16 * sub + l;
            put(n++, dl, (int)((q[idx] >> shift) & 3) - ((b[idx] & m) ? 0 : 4), 0);
          }
        }
    return;
  }
  case 12: case 13: {  // Q4_K / Q5_K: d, dmin, scales[12], (Q5_K: qh[32]), qs[128]
    double d = f16le(b), dmin = f16le(b + 2);
    const uint8_t* s = b + 4;
    auto scm = [&](int j, int& sc, int& mn) {
      if (j < 4) { sc = s[j] & 63; mn = s[j + 4] & 63; }
      else { sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4); mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4); }
    };
    bool q5 = typ == 13;
    const uint8_t* qh = b + 16; const uint8_t* ql = b + (q5 ? 48 : 16);
    uint8_t u1 = 1, u2 = 2; int n = 0;
    for (int j = 0; j < 256; j += 64, ql += 32, u1 <<= 2, u2 <<= 2) {
      int sc, mn; scm(j / 32, sc, mn);
      for (int l = 0; l < 32; l++) put(n++, d * sc, (ql[l] & 15) + (q5 && (qh[l] & u1) ? 16 : 0), dmin * mn);
      scm(j / 32 + 1, sc, mn);
      for (int l = 0; l < 32; l++) put(n++, d * sc, (ql[l] >> 4) + (q5 && (qh[l] & u2) ? 16 : 0), dmin * mn);
    }
    return;
  }
  case 14: {  // Q6_K: ql[128], qh[64], scales[16] (int8), d
    double d = f16le(b + 208);
    const uint8_t* ql = b; const uint8_t* qh = b + 128; const int8_t* sc = (const int8_t*)(b + 192);
    for (int half = 0; half < 2; half++, ql += 64, qh += 32, sc += 8) {
      double* yy = y + 128 * half; double* mm = mag + 128 * half;
      for (int l = 0; l < 32; l++) {
        int is = l / 16;
        int q1 = (int)((ql[l] & 15) | (((qh[l] >> 0) & 3) << 4)) - 32;
        int q2 = (int)((ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4)) - 32;
        int q3 = (int)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        int q4 = (int)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        int qq[4] = {q1, q2, q3, q4};
        for (int k = 0; k < 4; k++) { yy[l + 32 * k] = d * sc[is + 2 * k] * qq[k]; mm[l + 32 * k] = std::fabs(yy[l + 32 * k]); }
      }
    }
    return;
  }
  case 23: {  // IQ4_XS: d, scales_h (u16), scales_l[4], qs[128]
    double d = f16le(b);
    uint16_t sh; memcpy(&sh, b + 2, 2);
    const uint8_t* qs = b + 8;
    for (int ib = 0; ib < 8; ib++, qs += 16) {
      int ls = ((b[4 + ib / 2] >> (4 * (ib % 2))) & 15) | (((sh >> (2 * ib)) & 3) << 4);
      double dl = d * (ls - 32);
      for (int j = 0; j < 16; j++) { put(32 * ib + j, dl, kIQ4[qs[j] & 15], 0); put(32 * ib + j + 16, dl, kIQ4[qs[j] >> 4], 0); }
    }
    return;
  }
  }
}

// Reference dequantization of one row, independent of the kernels; mag
// (if not null) gets each value's rounding scale.
static std::vector<double> deq(int typ, const uint8_t* row, int cols, std::vector<double>* mag = nullptr) {
  std::vector<double> o(cols);
  int bn, bb;
  blockShape(typ, &bn, &bb);
  if (bn) {
    std::vector<double> m(cols);
    for (int k = 0; k < cols; k += bn) deqBlock(typ, row + (size_t)(k / bn) * bb, &o[k], &m[k]);
    if (mag) *mag = m;
    return o;
  }
  if (mag) mag->assign(cols, 0);
  for (int k = 0; k < cols; k++) {
    switch (typ) {
    case 0: { float f; memcpy(&f, row + 4 * k, 4); o[k] = f; break; }
    case 1: { uint16_t u; memcpy(&u, row + 2 * k, 2); o[k] = hf(u); break; }
    case 30: { uint16_t u; memcpy(&u, row + 2 * k, 2); unsigned b = (unsigned)u << 16; float f; memcpy(&f, &b, 4); o[k] = f; break; }
    case 8: { const uint8_t* bp = row + 34 * (k / 32); uint16_t d; memcpy(&d, bp, 2); o[k] = (double)hf(d) * (int8_t)bp[2 + k % 32]; break; }
    case 2: { const uint8_t* bp = row + 18 * (k / 32); uint16_t d; memcpy(&d, bp, 2); int j = k % 32;
      int nib = j < 16 ? (bp[2 + j] & 15) : (bp[2 + j - 16] >> 4); o[k] = (double)hf(d) * (nib - 8); break; }
    }
    if (mag) (*mag)[k] = std::fabs(o[k]);
  }
  return o;
}
// roundAct is the activation x as F16 (typ 1) or BF16 (typ 30) products
// multiply it: the nearest value of that type, ties to even, found by
// comparing the two neighbours in double.
static float roundAct(int typ, float x) {
  if (typ == 1) return hf(h(x));
  if (typ != 30 || std::isnan(x)) return x;
  unsigned u; memcpy(&u, &x, 4);
  unsigned lo = u & 0xffff0000u, hi = lo + 0x10000u;
  float fl, fh; memcpy(&fl, &lo, 4); memcpy(&fh, &hi, 4);
  double dl = std::fabs((double)x - fl), dh = std::fabs((double)fh - x);
  return dl < dh ? fl : dh < dl ? fh : ((lo >> 16) & 1 ? fh : fl);
}
static int rowBytes(int typ, int cols) {
  int bn, bb;
  blockShape(typ, &bn, &bb);
  if (bn) return cols / bn * bb;
  switch (typ) { case 0: return 4 * cols; case 1: case 30: return 2 * cols; case 8: return cols / 32 * 34; case 2: return cols / 32 * 18; }
  return 0;
}
static std::vector<uint8_t> randWeights(int typ, int rows, int cols) {
  std::vector<uint8_t> w(rows * rowBytes(typ, cols) + 16);
  uint8_t* p = w.data();
  int bn, bb;
  blockShape(typ, &bn, &bb);
  if (bn) {
    // Random bits everywhere, then binary16 scales of a sensible size
    // where the layout keeps them (random bits there could be NaN or Inf).
    for (auto& v : w) v = (uint8_t)rng();
    int dOff[2] = {0, -1};
    if (typ == 3 || typ == 7 || typ == 12 || typ == 13) dOff[1] = 2;
    if (typ == 10) { dOff[0] = 80; dOff[1] = 82; }
    if (typ == 11) dOff[0] = 108;
    if (typ == 14) dOff[0] = 208;
    for (int blk = 0; blk < rows * cols / bn; blk++)
      for (int o : dOff) if (o >= 0) { uint16_t d = h(rnd(0.001, 0.05)); memcpy(&w[(size_t)blk * bb + o], &d, 2); }
    return w;
  }
  for (int r = 0; r < rows; r++) {
    for (int k = 0; k < cols; k++) {
      switch (typ) {
      case 0: { float f = rnd(); memcpy(p, &f, 4); p += 4; break; }
      case 1: { uint16_t u = h(rnd()); memcpy(p, &u, 2); p += 2; break; }
      case 30: { float f = rnd(); unsigned b; memcpy(&b, &f, 4); uint16_t u = b >> 16; memcpy(p, &u, 2); p += 2; break; }
      case 8: if (k % 32 == 0) { uint16_t d = h(rnd(0.001, 0.02)); memcpy(p, &d, 2); p += 2; for (int j = 0; j < 32; j++) *p++ = (uint8_t)(int8_t)(rng() % 255 - 127); } break;
      case 2: if (k % 32 == 0) { uint16_t d = h(rnd(0.01, 0.1)); memcpy(p, &d, 2); p += 2; for (int j = 0; j < 16; j++) *p++ = (uint8_t)rng(); } break;
      }
    }
  }
  return w;
}

static void testMatmul() {
  int types[] = {0, 1, 30, 8, 2, 3, 6, 7, 20, 10, 11, 12, 13, 14, 23};
  const char* names[] = {"f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "iq4_xs"};
  void (*fns[])(float*, const u8*, const float*, int, int, int, i64) = {mm_f32, mm_f16, mm_bf16, mm_q8_0, mm_q4_0,
    mm_q4_1, mm_q5_0, mm_q5_1, mm_iq4_nl, mm_q2_k, mm_q3_k, mm_q4_k, mm_q5_k, mm_q6_k, mm_iq4_xs};
  for (int ti = 0; ti < 15; ti++) {
    int typ = types[ti];
    int bn, bb;
    blockShape(typ, &bn, &bb);
    int colsList[] = {64, 96, 68, 172, 256, 512};
    for (int cols : colsList) {
      if ((typ == 8 || typ == 2 || bn) && cols % std::max(bn, 32)) continue;
      for (int tokens : {1, 3, 9}) {
        for (int xoff : {0, 1}) {  // an unaligned x takes the scalar path
          int rows = 37;
          auto w = randWeights(typ, rows, cols);
          std::vector<float> xb(tokens * cols + 4), dst(tokens * rows, NAN);
          for (auto& v : xb) v = rnd();
          float* x = xb.data() + xoff;
          launch(dim3((rows + MM_WARPS - 1) / MM_WARPS, (tokens + MM_TOK - 1) / MM_TOK), dim3(32, MM_WARPS), fns[ti], dst.data(), (const u8*)w.data(), (const float*)x, rows, cols, tokens, (i64)rowBytes(typ, cols));
          for (int r = 0; r < rows; r++) {
            auto wr = deq(typ, w.data() + (size_t)r * rowBytes(typ, cols), cols);
            for (int t = 0; t < tokens; t++) {
              double s = 0, a = 0;
              for (int k = 0; k < cols; k++) { double xv = roundAct(typ, x[t * cols + k]); s += wr[k] * xv; a += std::fabs(wr[k] * xv); }
              double got = dst[t * rows + r];
              CHECK(std::fabs(got - s) <= 1e-5 * a + 1e-30, "mm_%s cols %d tokens %d xoff %d [%d,%d]: %g want %g", names[ti], cols, tokens, xoff, t, r, got, s);
            }
          }
        }
      }
    }
    // embed: exact for the types whose values are one product of a
    // scale; within float rounding of the terms for the others (Go's
    // tests check those bit for bit against quant's dequantizers).
    int cols = bn == 256 ? 512 : 64, rows = 10;
    auto w = randWeights(typ, rows, cols);
    int ids[] = {3, 0, 9, 3};
    std::vector<float> dst(4 * cols);
    launch(dim3(4), dim3(256), embed, dst.data(), (const u8*)w.data(), (const int*)ids, cols, (i64)rowBytes(typ, cols), typ);
    for (int i = 0; i < 4; i++) {
      std::vector<double> mag;
      auto wr = deq(typ, w.data() + (size_t)ids[i] * rowBytes(typ, cols), cols, &mag);
      for (int k = 0; k < cols; k++) {
        double tol = bn ? 4e-7 * mag[k] : 0;
        CHECK(std::fabs((double)dst[i * cols + k] - (double)(float)wr[k]) <= tol, "embed %s [%d,%d] %g want %g", names[ti], i, k, dst[i * cols + k], wr[k]);
      }
    }
  }
}

static void testRows() {
  // rmsnorm, in place and not
  int rows = 3, cols = 300;
  std::vector<float> x(rows * cols), w(cols), d(rows * cols);
  for (auto& v : x) v = rnd(-3, 3);
  for (auto& v : w) v = rnd();
  for (int inplace = 0; inplace < 2; inplace++) {
    std::vector<float> xi = x;
    float* out = inplace ? xi.data() : d.data();
    launch(dim3(rows), dim3(256), rmsnorm, out, (const float*)xi.data(), (const float*)w.data(), cols, 1e-5f);
    for (int r = 0; r < rows; r++) {
      // ggml's rounding, bit for bit: float32 squares summed in double,
      // the mean and the scale in float32, (x·scale)·w.
      double ss = 0; for (int k = 0; k < cols; k++) { float sq = x[r * cols + k] * x[r * cols + k]; ss += sq; }
      float mean = (float)(ss / cols);
      float sc = 1.0f / std::sqrt(mean + 1e-5f);
      for (int k = 0; k < cols; k++) { float want = (float)(x[r * cols + k] * sc) * w[k]; CHECK(out[r * cols + k] == want, "rmsnorm %d %d: %g want %g", r, k, out[r * cols + k], want); }
    }
  }
  // rope
  for (int neox = 0; neox < 2; neox++) {
    int rows = 2, heads = 3, hd = 10, half = 4;  // partial rotation: 8 of 10
    std::vector<float> xr(rows * heads * hd), c(rows * half), s(rows * half);
    for (auto& v : xr) v = rnd();
    for (int i = 0; i < rows * half; i++) { double th = rnd(-3, 3); c[i] = std::cos(th); s[i] = std::sin(th); }
    auto x0 = xr;
    launch(dim3(rows), dim3(256), rope, xr.data(), (const float*)c.data(), (const float*)s.data(), heads, hd, half, neox);
    for (int r = 0; r < rows; r++) for (int hh = 0; hh < heads; hh++) {
      const float* a = &x0[(r * heads + hh) * hd]; const float* g = &xr[(r * heads + hh) * hd];
      std::vector<double> want(a, a + hd);
      for (int j = 0; j < half; j++) {
        int ia = neox ? j : 2 * j, ib = neox ? j + half : 2 * j + 1;
        want[ia] = (double)a[ia] * c[r * half + j] - (double)a[ib] * s[r * half + j];
        want[ib] = (double)a[ia] * s[r * half + j] + (double)a[ib] * c[r * half + j];
      }
      for (int k = 0; k < hd; k++) CHECK(std::fabs(g[k] - want[k]) < 1e-6, "rope neox %d r %d h %d k %d: %g want %g", neox, r, hh, k, g[k], want[k]);
    }
  }
  // softmax
  {
    int rows = 3, cols = 1000;
    std::vector<float> xs(rows * cols);
    for (auto& v : xs) v = rnd(-20, 20);
    auto x0 = xs;
    launch(dim3(rows), dim3(256), softmax_rows, xs.data(), cols);
    for (int r = 0; r < rows; r++) {
      double m = -1e300, s = 0; for (int k = 0; k < cols; k++) m = std::max(m, (double)x0[r * cols + k]);
      for (int k = 0; k < cols; k++) s += std::exp(x0[r * cols + k] - m);
      for (int k = 0; k < cols; k++) { double want = std::exp(x0[r * cols + k] - m) / s; CHECK(std::fabs(xs[r * cols + k] - want) <= 1e-6 * want + 1e-12, "softmax %d %d", r, k); }
    }
  }
  // silu_mul, add_bcast
  {
    int n = 1000;
    std::vector<float> g(n), u(n), d(n), b(10);
    for (auto& v : g) v = rnd(-10, 10);
    for (auto& v : u) v = rnd();
    for (auto& v : b) v = rnd();
    launch(dim3(2), dim3(256), silu_mul, d.data(), (const float*)g.data(), (const float*)u.data(), (i64)n);
    for (int i = 0; i < n; i++) { double want = g[i] / (1 + std::exp(-(double)g[i])) * u[i]; CHECK(std::fabs(d[i] - want) < 1e-6 * (1 + std::fabs(want)), "silu %d: %g want %g", i, d[i], want); }
    launch(dim3(2), dim3(256), add_bcast, d.data(), (const float*)g.data(), (const float*)b.data(), (i64)n, (i64)10);
    for (int i = 0; i < n; i++) CHECK(d[i] == g[i] + b[i % 10], "add %d", i);
    launch(dim3(2), dim3(256), add_bcast, d.data(), (const float*)g.data(), (const float*)u.data(), (i64)n, (i64)n);
    for (int i = 0; i < n; i++) CHECK(d[i] == g[i] + u[i], "add full %d", i);
  }
}

// attOpts are the attention kernel's options tested: the default, a
// soft-cap, a sliding window, and both with a score scale of its own.
struct AttOpt { float scale, softCap; int window; };
static const AttOpt attOpts[] = {{0, 0, 0}, {0, 5, 0}, {0, 0, 6}, {0.3f, 2, 3}};

static void testAttention() {
  for (AttOpt ao : attOpts) for (int f16 : {0, 1}) for (int hd : {8, 40, 64}) {
    int layers = 2, kvh = 2, heads = 6, ps = 4, pages = 12;
    int rowElems = kvh * hd, es = f16 ? 2 : 4;
    i64 blockBytes = (i64)ps * rowElems * es, pageBytes = 2 * layers * blockBytes;
    std::vector<uint8_t> cache(pages * pageBytes, 0xAB);
    // two sequences: seq A pages {5, 2, 9}, len 11; seq B pages {0, 7, 3, 11, 1, 4, 6}, len 27
    std::vector<int> tA = {5, 2, 9}, tB = {0, 7, 3, 11, 1, 4, 6};
    int lenA = 11, lenB = 27, layer = 1;
    i64 layerOff = 2 * layer * blockBytes;
    // store all positions of both sequences
    std::vector<std::vector<float>> K(2), V(2);
    for (int sq = 0; sq < 2; sq++) {
      auto& tb = sq ? tB : tA; int n = sq ? lenB : lenA;
      K[sq].resize(n * rowElems); V[sq].resize(n * rowElems);
      for (auto& v : K[sq]) v = rnd(-2, 2);
      for (auto& v : V[sq]) v = rnd();
      std::vector<int> slots(n);
      for (int t = 0; t < n; t++) slots[t] = tb[t / ps] * ps + t % ps;
      launch(dim3(n), dim3(128), kv_store, cache.data(), (const float*)K[sq].data(), (const float*)V[sq].data(), (const int*)slots.data(), rowElems, ps, pageBytes, layerOff, blockBytes, f16);
      // check the bytes at the documented places
      for (int t = 0; t < n; t++) for (int i = 0; i < rowElems; i++) {
        size_t ko = (size_t)tb[t / ps] * pageBytes + 2 * layer * blockBytes + (size_t)(t % ps) * rowElems * es + (size_t)i * es;
        size_t vo = ko + blockBytes;
        if (f16) { uint16_t a, b; memcpy(&a, &cache[ko], 2); memcpy(&b, &cache[vo], 2); CHECK(a == h(K[sq][t * rowElems + i]) && b == h(V[sq][t * rowElems + i]), "kv_store f16"); }
        else { float a, b; memcpy(&a, &cache[ko], 4); memcpy(&b, &cache[vo], 4); CHECK(a == K[sq][t * rowElems + i] && b == V[sq][t * rowElems + i], "kv_store f32"); }
      }
    }
    // queries: rows (seq, len): A@11, B@1, B@5, B@27, A@8
    struct R { int sq, n; } rows[] = {{0, 11}, {1, 1}, {1, 5}, {1, 27}, {0, 8}};
    int nr = 5;
    // Each row gets its own copy of its sequence's block table, in which
    // the pages wholly before its window point far outside the cache: the
    // kernel must not read them.
    std::vector<int> tables, info;
    for (auto r : rows) {
      auto tb = r.sq ? tB : tA;
      int lo = ao.window > 0 ? std::max(0, r.n - ao.window) : 0;
      for (int p = 0; p < lo / ps; p++) tb[p] = 1 << 28;
      info.push_back((int)tables.size()); info.push_back(r.n);
      tables.insert(tables.end(), tb.begin(), tb.end());
    }
    std::vector<float> q(nr * heads * hd), out(nr * heads * hd, NAN);
    for (auto& v : q) v = rnd(-2, 2);
    float scale = ao.scale != 0 ? ao.scale : 1 / std::sqrt((float)hd);
    launch(dim3(nr, heads), dim3(32, ATT_WARPS), attention, out.data(), (const float*)q.data(), (const u8*)cache.data(), (const int*)tables.data(), (const int*)info.data(), heads, kvh, hd, ps, pageBytes, layerOff, blockBytes, f16, scale, ao.softCap, ao.window);
    for (int i = 0; i < nr; i++) for (int hh = 0; hh < heads; hh++) {
      int g = hh / (heads / kvh);
      auto kv = [&](std::vector<float>& M, int t, int d) { double v = M[t * rowElems + g * hd + d]; return f16 ? (double)hf(h((float)v)) : v; };
      int n = rows[i].n; auto& Ks = K[rows[i].sq]; auto& Vs = V[rows[i].sq];
      int lo = ao.window > 0 ? std::max(0, n - ao.window) : 0;
      std::vector<double> sc(n); double m = -1e300;
      for (int t = lo; t < n; t++) {
        double s = 0; for (int d = 0; d < hd; d++) s += (double)q[(i * heads + hh) * hd + d] * kv(Ks, t, d);
        sc[t] = s * scale;
        if (ao.softCap > 0) sc[t] = ao.softCap * std::tanh(sc[t] / ao.softCap);
        m = std::max(m, sc[t]);
      }
      double sum = 0; for (int t = lo; t < n; t++) { sc[t] = std::exp(sc[t] - m); sum += sc[t]; }
      for (int d = 0; d < hd; d++) {
        double o = 0; for (int t = lo; t < n; t++) o += sc[t] * kv(Vs, t, d); o /= sum;
        double got = out[(i * heads + hh) * hd + d];
        CHECK(std::fabs(got - o) < 2e-6, "attention scale %g cap %g window %d f16 %d hd %d row %d head %d d %d: %g want %g", ao.scale, ao.softCap, ao.window, f16, hd, i, hh, d, got, o);
      }
    }
  }
}

// geluRef is ggml's tanh GELU in float32 operations in ggml's order, with
// the fused multiply-add of its native build (1 + 0.044715·x·x) and the
// tanh of double rounded: the formula behind ggml's binary16 table.
static float geluRef(float x) {
  const float a = 0.044715f, sq = 0.79788456080286535587989211986876f;
  float inner = (float)std::fma((double)(float)(a * x), (double)x, 1.0);
  float arg = (float)(sq * x) * inner;
  float th = (float)std::tanh((double)arg);
  return (float)(0.5f * x) * (float)(1 + th);
}

static void testExt() {
  // gelu_mul against the formula rounded as ggml's table, bit for bit,
  // over the whole range and the ±10 edges; in place too.
  std::vector<float> table(1 << 16);
  for (int i = 0; i < 1 << 16; i++) table[i] = hf(h(geluRef(hf((uint16_t)i))));
  int n = 3000;
  std::vector<float> g(n), u(n), d(n);
  for (int i = 0; i < n; i++) g[i] = rnd(-12, 12);
  float edges[] = {-10, 10, -9.999f, 9.999f, 0, -0.0f, 1e-8f, -3.98f};
  for (int i = 0; i < 8; i++) g[i] = edges[i];
  for (auto& v : u) v = rnd(-2, 2);
  auto want = [&](float gv, float uv) {
    float e = gv <= -10 ? 0 : gv >= 10 ? gv : hf(h(geluRef(hf(h(gv)))));
    return e * uv;
  };
  launch(dim3(3), dim3(256), gelu_mul, d.data(), (const float*)g.data(), (const float*)u.data(), (const float*)table.data(), (i64)n);
  for (int i = 0; i < n; i++) CHECK(d[i] == want(g[i], u[i]), "gelu_mul %d: gelu(%g)·%g = %g want %g", i, g[i], u[i], d[i], want(g[i], u[i]));
  auto gi = g;
  launch(dim3(3), dim3(256), gelu_mul, gi.data(), (const float*)gi.data(), (const float*)u.data(), (const float*)table.data(), (i64)n);
  for (int i = 0; i < n; i++) CHECK(gi[i] == want(g[i], u[i]), "gelu_mul in place %d", i);
  // scale_f32, exact; in place
  launch(dim3(3), dim3(256), scale_f32, d.data(), (const float*)g.data(), 0.37f, (i64)n);
  for (int i = 0; i < n; i++) CHECK(d[i] == 0.37f * g[i], "scale %d", i);
  launch(dim3(3), dim3(256), scale_f32, d.data(), (const float*)d.data(), -2.0f, (i64)n);
  for (int i = 0; i < n; i++) CHECK(d[i] == -2.0f * (0.37f * g[i]), "scale in place %d", i);
  // soft_cap: c·tanh(x·(1/c)) within a few ulp of the correctly rounded value
  for (float c : {30.0f, 50.0f, 0.5f}) {
    std::vector<float> x(n);
    for (auto& v : x) v = rnd(-200, 200);
    auto x0 = x;
    launch(dim3(3), dim3(256), soft_cap, x.data(), c, (i64)n);
    float inv = 1 / c;
    for (int i = 0; i < n; i++) {
      double w = (double)c * std::tanh((double)(x0[i] * inv));
      CHECK(std::fabs(x[i] - w) <= 4 * 1.2e-7 * c, "soft_cap %g of %g: %g want %g", c, x0[i], x[i], w);
    }
  }
}

int main() {
  testMatmul(); printf("matmul done\n");
  testRows(); printf("rows done\n");
  testAttention(); printf("attention done\n");
  testExt(); printf("gelu_mul, scale, soft_cap done\n");
  printf(fails ? "FAILURES: %d\n" : "ALL OK\n", fails);
  return fails != 0;
}

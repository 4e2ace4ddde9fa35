// A CPU emulation of the CUDA C that kernels.cu uses, to test the kernels'
// logic with g++ -std=c++20 where there is no GPU. It is named cuda_fp16.h
// so that kernels.cu's one #include finds it: compile with
// -I<this directory> -include cuda_fp16.h.
//
// The threads of a block are coroutines, blocks run one after another.
// __syncthreads is a barrier of the block's threads; a warp shuffle
// exchanges values through memory between two barriers of the warp's
// threads, so every lane of a warp must reach each shuffle (as on a GPU
// with a full mask). Threads that return leave the barriers; a block whose
// threads all wait at barriers that cannot complete aborts. The binary16
// conversions are exact. Only what kernels.cu uses is here.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <ucontext.h>
#include <vector>

using std::max;
using std::min;

struct dim3 {
  unsigned x, y, z;
  dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
struct float4 {
  float x, y, z, w;
};
struct uint4 {
  unsigned x, y, z, w;
};

inline dim3 threadIdx, blockIdx, blockDim, gridDim;

#define __global__
#define __device__
#define __forceinline__ inline
// Blocks run one after another, so a static variable is one block's.
#define __shared__ static
#define __constant__ static const

// Emulated threads are coroutines (ucontext) on the calling OS thread,
// run by a scheduler that switches between them only at barriers, so a
// launch costs no OS threads and runs deterministically.
struct EmuBarrier {
  int expected = 0, arrived = 0;
  unsigned gen = 0;  // completed rounds
};

struct EmuThread {
  ucontext_t uc;
  std::vector<char> stack;
  bool done = false;
  EmuBarrier* waiting = nullptr;  // the barrier it waits at, or null
  unsigned gen = 0;               // waiting's round it waits to complete
};

// EmuBlock is what the threads of the running block share.
struct EmuBlock {
  EmuBarrier block;
  std::vector<EmuBarrier> warps;
  std::vector<double> xchg;  // one slot per thread, for shuffles
  std::vector<EmuThread> threads;
  ucontext_t scheduler;
  int cur = 0;
  void (*body)(void*) = nullptr;
  void* arg = nullptr;
};
inline EmuBlock* emuBlock;

inline void emuRelease(EmuBarrier& b) {
  b.arrived = 0;
  b.gen++;
}

// emuWait makes the current thread wait until every live thread that
// shares barrier b has reached it.
inline void emuWait(EmuBarrier& b) {
  EmuBlock* blk = emuBlock;
  if (++b.arrived == b.expected) {
    emuRelease(b);
    return;
  }
  EmuThread& me = blk->threads[blk->cur];
  me.waiting = &b;
  me.gen = b.gen;
  swapcontext(&me.uc, &blk->scheduler);
}

// emuDrop takes a finished thread out of barrier b.
inline void emuDrop(EmuBarrier& b) {
  b.expected--;
  if (b.arrived > 0 && b.arrived == b.expected) emuRelease(b);
}

inline void __syncthreads() { emuWait(emuBlock->block); }

template <class T>
T __shfl_xor_sync(unsigned, T v, int laneMask) {
  EmuBlock* blk = emuBlock;
  int t = blk->cur, w = t / 32, lane = t % 32;
  blk->xchg[t] = (double)v;  // exact for float and double
  emuWait(blk->warps[w]);
  T r = (T)blk->xchg[w * 32 + (lane ^ laneMask)];
  emuWait(blk->warps[w]);
  return r;
}

inline float __uint_as_float(unsigned u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}
inline unsigned __float_as_uint(float f) {
  unsigned u;
  memcpy(&u, &f, 4);
  return u;
}
// The host's float multiplication rounds once (no FMA contraction under
// -std=c++20), as __fmul_rn does on the GPU.
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __int_as_float(int i) {
  float f;
  memcpy(&f, &i, 4);
  return f;
}

struct __half {
  uint16_t u;
};
inline __half __ushort_as_half(uint16_t u) { return __half{u}; }
inline uint16_t __half_as_ushort(__half h) { return h.u; }

inline float __half2float(__half h) {
  unsigned s = h.u >> 15, e = (h.u >> 10) & 0x1f, m = h.u & 0x3ff;
  float v;
  if (e == 0) {
    v = std::ldexp((float)m, -24);
  } else if (e == 31) {
    v = m ? NAN : INFINITY;
  } else {
    v = std::ldexp((float)(m | 0x400), (int)e - 25);
  }
  return s ? -v : v;
}

// __float2half_rn rounds to nearest, ties to even: the quotients below are
// exact in double, and nearbyint rounds them in the default mode.
inline __half __float2half_rn(float f) {
  unsigned bits;
  memcpy(&bits, &f, 4);
  uint16_t sign = (bits >> 31) << 15;
  double a = std::fabs((double)f);
  uint16_t out;
  if (std::isnan(f)) {
    out = 0x7e00;
  } else if (a >= 65520.0) {  // rounds to infinity
    out = 0x7c00;
  } else if (a < std::ldexp(1.0, -14)) {  // subnormal (or the least normal)
    out = (uint16_t)std::nearbyint(a / std::ldexp(1.0, -24));
  } else {
    int e;
    std::frexp(a, &e);  // a in [2^(e-1), 2^e)
    int E = e - 1;
    double q = std::nearbyint(a / std::ldexp(1.0, E - 10));  // in [1024, 2048]
    if (q == 2048) {
      q = 1024;
      E++;
    }
    out = E + 15 >= 31 ? 0x7c00 : (uint16_t)(((E + 15) << 10) | ((unsigned)q - 1024));
  }
  return __half{(uint16_t)(out | sign)};
}

inline void emuEntry() {
  EmuBlock* blk = emuBlock;
  blk->body(blk->arg);
  int t = blk->cur;
  emuDrop(blk->block);
  emuDrop(blk->warps[t / 32]);
  blk->threads[t].done = true;
  // Returning resumes the scheduler (uc_link).
}

// launch runs kernel f over grid g of blocks b, one block after another.
template <class F, class... A>
void launch(dim3 g, dim3 b, F f, A... a) {
  gridDim = g;
  blockDim = b;
  int nt = b.x * b.y * b.z;
  std::function<void()> call = [&] { f(a...); };
  EmuBlock blk;
  blk.threads.resize(nt);
  for (auto& t : blk.threads) t.stack.resize(128 << 10);
  blk.body = [](void* c) { (*(std::function<void()>*)c)(); };
  blk.arg = &call;
  emuBlock = &blk;
  for (unsigned bz = 0; bz < g.z; bz++) {
    for (unsigned by = 0; by < g.y; by++) {
      for (unsigned bx = 0; bx < g.x; bx++) {
        blockIdx = dim3(bx, by, bz);
        blk.block = EmuBarrier{nt, 0, 0};
        blk.warps.assign((nt + 31) / 32, EmuBarrier{});
        for (int w = 0; w < (nt + 31) / 32; w++) blk.warps[w].expected = std::min(32, nt - 32 * w);
        blk.xchg.assign(nt, 0.0);
        for (auto& t : blk.threads) {
          t.done = false;
          t.waiting = nullptr;
          getcontext(&t.uc);
          t.uc.uc_stack.ss_sp = t.stack.data();
          t.uc.uc_stack.ss_size = t.stack.size();
          t.uc.uc_link = &blk.scheduler;
          makecontext(&t.uc, emuEntry, 0);
        }
        for (int live = nt; live > 0;) {
          bool progress = false;
          live = 0;
          for (int i = 0; i < nt; i++) {
            EmuThread& t = blk.threads[i];
            if (t.done) continue;
            if (t.waiting && t.waiting->gen == t.gen) {
              live++;
              continue;  // its barrier is not complete yet
            }
            t.waiting = nullptr;
            blk.cur = i;
            threadIdx = dim3(i % b.x, (i / b.x) % b.y, i / (b.x * b.y));
            swapcontext(&blk.scheduler, &t.uc);
            progress = true;
            if (!t.done) live++;
          }
          if (live > 0 && !progress) {
            fprintf(stderr, "emu: block (%u,%u,%u) deadlocked at a barrier\n", bx, by, bz);
            abort();
          }
        }
      }
    }
  }
  emuBlock = nullptr;
}

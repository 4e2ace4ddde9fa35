// act_gen writes the activation blocks that llama.cpp's native x86-64 build
// makes: ggml-cpu's quantize_row_q8_0, quantize_row_q8_1 and
// quantize_row_q8_K (the from_float of the Q8_0, Q8_1 and Q8_K vec_dot
// types). It must be built with -march=native (or any -m flag giving AVX),
// which selects ggml's AVX2 quantizers for Q8_0 and Q8_1 (Q8_K has no x86
// SIMD quantizer at this commit: it calls quantize_row_q8_K_ref).
//
// Outputs, in the current folder:
//   act_q8_0.bin, act_q8_1.bin, act_q8_K.bin: input.f32 reversed
//     (activation i = input 1023-i), the activations of the recorded dots;
//   act_edge.f32: 2048 activations made here to tell the x86 quantizers
//     from ggml's scalar reference (rounding ties, blocks whose 127/amax and
//     1/(amax/127) differ in the last place with values that round
//     differently because of it, tiny blocks whose 127/amax is +Inf);
//   act_edge_q8_0.bin, act_edge_q8_1.bin, act_edge_q8_K.bin: act_edge.f32
//     quantized.
// It prints how many blocks of act_edge.f32 the scalar reference encodes
// differently.
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "ggml-common.h"
#include "ggml-quants.h"
#include "ggml-cpu-quants.h"

#if !defined(__AVX__)
#error "build act_gen with -march=native on x86-64: without AVX ggml takes its scalar quantizers"
#endif

#define N 1024
#define NE 2048

static void wr(const char *name, const void *p, size_t n) {
	FILE *f = fopen(name, "wb");
	if (!f || fwrite(p, 1, n, f) != n) { perror(name); exit(1); }
	fclose(f);
}

static uint64_t rs = 0x9e3779b97f4a7c15u;
static uint32_t rnd(void) { // xorshift64*
	rs ^= rs >> 12; rs ^= rs << 25; rs ^= rs >> 27;
	return (uint32_t)((rs * 0x2545f4914f6cdd1du) >> 32);
}
static float unif(void) { return (float)(rnd() >> 8) / 16777216.0f; } // [0, 1)
static float gauss(void) { float s = 0; for (int i = 0; i < 12; i++) s += unif(); return s - 6; }
static float sgn(float v) { return rnd() & 1 ? -v : v; }

// The two roundings of a value v of a block with largest magnitude amax.
static int ref_q(float v, float amax) { float d = amax / 127; float id = d ? 1.0f / d : 0.0f; return (int)roundf(v * id); }
static int x86_q(float v, float amax) { float id = amax != 0 ? 127.0f / amax : 0.0f; return (int)nearbyintf(v * id); }

// ties fills a block whose largest magnitude is a (id exact in both formulas
// when a is 127·2^k) with values of odd multiples of a/254: exact halves.
static void ties(float *x, float a) {
	x[0] = sgn(a);
	for (int j = 1; j < 32; j++) x[j] = sgn(((float)(rnd() % 127) + 0.5f) * (a / 127));
}

// differ fills a block whose 127/amax differs from 1/(amax/127) with values
// that the two formulas round differently where it finds one near a half.
static void differ(float *x) {
	float a;
	do a = 0.05f + 20 * unif(); while (127.0f / a == 1.0f / (a / 127));
	x[0] = sgn(a);
	for (int j = 1; j < 32; j++) {
		float h = ((float)(rnd() % 127) + 0.5f) * (a / 127), v = h;
		for (int k = 0; k < 64; k++) {
			float c = nextafterf(h, k & 1 ? 0 : INFINITY);
			for (int s = 0; s < k / 2; s++) c = nextafterf(c, k & 1 ? 0 : INFINITY);
			if (ref_q(c, a) != x86_q(c, a)) { v = c; break; }
		}
		x[j] = sgn(v);
	}
}

static void plain(float *x, float scale) {
	for (int j = 0; j < 32; j++) x[j] = scale * gauss();
}

static void edge(float *x) {
	for (int b = 0; b < NE / 32; b++) {
		float *xb = x + 32 * b;
		int sb = b / 8; // Q8_K super-block
		if (sb == 6) { // 127/amax = +Inf for Q8_0, -127/v = -Inf for Q8_K
			for (int j = 0; j < 32; j++) xb[j] = j % 5 == 0 ? 0.0f : 1e-37f * gauss() / 4;
			xb[b % 32] = b % 2 ? 3e-37f : -3e-37f;
			continue;
		}
		switch (b % 8) {
		case 0: ties(xb, 127); break;
		case 1: ties(xb, 63.5f); break;
		case 2: case 3: case 4: case 5: differ(xb); break;
		case 6: plain(xb, b % 3 ? 1 : 1e-3f); break;
		default:
			if (b == 63) { // subnormals and signed zeros
				for (int j = 0; j < 32; j++) xb[j] = j % 3 ? sgn(1e-40f * unif()) : -0.0f;
			} else if (b == 55 - 8) { // zeros
				memset(xb, 0, 32 * sizeof *xb);
			} else { // the largest magnitude twice, negative first
				plain(xb, 2);
				xb[3] = -9; xb[20] = 9;
			}
		}
	}
}

int main(void) {
	static float x[N], y[N], e[NE];
	FILE *f = fopen("input.f32", "rb");
	if (!f || fread(x, 4, N, f) != N) { perror("input.f32"); return 1; }
	fclose(f);
	for (int i = 0; i < N; i++) y[i] = x[N-1-i];

	static block_q8_0 a80[N/QK8_0];
	static block_q8_1 a81[N/QK8_1];
	static block_q8_K a8k[N/QK_K];
	quantize_row_q8_0(y, a80, N);
	quantize_row_q8_1(y, a81, N);
	quantize_row_q8_K(y, a8k, N);
	wr("act_q8_0.bin", a80, sizeof a80);
	wr("act_q8_1.bin", a81, sizeof a81);
	wr("act_q8_K.bin", a8k, sizeof a8k);

	edge(e);
	wr("act_edge.f32", e, sizeof e);
	static block_q8_0 e80[NE/QK8_0], r80[NE/QK8_0];
	static block_q8_1 e81[NE/QK8_1], r81[NE/QK8_1];
	static block_q8_K e8k[NE/QK_K];
	quantize_row_q8_0(e, e80, NE);
	quantize_row_q8_1(e, e81, NE);
	quantize_row_q8_K(e, e8k, NE);
	wr("act_edge_q8_0.bin", e80, sizeof e80);
	wr("act_edge_q8_1.bin", e81, sizeof e81);
	wr("act_edge_q8_K.bin", e8k, sizeof e8k);

	quantize_row_q8_0_ref(e, r80, NE);
	quantize_row_q8_1_ref(e, r81, NE);
	int d0 = 0, d1 = 0;
	for (int b = 0; b < NE / 32; b++) {
		d0 += memcmp(&e80[b], &r80[b], sizeof e80[b]) != 0;
		d1 += memcmp(&e81[b], &r81[b], sizeof e81[b]) != 0;
	}
	printf("act_edge: %d of %d Q8_0 blocks and %d Q8_1 blocks differ from the scalar reference\n", d0, NE / 32, d1);
	return 0;
}

// legacy_gen writes ggml's reference encodings, dequantized values and vec_dot results
// for Q4_1, Q5_0, Q5_1, IQ4_NL (and the Q8_0/Q8_1 activations) of input.f32.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "ggml-common.h"
#include "ggml-quants.h"
#include "ggml-cpu-quants.h"

#define N 1024

static void wr(const char *name, const void *p, size_t n) {
	FILE *f = fopen(name, "wb");
	if (!f || fwrite(p, 1, n, f) != n) { perror(name); exit(1); }
	fclose(f);
}

int main(int argc, char **argv) {
	static float x[N], y[N], deq[N];
	FILE *f = fopen(argv[1], "rb");
	if (!f || fread(x, 4, N, f) != N) { perror("input"); return 1; }
	fclose(f);
	for (int i = 0; i < N; i++) y[i] = x[N-1-i]; // activations: input reversed

	static block_q4_1 q41[N/32]; static block_q5_0 q50[N/32];
	static block_q5_1 q51[N/32]; static block_iq4_nl iq4[N/32];
	static block_q8_0 a80[N/32]; static block_q8_1 a81[N/32];
	quantize_row_q4_1_ref(x, q41, N);
	quantize_row_q5_0_ref(x, q50, N);
	quantize_row_q5_1_ref(x, q51, N);
	quantize_iq4_nl(x, iq4, 1, N, NULL);
	quantize_row_q8_0(y, a80, N);
	quantize_row_q8_1(y, a81, N);
	wr("q4_1.bin", q41, sizeof q41); wr("q5_0.bin", q50, sizeof q50);
	wr("q5_1.bin", q51, sizeof q51); wr("iq4_nl.bin", iq4, sizeof iq4);
	wr("act_q8_0.bin", a80, sizeof a80); wr("act_q8_1.bin", a81, sizeof a81);

	// Dequantized values, one file of N float32 per type, in the order above.
	static float deqs[4][N];
	dequantize_row_q4_1(q41, deqs[0], N);
	dequantize_row_q5_0(q50, deqs[1], N);
	dequantize_row_q5_1(q51, deqs[2], N);
	dequantize_row_iq4_nl(iq4, deqs[3], N);
	wr("deq.f32", deqs, sizeof deqs);

	// vec_dot with ggml's vec_dot_type: per 32-value block, then the whole row.
	static float dots[4][N/32 + 1];
	for (int b = 0; b <= N/32; b++) {
		int n = b < N/32 ? 32 : N, o = b < N/32 ? b : 0;
		ggml_vec_dot_q4_1_q8_1(n, &dots[0][b], 0, q41 + o, 0, a81 + o, 0, 1);
		ggml_vec_dot_q5_0_q8_0(n, &dots[1][b], 0, q50 + o, 0, a80 + o, 0, 1);
		ggml_vec_dot_q5_1_q8_1(n, &dots[2][b], 0, q51 + o, 0, a81 + o, 0, 1);
		ggml_vec_dot_iq4_nl_q8_0(n, &dots[3][b], 0, iq4 + o, 0, a80 + o, 0, 1);
	}
	wr("dots.f32", dots, sizeof dots);
	(void)deq;
	return 0;
}

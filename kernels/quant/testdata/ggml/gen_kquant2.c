// Writes ggml's reference encodings, dequantizations and Q8_K dot products
// of Q2_K, Q3_K, Q5_K and IQ4_XS for kernels/quant/testdata/ggml.
// Build and run: see README.md.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "ggml.h"
#include "ggml-common.h"
#include "ggml-quants.h"
#include "ggml-cpu-quants.h"

#include "ggml-impl.h"

// The few symbols of ggml.c that ggml-quants.c and ggml-cpu-quants.c use.

float ggml_table_f32_f16[1 << 16];

__attribute__((constructor)) static void init_table(void) {
    for (int i = 0; i < (1 << 16); i++) ggml_table_f32_f16[i] = GGML_COMPUTE_FP16_TO_FP32((ggml_fp16_t)i);
}

void ggml_abort(const char *file, int line, const char *fmt, ...) {
    fprintf(stderr, "ggml_abort %s:%d %s\n", file, line, fmt);
    abort();
}
size_t ggml_type_size(enum ggml_type t) { (void)t; abort(); }
const char *ggml_type_name(enum ggml_type t) { (void)t; abort(); }
size_t ggml_row_size(enum ggml_type t, int64_t n) { (void)t; (void)n; abort(); }

#define N 1024

static void writef(const char *name, const void *p, size_t n) {
    FILE *f = fopen(name, "wb");
    if (!f || fwrite(p, 1, n, f) != n) { perror(name); exit(1); }
    fclose(f);
}

typedef void (*quant_fn)(const float *, void *, int64_t);
typedef void (*deq_fn)(const void *, float *, int64_t);
typedef void (*dot_fn)(int, float *, size_t, const void *, size_t, const void *, size_t, int);

int main(void) {
    float x[N], a[N], y[N];
    FILE *f = fopen("input.f32", "rb");
    if (!f || fread(x, 4, N, f) != N) { perror("input.f32"); return 1; }
    fclose(f);
    // Activations: the input reversed.
    for (int i = 0; i < N; i++) a[i] = x[N - 1 - i];
    block_q8_K q8[N / QK_K];
    quantize_row_q8_K_ref(a, q8, N);
    writef("act_q8_K.bin", q8, sizeof q8);

    struct {
        const char *name; size_t bsize;
        quant_fn q; deq_fn dq; dot_fn dot;
    } types[] = {
        {"q2_K", sizeof(block_q2_K), (quant_fn)quantize_row_q2_K_ref, (deq_fn)dequantize_row_q2_K, ggml_vec_dot_q2_K_q8_K},
        {"q3_K", sizeof(block_q3_K), (quant_fn)quantize_row_q3_K_ref, (deq_fn)dequantize_row_q3_K, ggml_vec_dot_q3_K_q8_K},
        {"q5_K", sizeof(block_q5_K), (quant_fn)quantize_row_q5_K_ref, (deq_fn)dequantize_row_q5_K, ggml_vec_dot_q5_K_q8_K},
        {"iq4_xs", sizeof(block_iq4_xs), (quant_fn)quantize_row_iq4_xs_ref, (deq_fn)dequantize_row_iq4_xs, ggml_vec_dot_iq4_xs_q8_K},
    };
    FILE *dots = fopen("vec_dot_q8_K.txt", "w");
    fprintf(dots, "# type, then ggml_vec_dot_<type>_q8_K of each 256-value block and of the whole row, as C99 hex floats\n");
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        size_t nbytes = N / QK_K * types[t].bsize;
        unsigned char *q = calloc(1, nbytes);
        types[t].q(x, q, N);
        char name[64];
        snprintf(name, sizeof name, "%s.bin", types[t].name);
        writef(name, q, nbytes);
        types[t].dq(q, y, N);
        snprintf(name, sizeof name, "%s.deq.f32", types[t].name);
        writef(name, y, sizeof y);
        fprintf(dots, "%s", types[t].name);
        for (int b = 0; b < N / QK_K; b++) {
            float s;
            types[t].dot(QK_K, &s, 0, q + b * types[t].bsize, 0, &q8[b], 0, 1);
            fprintf(dots, " %a", s);
        }
        float s;
        types[t].dot(N, &s, 0, q, 0, q8, 0, 1);
        fprintf(dots, " %a\n", s);
        free(q);
    }
    fclose(dots);
    return 0;
}

// gen_rmsnorm records ggml-cpu's RMS norm followed by the multiplication
// with a norm weight (ggml_rms_norm then ggml_mul, the pair llama.cpp's
// build_norm makes), computed by the CPU backend of the ggml it is linked
// against, for kernels' TestRMSNormMatchesGGML.
//
// Rows (256 values each): the four super-blocks of input.f32, the same
// four decoded from q6_K.bin by ggml's Q6_K dequantization (values of a
// quantized token embedding: their ratios are ratios of small integers,
// so the normalized values can sit exactly on Q8_K rounding ties), and
// input.f32's first super-block times 4096 (a large residual stream).
// Writes rms_norm.f32: the 9 rows normalized with eps 1e-5 and weight
// all ones, then with weight = input.f32's third super-block (uniform in
// [0.5, 1.5)), float32 little-endian.
#include <stdio.h>
#include <stdlib.h>

#include "ggml-cpu.h"
#include "ggml.h"

#define N 256
#define ROWS 9

static void read_file(const char *name, void *buf, size_t n) {
    FILE *f = fopen(name, "rb");
    if (!f || fread(buf, 1, n, f) != n) {
        fprintf(stderr, "cannot read %zu bytes of %s\n", n, name);
        exit(1);
    }
    fclose(f);
}

int main(void) {
    static float in[4 * N], x[ROWS * N];
    static unsigned char q6[4 * 210];
    read_file("input.f32", in, sizeof in);
    read_file("q6_K.bin", q6, sizeof q6);
    // ggml_init fills the binary16 table the Q6_K decoder reads.
    struct ggml_init_params p = {64 * 1024 * 1024, NULL, false};
    struct ggml_context *ctx = ggml_init(p);
    for (int i = 0; i < 4 * N; i++) x[i] = in[i];
    ggml_get_type_traits(GGML_TYPE_Q6_K)->to_float(q6, x + 4 * N, 4 * N);
    for (int i = 0; i < N; i++) x[8 * N + i] = in[i] * 4096.0f;

    struct ggml_tensor *tx = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, N, ROWS);
    struct ggml_tensor *ones = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, N);
    struct ggml_tensor *w = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, N);
    for (int i = 0; i < ROWS * N; i++) ((float *)tx->data)[i] = x[i];
    for (int i = 0; i < N; i++) {
        ((float *)ones->data)[i] = 1.0f;
        ((float *)w->data)[i] = in[2 * N + i];
    }
    struct ggml_tensor *a = ggml_mul(ctx, ggml_rms_norm(ctx, tx, 1e-5f), ones);
    struct ggml_tensor *b = ggml_mul(ctx, ggml_rms_norm(ctx, tx, 1e-5f), w);
    struct ggml_cgraph *gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, a);
    ggml_build_forward_expand(gf, b);
    if (ggml_graph_compute_with_ctx(ctx, gf, 1) != GGML_STATUS_SUCCESS) {
        fprintf(stderr, "compute failed\n");
        return 1;
    }
    FILE *f = fopen("rms_norm.f32", "wb");
    fwrite(a->data, sizeof(float), ROWS * N, f);
    fwrite(b->data, sizeof(float), ROWS * N, f);
    fclose(f);
    ggml_free(ctx);
    return 0;
}

// The few symbols of ggml.c that ggml-quants.c and ggml-cpu-quants.c use,
// so that the two can be linked without the rest of ggml.
#include <stdio.h>
#include <stdlib.h>
#include "ggml-impl.h"
float ggml_table_f32_f16[1 << 16];
__attribute__((constructor)) static void init_table(void) {
	for (int i = 0; i < (1 << 16); i++) ggml_table_f32_f16[i] = GGML_COMPUTE_FP16_TO_FP32((ggml_fp16_t)i);
}
void ggml_abort(const char *file, int line, const char *fmt, ...) { fprintf(stderr, "abort %s:%d %s\n", file, line, fmt); abort(); }
size_t ggml_type_size(enum ggml_type t) { (void)t; abort(); }
const char *ggml_type_name(enum ggml_type t) { (void)t; return "?"; }
size_t ggml_row_size(enum ggml_type t, int64_t n) { (void)t; (void)n; abort(); }

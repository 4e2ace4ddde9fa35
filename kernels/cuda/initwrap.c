//go:build cuda

// gorgonia.org/cu calls cuInit from a package init function and exits the
// process when it fails, so a cuda-tagged binary could not even start on a
// machine whose driver sees no GPU, --device cpu or not. The link wraps
// cuInit (-Wl,--wrap=cuInit in init_cuda.go): the binding's call lands
// here, the driver's result is kept for New to report, and the binding is
// told it succeeded. Every later driver call made without a working
// cuInit returns CUDA_ERROR_NOT_INITIALIZED, and New never makes one: it
// checks the kept result first.

#include <cuda.h>

CUresult __real_cuInit(unsigned int flags);

static CUresult baton_cu_init_result = CUDA_SUCCESS;

CUresult __wrap_cuInit(unsigned int flags) {
	baton_cu_init_result = __real_cuInit(flags);
	return CUDA_SUCCESS;
}

int baton_cu_init_status(void) { return (int)baton_cu_init_result; }

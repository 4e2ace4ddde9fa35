/*
 * Compatibility shim between gorgonia.org/cu v0.9.6 and the cuda.h of
 * CUDA 13.
 *
 * CUDA 13's cuda.h maps five driver functions that cu calls to new entry
 * points with new parameters (cuCtxCreate -> cuCtxCreate_v4, which takes a
 * CUctxCreateParams*; cuMemAdvise and cuMemPrefetchAsync, which take a
 * CUmemLocation; cuGraphAddDependencies and cuGraphGetEdges, which take edge
 * data), so cu's calls no longer compile. The driver still exports the
 * entry points with the old parameters under their old names, which the
 * CUDA 12 headers mapped these names to. This header includes the real
 * cuda.h and then points the five names back at those entry points, with
 * their old prototypes.
 *
 * Put this directory FIRST on the C include path of the whole build, so
 * that cu's own `#include <cuda.h>` finds this file:
 *
 *   CGO_CFLAGS="-I$PWD/compat -I/usr/local/cuda/include"
 *
 * With older toolkits (CUDA 12.x and before) the names already mean the
 * old entry points; the shim is then a no-op, as it tests CUDA_VERSION.
 */
#ifndef BATON_CUDA_COMPAT_H
#define BATON_CUDA_COMPAT_H

#include_next <cuda.h>

#if defined(CUDA_VERSION) && CUDA_VERSION >= 13000

#ifdef __cplusplus
extern "C" {
#endif

/* Context creation without CUctxCreateParams: the CUDA 3.2-12.x entry. */
#undef cuCtxCreate
CUresult CUDAAPI cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev);
#define cuCtxCreate cuCtxCreate_v2

/*
 * Unified-memory hints that name a device rather than a CUmemLocation.
 * The driver exports these under the unversioned names, so the names are
 * declared directly once the macros are gone.
 */
#undef cuMemAdvise
CUresult CUDAAPI cuMemAdvise(CUdeviceptr devPtr, size_t count, CUmem_advise advice, CUdevice device);

#undef cuMemPrefetchAsync
CUresult CUDAAPI cuMemPrefetchAsync(CUdeviceptr devPtr, size_t count, CUdevice dstDevice, CUstream hStream);

/* Graph edges without per-edge data (CUDA 10-12.2 entries). */
#undef cuGraphAddDependencies
CUresult CUDAAPI cuGraphAddDependencies(CUgraph hGraph, const CUgraphNode *from, const CUgraphNode *to, size_t numDependencies);

#undef cuGraphGetEdges
CUresult CUDAAPI cuGraphGetEdges(CUgraph hGraph, CUgraphNode *from, CUgraphNode *to, size_t *numEdges);

#ifdef __cplusplus
}
#endif

#endif /* CUDA_VERSION >= 13000 */

#endif /* BATON_CUDA_COMPAT_H */

// An emulated CUDA driver: a libcuda.so.1 with the few driver API
// functions that the cuda package calls, which runs kernels.cu on the CPU
// through cuda_fp16.h. A test binary built with -tags cuda runs against it
// with LD_LIBRARY_PATH pointing here, which tests the Go side (launch
// arguments, offsets, contexts, copies) and the kernels together without a
// GPU. Device pointers are host pointers; every copy and memset is checked
// to stay inside an allocation (an error aborts), and every call but the
// device queries needs the context current, as the real driver does.
//
// The table of kernels below spells out each kernel's parameter types, as
// the driver learns them from the PTX: keep it in step with kernels.cu.
#include "cuda_fp16.h"
#include "../kernels.cu"
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>
typedef unsigned long long CUdeviceptr;
static thread_local std::vector<void*> ctxStack;
static int primaryCtx;  // its address is the context handle
static std::mutex allocMu;
static std::map<uintptr_t, size_t> allocs;
static bool inRange(uintptr_t p, size_t n) {
  std::lock_guard<std::mutex> g(allocMu);
  auto it = allocs.upper_bound(p);
  if (it == allocs.begin()) return false;
  --it;
  return p >= it->first && p + n <= it->first + it->second;
}
#define NEEDCTX if (ctxStack.empty() || ctxStack.back() != &primaryCtx) { fprintf(stderr, "emu: %s without a current context\n", __func__); return 201; }
#define NEED(p, n) if (!inRange((uintptr_t)(p), (n))) { fprintf(stderr, "emu: %s: [%#llx, +%zu) outside every allocation\n", __func__, (unsigned long long)(p), (size_t)(n)); abort(); }
struct Fn { std::string name; void (*tramp)(dim3, dim3, void**); };
#define P(i, T) (*(T*)params[i])
static void t_mm(void (*k)(float*, const u8*, const float*, int, int, int, i64), dim3 g, dim3 b, void** params) {
  launch(g, b, k, P(0, float*), P(1, const u8*), P(2, const float*), P(3, int), P(4, int), P(5, int), P(6, i64));
}
static std::map<std::string, void (*)(dim3, dim3, void**)> kernels_ = {
  {"mm_f32", [](dim3 g, dim3 b, void** p) { t_mm(mm_f32, g, b, p); }},
  {"mm_f16", [](dim3 g, dim3 b, void** p) { t_mm(mm_f16, g, b, p); }},
  {"mm_bf16", [](dim3 g, dim3 b, void** p) { t_mm(mm_bf16, g, b, p); }},
  {"mm_q8_0", [](dim3 g, dim3 b, void** p) { t_mm(mm_q8_0, g, b, p); }},
  {"mm_q4_0", [](dim3 g, dim3 b, void** p) { t_mm(mm_q4_0, g, b, p); }},
  {"mm_q4_1", [](dim3 g, dim3 b, void** p) { t_mm(mm_q4_1, g, b, p); }},
  {"mm_q5_0", [](dim3 g, dim3 b, void** p) { t_mm(mm_q5_0, g, b, p); }},
  {"mm_q5_1", [](dim3 g, dim3 b, void** p) { t_mm(mm_q5_1, g, b, p); }},
  {"mm_iq4_nl", [](dim3 g, dim3 b, void** p) { t_mm(mm_iq4_nl, g, b, p); }},
  {"mm_q2_k", [](dim3 g, dim3 b, void** p) { t_mm(mm_q2_k, g, b, p); }},
  {"mm_q3_k", [](dim3 g, dim3 b, void** p) { t_mm(mm_q3_k, g, b, p); }},
  {"mm_q4_k", [](dim3 g, dim3 b, void** p) { t_mm(mm_q4_k, g, b, p); }},
  {"mm_q5_k", [](dim3 g, dim3 b, void** p) { t_mm(mm_q5_k, g, b, p); }},
  {"mm_q6_k", [](dim3 g, dim3 b, void** p) { t_mm(mm_q6_k, g, b, p); }},
  {"mm_iq4_xs", [](dim3 g, dim3 b, void** p) { t_mm(mm_iq4_xs, g, b, p); }},
  {"embed", [](dim3 g, dim3 b, void** params) { launch(g, b, embed, P(0, float*), P(1, const u8*), P(2, const int*), P(3, int), P(4, i64), P(5, int)); }},
  {"rmsnorm", [](dim3 g, dim3 b, void** params) { launch(g, b, rmsnorm, P(0, float*), P(1, const float*), P(2, const float*), P(3, int), P(4, float)); }},
  {"rope", [](dim3 g, dim3 b, void** params) { launch(g, b, rope, P(0, float*), P(1, const float*), P(2, const float*), P(3, int), P(4, int), P(5, int), P(6, int)); }},
  {"softmax_rows", [](dim3 g, dim3 b, void** params) { launch(g, b, softmax_rows, P(0, float*), P(1, int)); }},
  {"silu_mul", [](dim3 g, dim3 b, void** params) { launch(g, b, silu_mul, P(0, float*), P(1, const float*), P(2, const float*), P(3, i64)); }},
  {"add_bcast", [](dim3 g, dim3 b, void** params) { launch(g, b, add_bcast, P(0, float*), P(1, const float*), P(2, const float*), P(3, i64), P(4, i64)); }},
  {"kv_store", [](dim3 g, dim3 b, void** params) { launch(g, b, kv_store, P(0, u8*), P(1, const float*), P(2, const float*), P(3, const int*), P(4, int), P(5, int), P(6, i64), P(7, i64), P(8, i64), P(9, int)); }},
  {"attention", [](dim3 g, dim3 b, void** params) { launch(g, b, attention, P(0, float*), P(1, const float*), P(2, const u8*), P(3, const int*), P(4, const int*), P(5, int), P(6, int), P(7, int), P(8, int), P(9, i64), P(10, i64), P(11, i64), P(12, int), P(13, float), P(14, float), P(15, int)); }},
  {"gelu_mul", [](dim3 g, dim3 b, void** params) { launch(g, b, gelu_mul, P(0, float*), P(1, const float*), P(2, const float*), P(3, const float*), P(4, i64)); }},
  {"scale_f32", [](dim3 g, dim3 b, void** params) { launch(g, b, scale_f32, P(0, float*), P(1, const float*), P(2, float), P(3, i64)); }},
  {"soft_cap", [](dim3 g, dim3 b, void** params) { launch(g, b, soft_cap, P(0, float*), P(1, float), P(2, i64)); }},
};
extern "C" {
int cuInit(unsigned) { return 0; }
int cuDriverGetVersion(int* v) { *v = 13000; return 0; }
int cuDeviceGetCount(int* n) { *n = 1; return 0; }
int cuDeviceGet(int* d, int ord) { if (ord != 0) return 101; *d = 0; return 0; }
int cuDeviceGetAttribute(int* v, int attr, int) { *v = attr == 75 ? 9 : attr == 76 ? 0 : 1; return 0; }
int cuDeviceGetName(char* name, int len, int) { snprintf(name, len, "emulated GPU (kernels/cuda/emu)"); return 0; }
// The emulated device has 1 GiB, and allocations beyond it fail as a GPU's
// do (CUDA_ERROR_OUT_OF_MEMORY), so start-up checks of a KV budget against
// free memory can be tried here.
static const size_t kDeviceBytes = 1ull << 30;
static size_t allocated = 0;  // guarded by allocMu
int cuDeviceTotalMem_v2(size_t* b, int) { *b = kDeviceBytes; return 0; }
int cuDeviceGetUuid(unsigned char* uuid, int) { for (int i = 0; i < 16; i++) uuid[i] = (unsigned char)(0xe0 + i); return 0; }
int cuDevicePrimaryCtxRetain(void** c, int) { *c = &primaryCtx; return 0; }
int cuDevicePrimaryCtxRelease_v2(int) { return 0; }
int cuCtxPushCurrent_v2(void* c) { ctxStack.push_back(c); return 0; }
int cuCtxPopCurrent_v2(void** c) { if (ctxStack.empty()) return 201; if (c) *c = ctxStack.back(); ctxStack.pop_back(); return 0; }
// Streams other than the default one run their copies late: an async copy
// waits in its stream's queue until something synchronizes with the
// stream (an event it recorded, cuStreamWaitEvent, cuStreamSynchronize,
// cuCtxSynchronize), as a real copy engine may finish any time before
// then. Code that reads a staging buffer before waiting, or lets kernels
// read a page before the copy into it is ordered before them, sees stale
// bytes here. Kernels run on the default stream only, at launch.
struct Stream { std::vector<std::function<void()>> q; };
struct Event { Stream* s = nullptr; };
static std::mutex streamMu;
static std::set<Stream*> streams;  // guarded by streamMu
// runMu is held while queued copies run, so that a second flush, finding
// the queue already taken, waits for them to finish instead of returning
// before the copy it waits for is done.
static std::mutex runMu;
static void flush(Stream* s) {
  if (s == nullptr) return;
  std::lock_guard<std::mutex> run(runMu);
  std::vector<std::function<void()>> q;
  { std::lock_guard<std::mutex> g(streamMu); q.swap(s->q); }
  for (auto& f : q) f();
}
int cuCtxSynchronize() {
  NEEDCTX;
  std::vector<Stream*> all;
  { std::lock_guard<std::mutex> g(streamMu); all.assign(streams.begin(), streams.end()); }
  for (Stream* s : all) flush(s);
  return 0;
}
int cuModuleLoadData(void** m, const void* image) {
  NEEDCTX;
  std::string s((const char*)image);
  // Any image naming the kernels will do: the functions are compiled in.
  if (s.find(".entry attention") == std::string::npos && s.find("EMULATED") == std::string::npos) return 218;  // CUDA_ERROR_INVALID_PTX
  *m = new int(1); return 0;
}
int cuModuleLoadDataEx(void** m, const void* image, unsigned, void*, void*) { return cuModuleLoadData(m, image); }
int cuModuleGetFunction(void** f, void*, const char* name) {
  NEEDCTX;
  auto it = kernels_.find(name);
  if (it == kernels_.end()) return 500;
  *f = new Fn{name, it->second}; return 0;
}
int cuModuleUnload(void* m) { delete (int*)m; return 0; }
int cuMemAlloc_v2(CUdeviceptr* p, size_t n) {
  NEEDCTX;
  if (n == 0) return 1;
  {
    std::lock_guard<std::mutex> g(allocMu);
    if (n > kDeviceBytes - allocated) return 2;  // CUDA_ERROR_OUT_OF_MEMORY
    allocated += n;
  }
  void* m = aligned_alloc(256, (n + 255) / 256 * 256);
  memset(m, 0xCD, n);  // garbage, as device memory is
  { std::lock_guard<std::mutex> g(allocMu); allocs[(uintptr_t)m] = n; }
  *p = (CUdeviceptr)m; return 0;
}
int cuMemGetInfo_v2(size_t* free, size_t* total) {
  NEEDCTX;
  std::lock_guard<std::mutex> g(allocMu);
  *free = kDeviceBytes - allocated;
  *total = kDeviceBytes;
  return 0;
}
int cuMemFree_v2(CUdeviceptr p) {
  NEEDCTX;
  std::lock_guard<std::mutex> g(allocMu);
  auto it = allocs.find((uintptr_t)p);
  if (it == allocs.end()) { fprintf(stderr, "emu: freeing %#llx, not an allocation\n", p); abort(); }
  allocated -= it->second;
  allocs.erase(it);
  free((void*)p); return 0;
}
int cuMemsetD32_v2(CUdeviceptr p, unsigned v, size_t n) { NEEDCTX; NEED(p, 4 * n); for (size_t i = 0; i < n; i++) ((unsigned*)p)[i] = v; return 0; }
int cuMemsetD8_v2(CUdeviceptr p, unsigned char v, size_t n) { NEEDCTX; NEED(p, n); memset((void*)p, v, n); return 0; }
int cuMemcpyHtoD_v2(CUdeviceptr d, const void* s, size_t n) { NEEDCTX; NEED(d, n); memcpy((void*)d, s, n); return 0; }
int cuMemcpyDtoH_v2(void* d, CUdeviceptr s, size_t n) { NEEDCTX; NEED(s, n); memcpy(d, (void*)s, n); return 0; }
int cuMemcpyDtoD_v2(CUdeviceptr d, CUdeviceptr s, size_t n) {
  NEEDCTX; NEED(d, n); NEED(s, n);
  if ((d < s + n) && (s < d + n)) { fprintf(stderr, "emu: overlapping DtoD copy\n"); abort(); }
  memcpy((void*)d, (void*)s, n); return 0;
}
int cuStreamCreate(void** s, unsigned) {
  NEEDCTX;
  Stream* st = new Stream;
  { std::lock_guard<std::mutex> g(streamMu); streams.insert(st); }
  *s = st; return 0;
}
int cuStreamDestroy_v2(void* s) {
  NEEDCTX;
  flush((Stream*)s);
  { std::lock_guard<std::mutex> g(streamMu); streams.erase((Stream*)s); }
  delete (Stream*)s; return 0;
}
int cuStreamSynchronize(void* s) { NEEDCTX; flush((Stream*)s); return 0; }
int cuEventCreate(void** e, unsigned) { NEEDCTX; *e = new Event; return 0; }
int cuEventDestroy_v2(void* e) { NEEDCTX; delete (Event*)e; return 0; }
int cuEventRecord(void* e, void* s) { NEEDCTX; ((Event*)e)->s = (Stream*)s; return 0; }
int cuEventSynchronize(void* e) { NEEDCTX; flush(((Event*)e)->s); return 0; }
int cuStreamWaitEvent(void*, void* e, unsigned) { NEEDCTX; flush(((Event*)e)->s); return 0; }
static void enqueue(void* stream, std::function<void()> f) {
  if (stream == nullptr) { f(); return; }
  std::lock_guard<std::mutex> g(streamMu);
  ((Stream*)stream)->q.push_back(std::move(f));
}
int cuMemcpyDtoHAsync_v2(void* d, CUdeviceptr s, size_t n, void* stream) {
  NEEDCTX; NEED(s, n);
  enqueue(stream, [=] { memcpy(d, (void*)s, n); }); return 0;
}
int cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void* s, size_t n, void* stream) {
  NEEDCTX; NEED(d, n);
  enqueue(stream, [=] { memcpy((void*)d, s, n); }); return 0;
}
// Page-locked host memory: plain memory here, filled with garbage.
int cuMemAllocHost_v2(void** p, size_t n) {
  NEEDCTX;
  if (n == 0) return 1;
  *p = malloc(n); memset(*p, 0xAB, n); return 0;
}
int cuMemFreeHost(void* p) { NEEDCTX; free(p); return 0; }
int cuLaunchKernel(void* f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, unsigned shared, void* stream, void** params, void** extra) {
  NEEDCTX;
  if (gx == 0 || gy == 0 || gz == 0 || gy > 65535 || bx * by * bz > 1024 || shared != 0 || stream != nullptr || extra != nullptr) return 1;
  Fn* fn = (Fn*)f;
  fn->tramp(dim3(gx, gy, gz), dim3(bx, by, bz), params);
  return 0;
}
}

// Package cuda is a [kernels.Backend] that runs Baton's forward-pass
// kernels on an NVIDIA GPU through the CUDA driver API, with
// gorgonia.org/cu as the binding.
//
// Weights are uploaded once ([kernels.Backend.LoadMatrix]); activations,
// the paged KV cache and every intermediate stay in device memory, so a
// forward pass moves only token ids in and logits out. Matrix products
// dequantize weights in registers: F32, F16, BF16, Q8_0 and Q4_0 with
// kernels of their own, Q4_1, Q5_0, Q5_1, IQ4_NL, Q2_K, Q3_K, Q4_K, Q5_K,
// Q6_K and IQ4_XS with one that dequantizes element by element. F16 and
// BF16 products round the activations to the weights' type first, as the
// CPU backend does; quantized products multiply float32 activations,
// where the CPU backend quantizes them (Q8_0, Q8_1, Q8_K) first, so the
// two differ by that rounding (README.md says by how much). The backend
// implements [kernels.ExtendedOps] (GELU·mul, scale, soft-cap, attention
// with a score scale, soft-cap and sliding window). A token's
// products do not depend on the other tokens of a call as long as
// activation rows start 16 bytes apart (rows of a buffer from Alloc do
// when their length is a multiple of 4): for misaligned operands the
// kernels fall back to narrower loads, which sum in another order.
// Attention reads F32 or F16 pages of the kvcache layout in one pass with
// an online softmax, for any number of query rows (decode and prefill),
// head dimensions up to 256. Kernels go to the context's default stream
// in order; the backend serializes callers with a mutex. KV pages' copies
// to and from the host (ExportKV, ImportKV) go to a non-blocking stream
// of their own through page-locked staging buffers, ordered by events
// after the kernels that wrote a page and before those that read it; the
// caller waits for its copy without the mutex, so a PD transfer does not
// stall the forward steps.
//
// # Building
//
// Without the cuda build tag (the default) the package builds everywhere,
// with or without cgo, and [New] returns [ErrNotBuilt]. With the tag it
// needs cgo, the CUDA driver API header cuda.h and libcuda at link time,
// and the driver (libcuda.so.1) and a GPU at run time.
//
// CUDA 13's cuda.h changed the parameters of five functions that
// gorgonia.org/cu v0.9.6 calls; the header in compat/ points them back at
// the driver's entry points with the old parameters, and must come first
// on the C include path of the whole build (CGO_CFLAGS applies to every
// cgo package, cu included). From kernels/cuda, with the toolkit in
// /usr/local/cuda:
//
//	CGO_CFLAGS="-I$PWD/compat -I/usr/local/cuda/include" \
//	CGO_LDFLAGS="-L/usr/local/cuda/lib64/stubs -L/usr/local/cuda/lib64" \
//	go build -tags cuda ./...
//
// Only cuda.h and a libcuda.so to link against (the toolkit's stub will
// do) are needed to build; the shim is a no-op for CUDA 12 and older.
// Test binaries for a GPU machine are built the same way with
// `go test -c -tags cuda -o cuda.test` and run there by devicecheck.sh.
//
// A trap of the binding, and how it is avoided: gorgonia.org/cu calls
// cuInit when the program starts and exits the process (status 1) if that
// fails. The package's link wraps cuInit (-Wl,--wrap=cuInit, initwrap.c):
// the binding is told it succeeded, the driver's real answer is kept, and
// [New] returns it as an error wrapping [ErrNoDevice]. So a cuda-tagged
// binary starts on a machine whose driver sees no GPU and serves with
// --device cpu; it still needs a libcuda.so.1 to load (the driver's, or
// the toolkit's stub, which answers cuInit with CUDA_ERROR_STUB_LIBRARY).
//
// # Kernels
//
// The device code is CUDA C in kernels.cu, compiled by gen-ptx.sh (which
// needs nvcc) into ptx/kernels_smNN.ptx, committed and embedded; the
// driver compiles the PTX for the GPU when [New] runs. [Options.PTX]
// loads other PTX instead. Without a GPU, emu/run.sh runs kernels.cu's
// own tests and this package's tests against an emulated driver that
// executes kernels.cu on the CPU.
package cuda

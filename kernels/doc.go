// Package kernels holds Baton's compute kernels: the operations a transformer
// forward pass is made of (matrix products for every weight type, RMSNorm,
// RoPE, softmax, SiLU·mul, attention over a paged KV cache), behind one
// [Backend] interface that the engine computes through.
//
// The package has plain Go reference loops for each operation (ops.go,
// paged.go), which faster implementations are tested against, and [CPU],
// the backend that runs them on this machine's cores: the SIMD kernels of
// kernels/vec split over a persistent worker pool. The kernels/cuda module
// implements [Backend] on an NVIDIA GPU.
package kernels

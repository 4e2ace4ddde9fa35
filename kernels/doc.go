// Package kernels holds Baton's compute kernels: the operations a transformer
// forward pass is made of (matrix products for every weight type, RMSNorm,
// RoPE, softmax, SiLU·mul, attention), written first as plain Go reference
// loops that faster implementations are tested against.
package kernels

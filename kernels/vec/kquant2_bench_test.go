package vec

import "testing"

// The 1.1B shape of docs/kernels.md: TinyLlama-1.1B's FFN down projection,
// 2048 rows of 5632 values (22 super-blocks per row), for the types of
// kquant2.go beside Q4_K and Q6_K. Single-threaded; MB/s are weight bytes
// streamed per second. Run them briefly:
//
//	go test -bench KQuant2 -run '^$' -benchtime=200ms ./vec/
const kq2Rows, kq2Cols, kq2Tokens = 2048, 5632, 64

var kq2BenchTypes = []string{"Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS"}

// BenchmarkKQuant2MatVec: one token (decoding). A matrix holds 3.8 MB
// (Q2_K) to 9.5 MB (Q6_K): beyond L2, so the weights stream from L3 or
// memory, once per product.
func BenchmarkKQuant2MatVec(b *testing.B) { benchMatVec(b, kq2Rows, kq2Cols, 4, kq2BenchTypes) }

// BenchmarkKQuant2MatMul: 64 tokens (a prompt), bound by the integer
// multiply-adds.
func BenchmarkKQuant2MatMul(b *testing.B) {
	benchMatMul(b, kq2Rows, kq2Cols, kq2Tokens, 5, kq2BenchTypes, false)
}

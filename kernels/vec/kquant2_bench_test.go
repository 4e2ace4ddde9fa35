package vec

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// The 1.1B shape of docs/kernels.md: TinyLlama-1.1B's FFN down projection,
// 2048 rows of 5632 values (22 super-blocks per row), for the types of
// kquant2.go beside Q4_K and Q6_K. Single-threaded; MB/s are weight bytes
// streamed per second. Run them briefly:
//
//	go test -bench KQuant2 -run '^$' -benchtime=200ms ./vec/
const kq2Rows, kq2Cols, kq2Tokens = 2048, 5632, 64

func kq2BenchTypes() []benchType {
	names := []string{"Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS"}
	var out []benchType
	for _, bt := range benchTypes() {
		if slices.Contains(names, bt.name) {
			out = append(out, bt)
		}
	}
	return out
}

// BenchmarkKQuant2MatVec: one token (decoding). A matrix holds 3.8 MB
// (Q2_K) to 9.5 MB (Q6_K): beyond L2, so the weights stream from L3 or
// memory, once per product.
func BenchmarkKQuant2MatVec(b *testing.B) {
	for _, bt := range kq2BenchTypes() {
		wb, _, matVec, _ := bt.setup(rand.New(rand.NewPCG(4, 4)), kq2Rows, kq2Cols, 1)
		dst := make([]float32, kq2Rows)
		for _, im := range impls() {
			b.Run(bt.name+"/"+im.name, func(b *testing.B) {
				b.SetBytes(int64(wb))
				for b.Loop() {
					matVec(im, dst)
				}
				reportFlops(b, kq2Rows*kq2Cols)
			})
		}
	}
}

// BenchmarkKQuant2MatMul: 64 tokens (a prompt), bound by the integer
// multiply-adds.
func BenchmarkKQuant2MatMul(b *testing.B) {
	for _, bt := range kq2BenchTypes() {
		wb, _, _, matMul := bt.setup(rand.New(rand.NewPCG(5, 5)), kq2Rows, kq2Cols, kq2Tokens)
		dst := make([]float32, kq2Tokens*kq2Rows)
		for _, im := range impls() {
			if im.name == "purego" {
				continue // minutes per run at this size
			}
			b.Run(bt.name+"/"+im.name, func(b *testing.B) {
				b.SetBytes(int64(wb))
				for b.Loop() {
					matMul(im, dst, kq2Tokens)
				}
				reportFlops(b, kq2Rows*kq2Cols*kq2Tokens)
			})
		}
	}
}

//go:build amd64 && !purego

package vec

// isKQuant2 reports whether q is one of kquant2.go's types, whose kernels
// take the K-quant tiling and, like Q4_K's and Q6_K's, are AVX2 code in
// both implementations.
func isKQuant2(q qtype) bool { return q >= q2_K && q <= iq4_XS }

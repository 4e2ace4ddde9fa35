//go:build amd64 && !purego

package vec

// isKQuant2 reports whether q is one of kquant2.go's types, whose kernels
// take the K-quant tiling (1×T tiles) and, unlike Q4_K's and Q6_K's, have
// AVX-512 variants (vpdpwssd) besides the AVX2 ones.
func isKQuant2(q qtype) bool { return q >= q2_K && q <= iq4_XS }

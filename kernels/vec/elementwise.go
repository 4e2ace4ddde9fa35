package vec

import "math"

// Elementwise helpers of the forward pass. Most are memory-bound loops over
// activations a few thousand long, where plain Go, unrolled and free of
// bounds checks, is close enough to assembly, so they have one
// implementation for every platform. ExpSum is the exception: attention
// takes an exponential per head and cached position, and the assembly
// version is many times faster. Functions that take several slices of equal
// length fill their output with NaN if the lengths differ.

// Axpy adds a·x to y: y[i] += a·x[i].
func Axpy(a float32, x, y []float32) {
	if len(x) != len(y) {
		fillNaN(y)
		return
	}
	for len(x) >= 4 {
		xv, yv := (*[4]float32)(x), (*[4]float32)(y)
		yv[0] += a * xv[0]
		yv[1] += a * xv[1]
		yv[2] += a * xv[2]
		yv[3] += a * xv[3]
		x, y = x[4:], y[4:]
	}
	for i, v := range x {
		y[i] += a * v
	}
}

// Axpy4 adds the weighted sum of four rows to y:
// y[i] += (e[0]·v0[i] + e[1]·v1[i]) + (e[2]·v2[i] + e[3]·v3[i]), each
// product and sum rounded to float32 in that order (no fused
// multiply-adds), so that every implementation gives the same bits. It is
// attention's weighted sum of value rows, four cached positions at a time;
// y is filled with NaN unless every row has len(y) values.
func Axpy4(y []float32, e *[4]float32, v0, v1, v2, v3 []float32) {
	n := len(y)
	if len(v0) != n || len(v1) != n || len(v2) != n || len(v3) != n {
		fillNaN(y)
		return
	}
	active.axpy4(y, e, v0, v1, v2, v3)
}

// Axpy4F16 is Axpy4 for rows of little-endian IEEE binary16 values
// (2·len(y) bytes each), as an F16 KV cache stores them; they are widened
// exactly, without a copy.
func Axpy4F16(y []float32, e *[4]float32, v0, v1, v2, v3 []byte) {
	n := 2 * len(y)
	if len(v0) != n || len(v1) != n || len(v2) != n || len(v3) != n {
		fillNaN(y)
		return
	}
	active.axpy4F16(y, e, v0, v1, v2, v3)
}

func axpy4Go(y []float32, e *[4]float32, v0, v1, v2, v3 []float32) {
	e0, e1, e2, e3 := e[0], e[1], e[2], e[3]
	v0, v1, v2, v3 = v0[:len(y)], v1[:len(y)], v2[:len(y)], v3[:len(y)]
	for i := range y {
		// The conversions round each product, which forbids fusing.
		a := float32(e0*v0[i]) + float32(e1*v1[i])
		b := float32(e2*v2[i]) + float32(e3*v3[i])
		y[i] += a + b
	}
}

func axpy4F16Go(y []float32, e *[4]float32, v0, v1, v2, v3 []byte) {
	e0, e1, e2, e3 := e[0], e[1], e[2], e[3]
	for i := range y {
		a := float32(e0*f16At(v0[2*i:])) + float32(e1*f16At(v1[2*i:]))
		b := float32(e2*f16At(v2[2*i:])) + float32(e3*f16At(v3[2*i:]))
		y[i] += a + b
	}
}

// Scale multiplies x by a in place.
func Scale(a float32, x []float32) {
	for len(x) >= 4 {
		v := (*[4]float32)(x)
		v[0] *= a
		v[1] *= a
		v[2] *= a
		v[3] *= a
		x = x[4:]
	}
	for i := range x {
		x[i] *= a
	}
}

// Add sets dst[i] = a[i] + b[i]. dst may be a or b.
func Add(dst, a, b []float32) {
	if len(a) != len(dst) || len(b) != len(dst) {
		fillNaN(dst)
		return
	}
	for len(dst) >= 4 {
		d, x, y := (*[4]float32)(dst), (*[4]float32)(a), (*[4]float32)(b)
		d[0] = x[0] + y[0]
		d[1] = x[1] + y[1]
		d[2] = x[2] + y[2]
		d[3] = x[3] + y[3]
		dst, a, b = dst[4:], a[4:], b[4:]
	}
	for i := range dst {
		dst[i] = a[i] + b[i]
	}
}

// Mul sets dst[i] = a[i]·b[i]. dst may be a or b.
func Mul(dst, a, b []float32) {
	if len(a) != len(dst) || len(b) != len(dst) {
		fillNaN(dst)
		return
	}
	for len(dst) >= 4 {
		d, x, y := (*[4]float32)(dst), (*[4]float32)(a), (*[4]float32)(b)
		d[0] = x[0] * y[0]
		d[1] = x[1] * y[1]
		d[2] = x[2] * y[2]
		d[3] = x[3] * y[3]
		dst, a, b = dst[4:], a[4:], b[4:]
	}
	for i := range dst {
		dst[i] = a[i] * b[i]
	}
}

// SumSquares returns Σ x[i]², accumulated in float64 as ggml's RMSNorm
// does, so that a norm over thousands of values loses nothing to rounding.
func SumSquares(x []float32) float64 {
	var s0, s1, s2, s3 float64
	for len(x) >= 4 {
		v := (*[4]float32)(x)
		s0 += float64(v[0] * v[0])
		s1 += float64(v[1] * v[1])
		s2 += float64(v[2] * v[2])
		s3 += float64(v[3] * v[3])
		x = x[4:]
	}
	for _, v := range x {
		s0 += float64(v * v)
	}
	return (s0 + s1) + (s2 + s3)
}

// MaxF32 returns the largest element of x: −Inf for an empty x, NaN if any
// element is NaN.
func MaxF32(x []float32) float32 {
	m0, m1, m2, m3 := float32(math.Inf(-1)), float32(math.Inf(-1)), float32(math.Inf(-1)), float32(math.Inf(-1))
	for len(x) >= 4 {
		v := (*[4]float32)(x)
		m0 = max(m0, v[0])
		m1 = max(m1, v[1])
		m2 = max(m2, v[2])
		m3 = max(m3, v[3])
		x = x[4:]
	}
	for _, v := range x {
		m0 = max(m0, v)
	}
	return max(max(m0, m1), max(m2, m3))
}

// ExpSum sets dst[i] = e^(x[i]−shift) and returns the float32 sum of the
// results: the exponentiation step of a softmax, with shift the maximum of
// x. The exponentials are those of [Exp32], except that the assembly
// variants evaluate it with fused multiply-adds and may differ from it in
// the last place. dst may be x.
func ExpSum(dst, x []float32, shift float32) float32 {
	if len(x) != len(dst) {
		fillNaN(dst)
		return nan32()
	}
	return active.expSum(dst, x, shift)
}

func expSumGo(dst, x []float32, shift float32) float32 {
	dst = dst[:len(x)]
	var s0, s1, s2, s3 float32
	for len(x) >= 4 {
		d, v := (*[4]float32)(dst), (*[4]float32)(x)
		e0, e1, e2, e3 := Exp32(v[0]-shift), Exp32(v[1]-shift), Exp32(v[2]-shift), Exp32(v[3]-shift)
		d[0], d[1], d[2], d[3] = e0, e1, e2, e3
		s0 += e0
		s1 += e1
		s2 += e2
		s3 += e3
		dst, x = dst[4:], x[4:]
	}
	for i, v := range x {
		e := Exp32(v - shift)
		dst[i] = e
		s0 += e
	}
	return (s0 + s1) + (s2 + s3)
}

// Softmax replaces x by its softmax, e^(x[i]−max)/Σ e^(x[j]−max).
func Softmax(x []float32) {
	if len(x) == 0 {
		return
	}
	s := ExpSum(x, x, MaxF32(x))
	Scale(1/s, x)
}

// Exp32 returns e^x in float32 arithmetic, within one unit in the last
// place of the exact result when that is at least 2⁻¹²⁶; smaller results
// flush to zero and x above 88.72283 gives +Inf. It is several times faster
// than math.Exp on a float64. Exp32(−Inf) = 0 and NaN stays NaN.
func Exp32(x float32) float32 {
	const (
		log2e = 1.44269504088896341
		// ln 2 split so that n·ln2Hi is exact for |n| ≤ 128.
		ln2Hi = 0.693359375
		ln2Lo = -2.12194440e-4
		// Adding 1.5·2²³ rounds a float32 below 2²² to an integer.
		round = 12582912
	)
	switch {
	case x > 88.72283:
		return float32(math.Inf(1))
	case !(x >= -87.33654): // below 2⁻¹²⁶, or NaN
		if x != x {
			return x
		}
		return 0
	}
	// x = n·ln2 + r with |r| ≤ ln2/2, so e^x = 2ⁿ·e^r.
	n := float32(x*log2e+round) - round
	r := float32(x-n*ln2Hi) - n*ln2Lo
	// e^r by its Taylor series to r⁷: the remainder is below 6e-9·e^r.
	p := float32(1.0 / 5040)
	p = p*r + 1.0/720
	p = p*r + 1.0/120
	p = p*r + 1.0/24
	p = p*r + 1.0/6
	p = p*r + 0.5
	p = p*r*r + r + 1
	e := int32(n)
	if e > 127 { // e^x ≥ 2¹²⁷·e^(−ln2/2): scale in two steps
		return p * 2 * math.Float32frombits(uint32(e-1+127)<<23)
	}
	return p * math.Float32frombits(uint32(e+127)<<23)
}

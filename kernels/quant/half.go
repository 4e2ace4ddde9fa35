package quant

import "math"

// F16ToF32 widens an IEEE 754 binary16 value to float32. Every binary16
// value, subnormals included, is exactly representable as a float32, so the
// conversion is exact; a NaN keeps its sign and payload and comes back quiet,
// as in ggml's GGML_FP16_TO_FP32. The function is small and branch-free
// enough for the compiler to inline it into dot-product loops.
func F16ToF32(h uint16) float32 {
	// Placed in a float32's exponent and mantissa fields, the binary16 bits
	// read as the value scaled by 2⁻¹¹²; one exact multiply rescales normals
	// and subnormals alike.
	m := uint32(h&0x7fff) << 13
	bits := math.Float32bits(math.Float32frombits(m) * 0x1p112)
	if m >= 0x7c00<<13 { // Inf or NaN: the exponent must become all ones
		bits = m | 0x7f800000
		if m > 0x7c00<<13 {
			bits |= 0x400000 // quiet
		}
	}
	return math.Float32frombits(bits | uint32(h&0x8000)<<16)
}

// F32ToF16 narrows f to IEEE 754 binary16, rounding to nearest with ties to
// even, as ggml's GGML_FP32_TO_FP16 (and the F16C instruction it mirrors)
// does. Values too large for binary16 become ±Inf, values too small become
// ±0 or a subnormal, and every NaN becomes the quiet NaN 0x7E00 with f's sign.
func F32ToF16(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int(b>>23) & 0xff
	mant := b & 0x7fffff
	if exp == 0xff {
		if mant != 0 {
			return sign | 0x7e00
		}
		return sign | 0x7c00
	}
	e := exp - 127 + 15 // binary16 biased exponent
	switch {
	case e >= 0x1f:
		return sign | 0x7c00
	case e <= 0:
		// The result is a binary16 subnormal (or zero): count units of 2⁻²⁴.
		// Anything below half the smallest subnormal rounds to zero; this
		// also covers float32 zeros and subnormals.
		if e < -10 {
			return sign
		}
		m := mant | 0x800000
		shift := uint(14 - e) // 14..24
		h := m >> shift
		rem := m & (1<<shift - 1)
		halfway := uint32(1) << (shift - 1)
		if rem > halfway || rem == halfway && h&1 == 1 {
			h++ // may carry into the smallest normal, whose encoding is h itself
		}
		return sign | uint16(h)
	}
	h := uint32(e)<<10 | mant>>13
	rem := mant & 0x1fff
	if rem > 0x1000 || rem == 0x1000 && h&1 == 1 {
		h++ // a carry out of the mantissa bumps the exponent, up to Inf
	}
	return sign | uint16(h)
}

// BF16ToF32 widens a bfloat16 value (the top half of a float32) to float32.
// The conversion is exact.
func BF16ToF32(h uint16) float32 {
	return math.Float32frombits(uint32(h) << 16)
}

// F32ToBF16 narrows f to bfloat16 by rounding to nearest with ties to even,
// as ggml's GGML_FP32_TO_BF16 does: finite values too large round to ±Inf,
// and a NaN keeps its sign and top payload bits with the quiet bit forced on,
// so it can never turn into an infinity.
func F32ToBF16(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 {
		return uint16(b>>16) | 0x40
	}
	return uint16((b + 0x7fff + (b>>16)&1) >> 16)
}

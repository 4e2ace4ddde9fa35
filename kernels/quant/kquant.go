package quant

import "math"

// groupMaxEps is ggml's GROUP_MAX_EPS: a group whose largest magnitude is
// below it is treated as all zeros.
const groupMaxEps = 1e-15

// nearestInt rounds to the nearest integer with ties to even, which is what
// ggml's nearest_int (the 1.5·2²³ addition trick) computes.
func nearestInt(f float32) int {
	return int(math.RoundToEven(float64(f)))
}

func sqrt32(f float32) float32 { return float32(math.Sqrt(float64(f))) }

// inv is 1/d, or 0 for a zero d: the inverse scale every quantizer here
// multiplies by, so that an all-zero group encodes as zeros.
func inv(d float32) float32 {
	if d == 0 {
		return 0
	}
	return 1 / d
}

// absMax returns the largest magnitude in x and the value that has it, sign
// kept (the first one on a tie): ggml's amax and max, from which the signed
// quantizers take their scale so that value lands on the extreme level.
func absMax(x []float32) (amax, vmax float32) {
	for _, v := range x {
		if a := abs32(v); a > amax {
			amax, vmax = a, v
		}
	}
	return amax, vmax
}

// requantMin requantizes the group x against its stored scale dj and min dm
// as x ≈ dj·L − dm, L in 0..nmax: the last step of the K-quants with mins
// (Q2_K, Q4_K, Q5_K), so that rounding in the stored scales does not bias
// the levels. A zero scale decodes every value to −dm whatever L holds, so
// the fitted levels are kept.
func requantMin(x []float32, L []uint8, dj, dm float32, nmax int) {
	if dj == 0 {
		return
	}
	for i, v := range x {
		L[i] = uint8(min(max(nearestInt((v+dm)/dj), 0), nmax))
	}
}

// requantSigned requantizes the group x against its stored signed scale dj
// as x ≈ dj·l, l in −nmax..nmax−1, stored in L offset by nmax (Q3_K, Q6_K).
func requantSigned[T int8 | uint8](x []float32, L []T, dj float32, nmax int) {
	if dj == 0 {
		return
	}
	for i, v := range x {
		L[i] = T(min(max(nearestInt(v/dj), -nmax), nmax-1) + nmax)
	}
}

// makeQKX2 is ggml's make_qkx2_quants: it quantizes the group x to levels
// 0..nmax as x ≈ scale·L − theMin, choosing scale and min by weighted least
// squares over nstep+1 candidate level spacings around nmax/(max−min)
// (offsets rmin + rdelta·is) and keeping the one with the smallest weighted
// squared error (weighted absolute error with mad, as Q2_K asks). The min
// is never positive, so theMin ≥ 0. L and Laux must be as long as x; Laux
// is scratch.
func makeQKX2(nmax int, x, w []float32, L, Laux []uint8, rmin, rdelta float32, nstep int, mad bool) (scale, theMin float32) {
	cost := func(d float32) float32 {
		if mad {
			return abs32(d)
		}
		return d * d
	}
	n := len(x)
	w, L, Laux = w[:n], L[:n], Laux[:n]
	lo, hi := x[0], x[0]
	sumW := w[0]
	sumX := sumW * x[0]
	for i := 1; i < n; i++ {
		lo = min(lo, x[i])
		hi = max(hi, x[i])
		sumW += w[i]
		sumX += w[i] * x[i]
	}
	lo = min(lo, 0)
	if hi == lo {
		clear(L)
		return 0, -lo
	}
	fmax := float32(nmax)
	iscale := fmax / (hi - lo)
	scale = 1 / iscale
	var best float32
	for i, v := range x {
		l := min(max(nearestInt(iscale*(v-lo)), 0), nmax)
		L[i] = uint8(l)
		best += w[i] * cost(scale*float32(l)+lo-v)
	}
	for is := 0; is <= nstep; is++ {
		iscale = (rmin + rdelta*float32(is) + fmax) / (hi - lo)
		var sumL, sumL2, sumXL float32
		for i, v := range x {
			l := min(max(nearestInt(iscale*(v-lo)), 0), nmax)
			Laux[i] = uint8(l)
			fl := float32(l)
			sumL += w[i] * fl
			sumL2 += w[i] * fl * fl
			sumXL += w[i] * fl * v
		}
		det := sumW*sumL2 - sumL*sumL
		if det <= 0 {
			continue
		}
		thisScale := (sumW*sumXL - sumX*sumL) / det
		thisMin := (sumL2*sumX - sumL*sumXL) / det
		if thisMin > 0 {
			// A positive offset cannot be stored (mins are subtracted), so
			// refit the scale alone with the offset pinned at zero.
			thisMin = 0
			thisScale = sumXL / sumL2
		}
		var cur float32
		for i, v := range x {
			cur += w[i] * cost(thisScale*float32(Laux[i])+thisMin-v)
		}
		if cur < best {
			copy(L, Laux)
			best = cur
			scale, lo = thisScale, thisMin
		}
	}
	return scale, -lo
}

// makeQX is ggml's make_qx_quants with rmse_type 1 and no importance
// weights: it quantizes the group x to signed levels −nmax..nmax−1 (stored
// in L offset by nmax) as x ≈ scale·l, trying 19 level spacings around
// nmax/max(|x|) and keeping the one that maximises the x²-weighted fit
// (Σwxl)²/Σwl². The returned scale is usually negative: the value of
// largest magnitude is mapped to −nmax, whose magnitude has no positive twin.
func makeQX(nmax int, x []float32, L []uint8) float32 {
	L = L[:len(x)]
	amax, vmax := absMax(x)
	if amax < groupMaxEps {
		clear(L)
		return 0
	}
	fmax := float32(nmax)
	level := func(iscale, v float32) int {
		return min(max(nearestInt(iscale*v), -nmax), nmax-1)
	}
	fit := func(iscale float32) (sumLX, sumL2 float32) {
		for _, v := range x {
			fl := float32(level(iscale, v))
			w := v * v
			sumLX += w * v * fl
			sumL2 += w * fl * fl
		}
		return sumLX, sumL2
	}
	setL := func(iscale float32) {
		for i, v := range x {
			L[i] = uint8(level(iscale, v) + nmax)
		}
	}

	iscale := -fmax / vmax
	setL(iscale)
	sumLX, sumL2 := fit(iscale)
	var scale float32
	if sumL2 != 0 {
		scale = sumLX / sumL2
	}
	best := scale * sumLX
	for is := -9; is <= 9; is++ {
		if is == 0 {
			continue
		}
		iscale = -(fmax + 0.1*float32(is)) / vmax
		sumLX, sumL2 = fit(iscale)
		// Compare (Σwxl)²/Σwl² against the best without dividing.
		if sumL2 > 0 && sumLX*sumLX > best*sumL2 {
			setL(iscale)
			scale = sumLX / sumL2
			best = scale * sumLX
		}
	}
	return scale
}

// fitK4 is the first half of Q4_K's and Q5_K's quantizers
// (quantize_row_q4_K_ref, quantize_row_q5_K_ref): it fits a scale and min
// to each 32-value sub-block of x by makeQKX2 with levels 0..nmax, weighting
// each value by the sub-block's RMS plus its magnitude, leaves the levels in
// L and returns the fits with their largest scale and min.
func fitK4(x *[qkK]float32, nmax int, rmin float32, nstep int, L *[qkK]uint8) (scales, mins [8]float32, maxScale, maxM float32) {
	var (
		Laux [32]uint8
		w    [32]float32
	)
	for j := range 8 {
		xs := x[32*j : 32*j+32]
		var sumX2 float32
		for _, v := range xs {
			sumX2 += v * v
		}
		av := sqrt32(sumX2 / 32)
		for l, v := range xs {
			w[l] = av + abs32(v)
		}
		scales[j], mins[j] = makeQKX2(nmax, xs, w[:], L[32*j:32*j+32], Laux[:], rmin, 0.1, nstep, false)
		maxScale = max(maxScale, scales[j])
		maxM = max(maxM, mins[j])
	}
	return scales, mins, maxScale, maxM
}

// putScalesK4 stores the 6-bit sub-block scales ls and mins lm of a Q4_K or
// Q5_K block in s (zeroing it first) with the super-block scales d and dmin
// at b[0:4] (maxScale/63, maxM/63), then requantizes the levels L (0..nmax)
// against the scales as stored.
func putScalesK4(x *[qkK]float32, L *[qkK]uint8, ls, lm *[8]uint8, maxScale, maxM float32, b []byte, s *[12]byte, nmax int) {
	clear(s[:])
	packScalesK4(ls, lm, s)
	putF16(b, 0, maxScale/63)
	putF16(b, 2, maxM/63)
	d, dmin := f16At(b, 0), f16At(b, 2)
	for j := range 8 {
		sc, m := scaleMinK4(j, s)
		requantMin(x[32*j:32*j+32], L[32*j:32*j+32], d*float32(sc), dmin*float32(m), nmax)
	}
}

// quantQ4K follows ggml's quantize_row_q4_K_ref: fit a scale and min to each
// 32-value sub-block, quantize those to 6 bits against the super-block's
// largest ones, then requantize the values against the scales actually
// stored, so rounding in the scales does not bias the result.
func quantQ4K(x *[qkK]float32, b *[q4KSz]byte) {
	var L [qkK]uint8
	scales, mins, maxScale, maxM := fitK4(x, 15, -1, 20, &L)
	invScale, invMin := inv63(maxScale), inv63(maxM)
	var ls, lm [8]uint8
	for j := range 8 {
		ls[j] = uint8(min(max(nearestInt(invScale*scales[j]), 0), 63))
		lm[j] = uint8(min(max(nearestInt(invMin*mins[j]), 0), 63))
	}
	putScalesK4(x, &L, &ls, &lm, maxScale, maxM, b[:], (*[12]byte)(b[4:16]), 15)
	for c := range 4 {
		for l := range 32 {
			b[16+32*c+l] = L[64*c+l] | L[64*c+l+32]<<4
		}
	}
}

// inv63 is 63/m for a positive m, else 0: the factor that maps the largest
// sub-block scale or min of a Q4_K or Q5_K block to the 6-bit level 63.
func inv63(m float32) float32 {
	if m > 0 {
		return 63 / m
	}
	return 0
}

// quantQ6K follows ggml's quantize_row_q6_K_ref: fit a signed scale to each
// 16-value sub-block, quantize the scales to int8 against the largest, and
// requantize the values against the stored scales.
func quantQ6K(x *[qkK]float32, b *[q6KSz]byte) {
	var (
		L      [qkK]uint8
		scales [16]float32
	)
	for ib := range 16 {
		scales[ib] = makeQX(32, x[16*ib:16*ib+16], L[16*ib:16*ib+16])
	}
	maxA, maxScale := absMax(scales[:])
	if maxA < groupMaxEps {
		clear(b[:])
		return
	}
	iscale := -128 / maxScale
	putF16(b[:], 208, 1/iscale)
	for ib, s := range scales {
		b[192+ib] = byte(int8(min(max(nearestInt(iscale*s), -128), 127)))
	}
	d := f16At(b[:], 208)
	for j := range 16 {
		requantSigned(x[16*j:16*j+16], L[16*j:16*j+16], d*float32(int8(b[192+j])), 32)
	}
	for h := range 2 {
		Lh := (*[128]uint8)(L[128*h:])
		ql := (*[64]byte)(b[64*h:])
		qh := (*[32]byte)(b[128+32*h:])
		for l := range 32 {
			ql[l] = Lh[l]&0xf | Lh[l+64]<<4
			ql[l+32] = Lh[l+32]&0xf | Lh[l+96]<<4
			qh[l] = Lh[l]>>4 | Lh[l+32]>>4<<2 | Lh[l+64]>>4<<4 | Lh[l+96]>>4<<6
		}
	}
}

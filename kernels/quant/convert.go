package quant

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// Byte layouts of the block types, as ggml-common.h declares them. All
// multi-byte fields are little-endian; d and dmin are binary16.
//
//	Q8_0 (32 values, 34 bytes): d, qs[32] int8            x = d·q
//	Q4_0 (32 values, 18 bytes): d, qs[16] nibbles         x = d·(q−8)
//	    value j is the low nibble of qs[j], value 16+j the high one.
//	Q4_K (256 values, 144 bytes): d, dmin, scales[12], qs[128]
//	    eight 32-value sub-blocks with 6-bit scale sc and min m (see
//	    scaleMinK4); x = d·sc·q − dmin·m. Each 64-value chunk c uses
//	    qs[32c:32c+32]: low nibbles for its first 32 values, high for the rest.
//	Q6_K (256 values, 210 bytes): ql[128], qh[64], scales[16] int8, d
//	    sixteen 16-value sub-blocks, x = d·scale·(q−32) with 6-bit q; see
//	    dequantQ6K for where each value's bits live.
const (
	qk    = 32  // values per Q8_0 / Q4_0 block
	qkK   = 256 // values per K-quant super-block
	q80Sz = 34
	q40Sz = 18
	q4KSz = 144
	q6KSz = 210
)

// ErrUnsupportedType reports a type that this package cannot convert or
// compute with (see [Type.Supported]).
var ErrUnsupportedType = errors.New("unsupported tensor type")

// ErrLength reports buffers whose lengths do not describe the same number of
// elements of a type.
var ErrLength = errors.New("length mismatch")

// checkRow verifies that n float32 values and nbytes stored bytes describe
// the same row of type t. what names the float32 side for the message.
func checkRow(t Type, n, nbytes int, what string) error {
	if !t.Supported() {
		return fmt.Errorf("quant: %w %s", ErrUnsupportedType, t)
	}
	bs := t.BlockSize()
	if n%bs != 0 {
		return fmt.Errorf("quant: %w: %s has %d elements, not a multiple of the %d-element %s block",
			ErrLength, what, n, bs, t)
	}
	want := n / bs * t.BlockBytes()
	if nbytes != want {
		return fmt.Errorf("quant: %w: %d %s elements take %d bytes, but the byte buffer has %d",
			ErrLength, n, t, want, nbytes)
	}
	return nil
}

func f16At(b []byte, off int) float32 {
	return F16ToF32(binary.LittleEndian.Uint16(b[off:]))
}

func putF16(b []byte, off int, f float32) {
	binary.LittleEndian.PutUint16(b[off:], F32ToF16(f))
}

// Dequantize decodes len(dst) elements of type t from src into dst. len(dst)
// must be a multiple of t's block size and len(src) must be exactly the
// row's size (see [RowBytes]); otherwise the error wraps [ErrLength], and an
// unsupported type gives [ErrUnsupportedType]. The arithmetic matches ggml's
// dequantize_row_* functions.
func Dequantize(t Type, src []byte, dst []float32) error {
	if err := checkRow(t, len(dst), len(src), "dst"); err != nil {
		return err
	}
	switch t {
	case F32:
		for i := range dst {
			dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
		}
	case F16:
		for i := range dst {
			dst[i] = F16ToF32(binary.LittleEndian.Uint16(src[2*i:]))
		}
	case BF16:
		for i := range dst {
			dst[i] = BF16ToF32(binary.LittleEndian.Uint16(src[2*i:]))
		}
	case Q8_0:
		for ; len(dst) > 0; src, dst = src[q80Sz:], dst[qk:] {
			dequantQ80((*[q80Sz]byte)(src), (*[qk]float32)(dst))
		}
	case Q4_0:
		for ; len(dst) > 0; src, dst = src[q40Sz:], dst[qk:] {
			dequantQ40((*[q40Sz]byte)(src), (*[qk]float32)(dst))
		}
	case Q4_K:
		for ; len(dst) > 0; src, dst = src[q4KSz:], dst[qkK:] {
			dequantQ4K((*[q4KSz]byte)(src), (*[qkK]float32)(dst))
		}
	case Q6_K:
		for ; len(dst) > 0; src, dst = src[q6KSz:], dst[qkK:] {
			dequantQ6K((*[q6KSz]byte)(src), (*[qkK]float32)(dst))
		}
	case Q2_K, Q3_K, Q5_K, IQ4_XS:
		dequantKQ2(t, src, dst)
	case Q4_1, Q5_0, Q5_1, IQ4_NL:
		dequantLegacy(t, src, dst)
	}
	return nil
}

// Quantize encodes src as len(src) elements of type t into dst, with the
// same length rules and errors as [Dequantize]. F16 and BF16 round to
// nearest even; the block types follow ggml's reference quantizers
// (quantize_row_*_ref): Q8_0, Q4_0, Q4_1, Q5_0 and Q5_1 reproduce them bit
// for bit, IQ4_NL reproduces quantize_iq4_nl without an importance matrix
// (what llama-quantize writes) bit for bit, and Q4_K and Q6_K run the same
// scale searches in the same float32 arithmetic (they
// matched ggml byte for byte on the test data, though only a valid encoding
// of comparable error is promised). The block types need finite input: a
// NaN or infinity in src is reported as an error rather than encoded as
// garbage. As in ggml, block scales are stored as binary16, so a block whose
// values are too large for that (beyond about 8.3e6 for Q8_0) gets an
// infinite scale.
func Quantize(t Type, src []float32, dst []byte) error {
	if err := checkRow(t, len(src), len(dst), "src"); err != nil {
		return err
	}
	switch t {
	case F32:
		for i, v := range src {
			binary.LittleEndian.PutUint32(dst[4*i:], math.Float32bits(v))
		}
		return nil
	case F16:
		for i, v := range src {
			binary.LittleEndian.PutUint16(dst[2*i:], F32ToF16(v))
		}
		return nil
	case BF16:
		for i, v := range src {
			binary.LittleEndian.PutUint16(dst[2*i:], F32ToBF16(v))
		}
		return nil
	}
	for i, v := range src {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			return fmt.Errorf("quant: cannot quantize src[%d] = %v to %s: not a finite number", i, v, t)
		}
	}
	switch t {
	case Q8_0:
		for ; len(src) > 0; src, dst = src[qk:], dst[q80Sz:] {
			quantQ80((*[qk]float32)(src), (*[q80Sz]byte)(dst))
		}
	case Q4_0:
		for ; len(src) > 0; src, dst = src[qk:], dst[q40Sz:] {
			quantQ40((*[qk]float32)(src), (*[q40Sz]byte)(dst))
		}
	case Q4_K:
		for ; len(src) > 0; src, dst = src[qkK:], dst[q4KSz:] {
			quantQ4K((*[qkK]float32)(src), (*[q4KSz]byte)(dst))
		}
	case Q6_K:
		for ; len(src) > 0; src, dst = src[qkK:], dst[q6KSz:] {
			quantQ6K((*[qkK]float32)(src), (*[q6KSz]byte)(dst))
		}
	case Q2_K, Q3_K, Q5_K, IQ4_XS:
		quantKQ2(t, src, dst)
	case Q4_1, Q5_0, Q5_1, IQ4_NL:
		quantLegacy(t, src, dst)
	}
	return nil
}

func dequantQ80(b *[q80Sz]byte, y *[qk]float32) {
	d := f16At(b[:], 0)
	for j := range qk {
		y[j] = float32(int8(b[2+j])) * d
	}
}

func quantQ80(x *[qk]float32, b *[q80Sz]byte) {
	var amax float32
	for _, v := range x {
		amax = max(amax, abs32(v))
	}
	d := amax / 127
	id := inv(d)
	putF16(b[:], 0, d)
	for j, v := range x {
		// roundf: halves away from zero. The explicit conversion keeps the
		// product rounded to float32, as in C.
		b[2+j] = byte(int8(math.Round(float64(float32(v * id)))))
	}
}

func dequantQ40(b *[q40Sz]byte, y *[qk]float32) {
	d := f16At(b[:], 0)
	for j := range qk / 2 {
		q := b[2+j]
		y[j] = float32(int(q&0xf)-8) * d
		y[j+qk/2] = float32(int(q>>4)-8) * d
	}
}

func quantQ40(x *[qk]float32, b *[q40Sz]byte) {
	// The scale comes from the value of largest magnitude, sign included, so
	// that value lands exactly on −8 and the range is used asymmetrically.
	id := putSignedScale(x, b[:], 8)
	for j := range qk / 2 {
		// x·id lies in [−8, 8]; adding 8.5 and truncating rounds it into
		// 0..16, and 16 is clamped to 15 like ggml's MIN(15, ·).
		q0 := min(15, int(float32(x[j]*id)+8.5))
		q1 := min(15, int(float32(x[j+qk/2]*id)+8.5))
		b[2+j] = byte(q0) | byte(q1)<<4
	}
}

// scaleMinK4 unpacks the 6-bit scale and min of Q4_K sub-block j (0..7) from
// the 12 packed bytes: sub-blocks 0–3 keep them in the low 6 bits of bytes
// j and j+4; sub-blocks 4–7 keep their low 4 bits in the nibbles of byte j+4
// and their top 2 bits in the spare top bits of bytes j−4 and j.
func scaleMinK4(j int, s *[12]byte) (sc, m uint8) {
	if j < 4 {
		return s[j] & 63, s[j+4] & 63
	}
	return s[j+4]&0xf | (s[j-4]>>6)<<4, s[j+4]>>4 | (s[j]>>6)<<4
}

func dequantQ4K(b *[q4KSz]byte, y *[qkK]float32) {
	d := f16At(b[:], 0)
	dmin := f16At(b[:], 2)
	scales := (*[12]byte)(b[4:16])
	for c := range 4 {
		sc1, m1 := scaleMinK4(2*c, scales)
		sc2, m2 := scaleMinK4(2*c+1, scales)
		d1, o1 := d*float32(sc1), dmin*float32(m1)
		d2, o2 := d*float32(sc2), dmin*float32(m2)
		qs := (*[32]byte)(b[16+32*c:])
		out := (*[64]float32)(y[64*c:])
		for l, q := range qs {
			out[l] = d1*float32(q&0xf) - o1
			out[l+32] = d2*float32(q>>4) - o2
		}
	}
}

// dequantQ6K decodes one Q6_K block. Each 128-value half h keeps its low
// nibbles in ql[64h:64h+64] and its high bit pairs in qh[32h:32h+32]: for l
// in 0..31, values l, l+32, l+64 and l+96 of the half take the low nibble of
// ql[l], the low nibble of ql[l+32], the high nibble of ql[l] and the high
// nibble of ql[l+32], with bit pairs 0–1, 2–3, 4–5 and 6–7 of qh[l] on top.
// Sub-block s (16 values) uses the signed scale scales[s].
func dequantQ6K(b *[q6KSz]byte, y *[qkK]float32) {
	d := f16At(b[:], 208)
	for h := range 2 {
		ql := (*[64]byte)(b[64*h:])
		qh := (*[32]byte)(b[128+32*h:])
		sc := (*[8]byte)(b[192+8*h:])
		out := (*[128]float32)(y[128*h:])
		for l := range 32 {
			g := l / 16
			q1 := int(ql[l]&0xf|(qh[l]&3)<<4) - 32
			q2 := int(ql[l+32]&0xf|(qh[l]>>2&3)<<4) - 32
			q3 := int(ql[l]>>4|(qh[l]>>4&3)<<4) - 32
			q4 := int(ql[l+32]>>4|(qh[l]>>6)<<4) - 32
			out[l] = d * float32(int8(sc[g])) * float32(q1)
			out[l+32] = d * float32(int8(sc[g+2])) * float32(q2)
			out[l+64] = d * float32(int8(sc[g+4])) * float32(q3)
			out[l+96] = d * float32(int8(sc[g+6])) * float32(q4)
		}
	}
}

func abs32(f float32) float32 {
	return math.Float32frombits(math.Float32bits(f) &^ (1 << 31))
}

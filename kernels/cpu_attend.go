package kernels

import (
	"encoding/binary"
	"math"
	"unsafe"

	"github.com/baton-serving/baton/kernels/quant"
	"github.com/baton-serving/baton/kernels/vec"
)

// Attention of one query head over a sequence's cached positions, on the
// vector kernels of kernels/vec: a dot product per position, the
// exponentials of the softmax, and a weighted sum of value rows.
//
// F32 pages feed the same float32 rows to the same operations in the same
// order whatever the page size and whether a row is read in place or
// copied, so a sequence's results do not depend on how its cache is paged;
// F16 pages are widened exactly first. Each (token, head) is computed on
// its own, so the result does not depend on the batch or on how the heads
// are split across threads.

// attnScratch is one participant's scratch space for attention: scores
// over the context, and five rows of the head dimension (one key, four
// values) into which F16 (or misaligned F32) rows are widened. Reused
// across calls, so that attention allocates nothing: widening buffers made
// per call cost a fifth of a small model's decode step in allocation and
// zeroing.
type attnScratch struct {
	scores []float32
	rows   []float32
}

// size makes room for n positions and head dimension d.
func (a *attnScratch) size(n, d int) {
	a.scores = growF32(a.scores, n)
	a.rows = growF32(a.rows, 5*d)
}

// attnOpts are AttnOptions resolved for one call: the score scale
// (1/√HeadDim by default) and the soft-cap (0: off) that each score goes
// through, and the window (0: none).
type attnOpts struct {
	scale, softCap float32
	window         int
}

func newAttnOpts(o AttnOptions, headDim int) attnOpts {
	a := attnOpts{scale: o.Scale, softCap: o.SoftCap, window: o.Window}
	if a.scale == 0 {
		a.scale = float32(1 / math.Sqrt(float64(headDim)))
	}
	return a
}

// posSpan is the positions lo…n-1 a head attends to, counted from the
// start of its first page list entry, which is position align (mod 4) of
// its sequence. Positions are scored and summed in groups of four that
// start at multiples of four of the sequence, so a position's group (and
// so its score's and its value's rounding) depends only on the row's
// length and window, never on the paging.
type posSpan struct {
	lo, n, align int
}

// attendRows computes out = softmax(cap(scale·q·kᵀ))·v over the positions
// of span, where dot4(dst, t) sets dst to q·k for positions t…t+3
// (vec.Dot4F32 on the key rows), or, when dot4 is nil, dot(t) returns q·k
// for position t, as it does for the positions outside whole groups of
// four; add4(out, e, t) adds e[0]·v(t) + … + e[3]·v(t+3) to out
// (vec.Axpy4 or vec.Axpy4F16 on the value rows), and val(t) returns the
// value row of position t as d float32 values, for the positions outside
// whole groups. scores is scratch space of at least n-lo elements.
func attendRows(out, q []float32, span posSpan, scores []float32, dot func(t int) float32,
	dot4 func(dst *[4]float32, t int), add4 func(out []float32, e *[4]float32, t int), val func(t int) []float32, o *attnOpts) {
	d := len(q)
	out = out[:d]
	lo, n := span.lo, span.n
	scores = scores[:n-lo]
	// g is the first position of a group; those before it (at most
	// three, and none without a window) go one at a time.
	g := min(n, lo+(4-(lo+span.align)%4)%4)
	t := lo
	if dot4 != nil {
		for ; t < g; t++ {
			scores[t-lo] = dot(t)
		}
		for ; t+4 <= n; t += 4 {
			dot4((*[4]float32)(scores[t-lo:t-lo+4]), t)
		}
	}
	for ; t < n; t++ {
		scores[t-lo] = dot(t)
	}
	for t := range scores {
		scores[t] *= o.scale
	}
	if o.softCap > 0 {
		SoftCap(scores, o.softCap)
	}
	sum := vec.ExpSum(scores, scores, vec.MaxF32(scores))
	clear(out)
	// Four value rows per pass over out: a quarter of the loads and
	// stores of out that one row at a time takes.
	for t = lo; t < g; t++ {
		vec.Axpy(scores[t-lo], val(t), out)
	}
	for ; t+4 <= n; t += 4 {
		add4(out, (*[4]float32)(scores[t-lo:t-lo+4]), t)
	}
	for ; t < n; t++ {
		vec.Axpy(scores[t-lo], val(t), out)
	}
	vec.Scale(1/sum, out)
}

// attendPaged is one head's attention over a paged cache: kPages[i] and
// vPages[i] hold positions i·pageSize… as rows of stride elements of typ
// (F32 or F16, little-endian), this head's elements starting off elements
// into each row; it attends to the positions of span.
func attendPaged(out, q []float32, kPages, vPages [][]byte, span posSpan, pageSize, stride, off int, typ quant.Type, sc *attnScratch, o *attnOpts) {
	d := len(q)
	es := 4
	if typ == quant.F16 {
		es = 2
	} else if typ != quant.F32 {
		for i := range out[:d] {
			out[i] = float32(math.NaN())
		}
		return
	}
	row := func(pages [][]byte, t int) []byte {
		start := ((t%pageSize)*stride + off) * es
		return pages[t/pageSize][start : start+d*es]
	}
	// Rows that cannot be read in place are widened into these: one key
	// row, and one value row for each of the four that attendRows takes
	// at a time.
	sc.size(span.n-span.lo, d)
	kbuf := sc.rows[:d]
	vbuf := [4][]float32{sc.rows[d : 2*d], sc.rows[2*d : 3*d], sc.rows[3*d : 4*d], sc.rows[4*d : 5*d]}
	inPlace := typ == quant.F32 && nativeLE()
	widen := func(dst []float32, b []byte) []float32 {
		if inPlace && uintptr(unsafe.Pointer(&b[0]))%4 == 0 {
			return unsafe.Slice((*float32)(unsafe.Pointer(&b[0])), d)
		}
		if typ == quant.F32 {
			for i := range dst {
				dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
			}
			return dst
		}
		for i := range dst {
			dst[i] = quant.F16ToF32(binary.LittleEndian.Uint16(b[2*i:]))
		}
		return dst
	}
	dot := func(t int) float32 { return vec.DotF32(q, widen(kbuf, row(kPages, t))) }
	// Four keys at a time, as the contiguous cache scores them: in place
	// when the four rows share a page and can be read as float32s, else
	// widened side by side into scratch space (the value rows' scratch,
	// which is free until every score is done).
	kRows := sc.rows[d : 5*d]
	dot4 := func(dst *[4]float32, t int) {
		if inPlace && pageSize%4 == 0 {
			b := kPages[t/pageSize][((t%pageSize)*stride+off)*es:]
			if uintptr(unsafe.Pointer(&b[0]))%4 == 0 {
				vec.Dot4F32(dst, unsafe.Slice((*float32)(unsafe.Pointer(&b[0])), 3*stride+d), stride, q)
				return
			}
		}
		for i := range 4 {
			r := kRows[i*d : (i+1)*d]
			copy(r, widen(r, row(kPages, t+i))) // widen may return the row in place
		}
		vec.Dot4F32(dst, kRows, d, q)
	}
	if typ == quant.F16 {
		// Keys are read once each: the SIMD kernels convert them in
		// registers instead of widening them into memory first, four at a
		// time where the four share a page.
		dot = func(t int) float32 { return vec.DotF16(row(kPages, t), q) }
		dot4 = nil
		if pageSize%4 == 0 {
			dot4 = func(dst *[4]float32, t int) {
				start := ((t%pageSize)*stride + off) * es
				vec.Dot4F16(dst, kPages[t/pageSize][start:start+(3*stride+d)*es], stride, q)
			}
		}
	}
	val := func(t int) []float32 { return widen(vbuf[t%4], row(vPages, t)) }
	add4 := func(out []float32, e *[4]float32, t int) {
		vec.Axpy4(out, e, val(t), val(t+1), val(t+2), val(t+3))
	}
	if typ == quant.F16 {
		// Value rows too are read once each, and widened in registers.
		add4 = func(out []float32, e *[4]float32, t int) {
			vec.Axpy4F16(out, e, row(vPages, t), row(vPages, t+1), row(vPages, t+2), row(vPages, t+3))
		}
	}
	attendRows(out, q, span, sc.scores, dot, dot4, add4, val, o)
}

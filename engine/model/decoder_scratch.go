package model

import (
	"errors"
	"fmt"

	"github.com/baton-serving/baton/kernels"
)

// scratch is the scratch space of one forward call: buffers on the
// backend sized for its token rows, and the host-side tables that drive
// them. States are reused through m.free, so that the steady state
// allocates nothing on the backend.
type scratch struct {
	rowsCap, outCap int // token rows and output rows (final norm) the buffers hold
	headCap         int // logits rows the output head writes at once

	x, xb          kernels.Buffer // residual stream and normalized input, rows×Dim
	q, att         kernels.Buffer // queries and attention output, rows×QDim
	k, v           kernels.Buffer // new keys and values, rows×KVDim
	gate, up       kernels.Buffer // feed-forward activations, rows×Hidden
	cos, sin       kernels.Buffer // RoPE tables, rows×RopeDim/2
	normed, logits kernels.Buffer // final norm of the output rows, and the logits of a group of them

	lcos, lsin kernels.Buffer // local layers' RoPE tables (Config.RopeBaseLocal), else nil

	hostCos, hostSin []float32
	ids, slots       []int32
	attnRows         []kernels.AttnRow // of every row, then of the active rows
	pages            []int32           // the block tables of ForwardBatch's chunks
	prods            [3]kernels.Product

	hostLCos, hostLSin []float32 // local layers' RoPE tables, with Config.RopeBaseLocal

	rows    []rowInfo // every token row of the step
	act     []rowInfo // the rows going through the current block
	outRows []int     // rows whose next-token logits are wanted
	outs    []outRow  // the same rows: their segment and token
	segs    []segment
	hostRow []float32 // one row of logits for Chunk.RowLogits
}

func grow[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}

// state takes scratch space from the model's free list.
func (m *decoder) state() *scratch {
	m.free.Lock()
	defer m.free.Unlock()
	if k := len(m.free.states); k > 0 {
		s := m.free.states[k-1]
		m.free.states = m.free.states[:k-1]
		return s
	}
	return &scratch{}
}

// putState gives scratch space back; Close frees it.
func (m *decoder) putState(s *scratch) {
	for i := range s.segs {
		s.segs[i] = segment{} // drop the references to the caller's slices and funcs
	}
	m.free.Lock()
	defer m.free.Unlock()
	m.free.states = append(m.free.states, s)
}

// bufs lists the state's backend buffers.
func (s *scratch) bufs() []*kernels.Buffer {
	return []*kernels.Buffer{&s.x, &s.xb, &s.q, &s.att, &s.k, &s.v, &s.gate, &s.up, &s.cos, &s.sin, &s.normed, &s.logits, &s.lcos, &s.lsin}
}

// release frees the state's buffers.
func (s *scratch) release(be kernels.Backend) error {
	var errs []error
	for _, b := range s.bufs() {
		if *b != nil {
			errs = append(errs, be.Free(*b))
			*b = nil
		}
	}
	s.rowsCap, s.outCap, s.headCap = 0, 0, 0
	return errors.Join(errs...)
}

// size makes room for n token rows, nOut of them producing logits, nHead
// of them at once. The buffers grow to the next power of two, so that a
// server's mix of prompt lengths settles on a few sizes.
func (s *scratch) size(be kernels.Backend, c Config, n, nOut, nHead int) error {
	s.hostCos = grow(s.hostCos, n*c.RopeDim/2)
	s.hostSin = grow(s.hostSin, n*c.RopeDim/2)
	if c.RopeBaseLocal != 0 {
		s.hostLCos = grow(s.hostLCos, n*c.RopeDim/2)
		s.hostLSin = grow(s.hostLSin, n*c.RopeDim/2)
	}
	s.ids = grow(s.ids, n)
	s.slots = grow(s.slots, n)
	s.attnRows = grow(s.attnRows, n)
	if n <= s.rowsCap && nOut <= s.outCap && nHead <= s.headCap {
		return nil
	}
	if err := s.release(be); err != nil {
		return err
	}
	rows, outs, heads := 1, 1, 1
	for rows < n {
		rows *= 2
	}
	for outs < nOut {
		outs *= 2
	}
	for heads < nHead {
		heads *= 2
	}
	type alloc struct {
		b *kernels.Buffer
		n int
	}
	allocs := []alloc{
		{&s.x, rows * c.Dim}, {&s.xb, rows * c.Dim}, {&s.q, rows * c.QDim()}, {&s.att, rows * c.QDim()},
		{&s.k, rows * c.KVDim()}, {&s.v, rows * c.KVDim()}, {&s.gate, rows * c.Hidden}, {&s.up, rows * c.Hidden},
		{&s.cos, rows * c.RopeDim / 2}, {&s.sin, rows * c.RopeDim / 2}, {&s.normed, outs * c.Dim}, {&s.logits, heads * c.Vocab},
	}
	if c.RopeBaseLocal != 0 {
		allocs = append(allocs, alloc{&s.lcos, rows * c.RopeDim / 2}, alloc{&s.lsin, rows * c.RopeDim / 2})
	}
	for _, a := range allocs {
		var err error
		if *a.b, err = be.Alloc(a.n); err != nil {
			return errors.Join(fmt.Errorf("model: scratch space for %d tokens on %s: %w", n, be.Name(), err), s.release(be))
		}
	}
	s.rowsCap, s.outCap, s.headCap = rows, outs, heads
	return nil
}

package model

import (
	"errors"
	"fmt"

	"github.com/baton-serving/baton/kernels"
)

// upload loads the weight matrices and the norms and biases onto the
// backend. On an error, release frees what it loaded.
func (m *llama) upload() error {
	mat := func(w *matrix) error {
		var err error
		if w.mat, err = m.be.LoadMatrix(w.typ, w.rows, w.cols, w.data); err != nil {
			return fmt.Errorf("model: tensor %s on %s: %w", w.name, m.be.Name(), err)
		}
		return nil
	}
	vector := func(dst *kernels.Buffer, v []float32) error {
		if v == nil {
			return nil
		}
		var err error
		if *dst, err = kernels.Upload(m.be, v); err != nil {
			return fmt.Errorf("model: a norm or bias vector on %s: %w", m.be.Name(), err)
		}
		return nil
	}
	if err := mat(&m.tokEmbd); err != nil {
		return err
	}
	if m.cfg.TiedOutput {
		m.output.mat = m.tokEmbd.mat
	} else if err := mat(&m.output); err != nil {
		return err
	}
	if err := vector(&m.outNrmB, m.outNorm); err != nil {
		return err
	}
	for i := range m.layers {
		l := &m.layers[i]
		for _, w := range []*matrix{&l.wq, &l.wk, &l.wv, &l.wo, &l.ffnGate, &l.ffnUp, &l.ffnDwn} {
			if err := mat(w); err != nil {
				return err
			}
		}
		for _, v := range []struct {
			dst *kernels.Buffer
			src []float32
		}{{&l.attnNormB, l.attnNorm}, {&l.ffnNormB, l.ffnNorm}, {&l.bqB, l.bq}, {&l.bkB, l.bk}, {&l.bvB, l.bv}, {&l.boB, l.bo}} {
			if err := vector(v.dst, v.src); err != nil {
				return err
			}
		}
	}
	return nil
}

// release frees everything the model holds on its backend, and the
// backend itself when Load made it.
func (m *llama) release() error {
	if m.be == nil {
		return nil
	}
	var errs []error
	mat := func(w *matrix) {
		if w.mat != nil {
			errs = append(errs, m.be.FreeMatrix(w.mat))
			w.mat = nil
		}
	}
	buf := func(b *kernels.Buffer) {
		if *b != nil {
			errs = append(errs, m.be.Free(*b))
			*b = nil
		}
	}
	if m.cfg.TiedOutput {
		m.output.mat = nil
	}
	mat(&m.tokEmbd)
	mat(&m.output)
	buf(&m.outNrmB)
	for i := range m.layers {
		l := &m.layers[i]
		for _, w := range []*matrix{&l.wq, &l.wk, &l.wv, &l.wo, &l.ffnGate, &l.ffnUp, &l.ffnDwn} {
			mat(w)
		}
		for _, b := range []*kernels.Buffer{&l.attnNormB, &l.ffnNormB, &l.bqB, &l.bkB, &l.bvB, &l.boB} {
			buf(b)
		}
	}
	for _, s := range m.free.states {
		errs = append(errs, s.release(m.be))
	}
	m.free.states = nil
	if m.ownBE {
		errs = append(errs, m.be.Close())
	}
	return errors.Join(errs...)
}

func (m *llama) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil
	}
	m.closed = true
	return m.release()
}

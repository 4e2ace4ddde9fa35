package model

import (
	"errors"
	"fmt"

	"github.com/baton-serving/baton/engine/model/arch"
	"github.com/baton-serving/baton/kernels"
)

// upload loads every bound weight onto the backend: matrices as backend
// matrices, vectors (norms, biases) as buffers. On an error, release frees
// what it loaded.
func (m *decoder) upload() error {
	up := func(ws *weights) error {
		for r := range ws {
			w := &ws[r]
			if r == int(arch.Output) && m.cfg.TiedOutput {
				continue // shares the embedding's, set below
			}
			if w.m.data != nil {
				var err error
				if w.m.mat, err = m.be.LoadMatrix(w.m.typ, w.m.rows, w.m.cols, w.m.data); err != nil {
					return fmt.Errorf("model: tensor %s on %s: %w", w.m.name, m.be.Name(), err)
				}
			}
			if w.v != nil {
				var err error
				if w.buf, err = kernels.Upload(m.be, w.v); err != nil {
					return fmt.Errorf("model: the %s vector on %s: %w", arch.Role(r), m.be.Name(), err)
				}
			}
		}
		return nil
	}
	if err := up(&m.g); err != nil {
		return err
	}
	if m.cfg.TiedOutput {
		m.g[arch.Output].m.mat = m.g[arch.TokEmbd].m.mat
	}
	for i := range m.layers {
		if err := up(&m.layers[i]); err != nil {
			return err
		}
	}
	return nil
}

// release frees everything the model holds on its backend, and the
// backend itself when Load made it.
func (m *decoder) release() error {
	if m.be == nil {
		return nil
	}
	var errs []error
	free := func(ws *weights) {
		for r := range ws {
			w := &ws[r]
			if w.m.mat != nil {
				errs = append(errs, m.be.FreeMatrix(w.m.mat))
				w.m.mat = nil
			}
			if w.buf != nil {
				errs = append(errs, m.be.Free(w.buf))
				w.buf = nil
			}
		}
	}
	if m.cfg.TiedOutput {
		m.g[arch.Output].m.mat = nil
	}
	free(&m.g)
	for i := range m.layers {
		free(&m.layers[i])
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

func (m *decoder) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil
	}
	m.closed = true
	return m.release()
}

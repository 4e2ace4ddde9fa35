package model

import (
	"errors"
	"fmt"
	"strings"

	"github.com/baton-serving/baton/engine"
	"github.com/baton-serving/baton/engine/gguf"
	"github.com/baton-serving/baton/engine/model/arch"
	"github.com/baton-serving/baton/kernels"
)

// weight is one role's weight: a matrix bound in place in the file mapping
// (m.mat once on the backend), or a vector converted to float32 on the host
// (buf once on the backend). An unbound role has neither.
type weight struct {
	m   matrix
	v   []float32
	buf kernels.Buffer
}

// bound reports whether a tensor filled the role.
func (w *weight) bound() bool { return w.m.data != nil || w.v != nil }

// weights holds a model's global weights, or one block's, by role.
type weights [arch.NumRoles]weight

// loadDecoder binds the tensors of architecture a by walking its table,
// checking each one's name, type and shape, and loads them onto the
// backend (decoder_backend.go) unless a numerics mode computes on the
// host.
func loadDecoder(f *gguf.File, a *arch.Arch, c Config, opts Options) (Model, error) {
	m := &decoder{cfg: c, a: a, layers: make([]weights, c.Layers)}
	if err := bindWeights(f, a, c, &m.g, m.layers); err != nil {
		return nil, err
	}
	// The decoder runs these on every token; a table without one is a
	// mistake in the architecture's declaration (arch's TestTables), not
	// in the file, and must not reach the backend as a nil weight.
	for _, r := range []arch.Role{arch.TokEmbd, arch.OutputNorm} {
		if !m.g[r].bound() {
			return nil, fmt.Errorf("model: architecture %s binds no %s weight: %w", a.Name, r, engine.ErrUnsupported)
		}
	}
	for li := range m.layers {
		for _, r := range []arch.Role{arch.AttnNorm, arch.Wq, arch.Wk, arch.Wv, arch.Wo, arch.FFNNorm, arch.Gate, arch.Up, arch.Down} {
			if !m.layers[li][r].bound() {
				return nil, fmt.Errorf("model: architecture %s binds no %s weight in block %d: %w", a.Name, r, li, engine.ErrUnsupported)
			}
		}
	}
	if !m.g[arch.Output].bound() {
		m.g[arch.Output].m = m.g[arch.TokEmbd].m
		m.cfg.TiedOutput = true
	}
	var err error
	if m.factors, err = m.ropeFactors(); err != nil { // decoder_rope.go
		return nil, err
	}
	m.fp = Fingerprint(f, m.cfg)
	if opts.Numerics != NumericsDefault {
		return withNumerics(f, m, opts.Numerics) // compat.go; runs on the host alone
	}
	m.be = opts.Backend
	if m.be == nil {
		m.be, m.ownBE = kernels.NewCPU(opts.Threads), true
	}
	if m.ext, err = extendedOps(a, m.cfg, m.be); err != nil {
		return nil, errors.Join(err, m.release())
	}
	if err := m.upload(); err != nil {
		return nil, errors.Join(err, m.release())
	}
	return m, nil
}

// extendedOps returns be's ExtendedOps when the architecture needs them
// (GELU, soft-caps, sliding windows narrower than the context window,
// score and embedding scales, per-layer rope bases: c.Extended), nil when
// it needs none, and an error wrapping
// engine.ErrUnsupported that names what is missing when be lacks them
// (the CUDA backend, for now).
func extendedOps(a *arch.Arch, c Config, be kernels.Backend) (kernels.ExtendedOps, error) {
	need := c.Extended()
	if a.Act != arch.SiLU {
		need = append(need, a.Act.String()+" activation")
	}
	if len(need) == 0 {
		return nil, nil
	}
	ext, ok := be.(kernels.ExtendedOps)
	if !ok {
		return nil, fmt.Errorf("model: architecture %s needs %s, which the %s backend does not run (no kernels.ExtendedOps): %w",
			a.Name, strings.Join(need, ", "), be.Name(), engine.ErrUnsupported)
	}
	return ext, nil
}

// bindWeights binds every tensor of a's table: global ones into g, per-layer
// ones into layers (one per block). Optional tensors the file lacks leave
// their roles unbound; a tensor the table does not name is an error.
func bindWeights(f *gguf.File, a *arch.Arch, c Config, g *weights, layers []weights) error {
	b := newBinder(f)
	for _, t := range a.Tensors {
		if !t.PerLayer() {
			if err := b.bind(t, c, t.Name, g); err != nil {
				return err
			}
		}
	}
	for li := range layers {
		for _, t := range a.Tensors {
			if t.PerLayer() {
				if err := b.bind(t, c, t.NameAt(li), &layers[li]); err != nil {
					return err
				}
			}
		}
	}
	return b.unused()
}

// bind binds one tensor of the table under its GGUF name, splitting a
// fused matrix's rows among its roles.
func (b *binder) bind(t arch.Tensor, c Config, name string, w *weights) error {
	if t.Optional {
		if _, ok := b.f.Tensor(name); !ok {
			return nil
		}
	}
	if t.Vector {
		v, err := b.vector(name, t.Cols(c))
		w[t.Parts[0].Role].v = v
		return err
	}
	rows := t.Rows(c)
	m, err := b.matrix(name, rows, t.Cols(c))
	if err != nil {
		return err
	}
	if len(t.Parts) == 1 {
		w[t.Parts[0].Role].m = m
		return nil
	}
	rb, r0 := len(m.data)/rows, 0
	for _, p := range t.Parts {
		n := p.Rows(c)
		w[p.Role].m = matrix{name: fmt.Sprintf("%s (%s rows)", name, p.Role), typ: m.typ,
			data: m.data[r0*rb : (r0+n)*rb : (r0+n)*rb], rows: n, cols: m.cols}
		r0 += n
	}
	return nil
}

package model

import (
	"fmt"
	"slices"
	"strings"

	"github.com/baton-serving/baton/engine"
	"github.com/baton-serving/baton/engine/gguf"
	"github.com/baton-serving/baton/kernels"
	"github.com/baton-serving/baton/kernels/quant"
)

// matrix is a weight matrix bound in place in the file mapping: rows rows of
// cols elements of type typ, row-major (GGUF dims [cols, rows]).
type matrix struct {
	name       string
	typ        quant.Type
	data       []byte
	rows, cols int
	mat        kernels.Matrix // the matrix on the model's backend
}

// binder binds tensors by name and records which ones were used, so that
// leftovers (tensors of a feature the architecture does not implement) can be
// reported.
type binder struct {
	f    *gguf.File
	used map[string]bool
}

func newBinder(f *gguf.File) *binder { return &binder{f: f, used: make(map[string]bool)} }

func typeList() string {
	var names []string
	for _, t := range quant.SupportedTypes() {
		names = append(names, t.String())
	}
	return strings.Join(names, ", ")
}

// trimOnes drops trailing dimensions of size 1, which ggml treats as absent.
func trimOnes(d []uint64) []uint64 {
	for len(d) > 1 && d[len(d)-1] == 1 {
		d = d[:len(d)-1]
	}
	return d
}

// lookup finds a tensor and checks its dims (ggml order) and type.
func (b *binder) lookup(name string, want ...int) (*gguf.TensorInfo, []byte, error) {
	t, ok := b.f.Tensor(name)
	if !ok {
		return nil, nil, fmt.Errorf("model: tensor %s is missing: %w", name, engine.ErrInvalidInput)
	}
	w := make([]uint64, len(want))
	for i, d := range want {
		w[i] = uint64(d)
	}
	if !slices.Equal(trimOnes(t.Dims), trimOnes(w)) {
		return nil, nil, fmt.Errorf("model: tensor %s has dims %v, want %v: %w", name, t.Dims, w, engine.ErrInvalidInput)
	}
	if !t.Type.Supported() {
		return nil, nil, fmt.Errorf("model: tensor %s has type %s, which is not supported (supported: %s): %w",
			name, t.Type, typeList(), engine.ErrUnsupported)
	}
	data := b.f.TensorData(t)
	if data == nil {
		return nil, nil, fmt.Errorf("model: tensor %s: no data (file closed?): %w", name, engine.ErrInvalidInput)
	}
	b.used[name] = true
	return t, data, nil
}

// matrix binds a rows×cols weight matrix without copying it.
func (b *binder) matrix(name string, rows, cols int) (matrix, error) {
	t, data, err := b.lookup(name, cols, rows)
	if err != nil {
		return matrix{}, err
	}
	rb, err := quant.RowBytes(t.Type, uint64(cols))
	if err != nil {
		return matrix{}, fmt.Errorf("model: tensor %s: %v: %w", name, err, engine.ErrUnsupported)
	}
	if uint64(len(data)) != rb*uint64(rows) {
		return matrix{}, fmt.Errorf("model: tensor %s: %d bytes, want %d: %w", name, len(data), rb*uint64(rows), engine.ErrInvalidInput)
	}
	return matrix{name: name, typ: t.Type, data: data, rows: rows, cols: cols}, nil
}

// vector binds a 1-D tensor of n elements, converted to float32 (a small
// copy: norms and biases are read on every token, and converting once keeps
// the kernels to float32 for them).
func (b *binder) vector(name string, n int) ([]float32, error) {
	t, data, err := b.lookup(name, n)
	if err != nil {
		return nil, err
	}
	v := make([]float32, n)
	if err := quant.Dequantize(t.Type, data, v); err != nil {
		return nil, fmt.Errorf("model: tensor %s: %v: %w", name, err, engine.ErrUnsupported)
	}
	return v, nil
}

// optionalVector binds a 1-D tensor if the file has it, and returns nil
// otherwise.
func (b *binder) optionalVector(name string, n int) ([]float32, error) {
	if _, ok := b.f.Tensor(name); !ok {
		return nil, nil
	}
	return b.vector(name, n)
}

// unused reports tensors of the file that no binding claimed.
func (b *binder) unused() error {
	var extra []string
	for _, t := range b.f.Tensors {
		if !b.used[t.Name] {
			extra = append(extra, t.Name)
		}
	}
	if len(extra) == 0 {
		return nil
	}
	more := ""
	if len(extra) > 5 {
		more = fmt.Sprintf(" and %d more", len(extra)-5)
		extra = extra[:5]
	}
	return fmt.Errorf("model: tensors %s%s are not part of the architecture as implemented: %w",
		strings.Join(extra, ", "), more, engine.ErrUnsupported)
}

package gguf

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"

	"github.com/baton-serving/baton/kernels/quant"
)

// Writer assembles a GGUF v3 file from metadata and tensors. It checks each
// addition against the same rules Parse enforces, so what it writes always
// parses. Metadata and tensors are written in the order they were added.
type Writer struct {
	kvs       []KV
	keys      map[string]struct{}
	tensors   []writerTensor
	names     map[string]struct{}
	alignment uint64
}

type writerTensor struct {
	name string
	typ  quant.Type
	dims []uint64
	data []byte
}

// NewWriter returns an empty Writer.
func NewWriter() *Writer {
	return &Writer{
		keys:      make(map[string]struct{}),
		names:     make(map[string]struct{}),
		alignment: DefaultAlignment,
	}
}

// AddKV adds a metadata entry; v is converted by NewValue. general.alignment
// must be a positive power-of-two integer that fits in a uint32; it is stored
// as uint32, as the specification types it, and sets the file's alignment.
func (w *Writer) AddKV(key string, v any) error {
	if key == "" {
		return fmt.Errorf("gguf: empty metadata key: %w", ErrInvalid)
	}
	if len(key) > MaxKeyLen {
		return fmt.Errorf("gguf: metadata key of %d bytes exceeds %d: %w", len(key), MaxKeyLen, ErrInvalid)
	}
	if _, dup := w.keys[key]; dup {
		return fmt.Errorf("gguf: key %q added twice: %w", key, ErrDuplicate)
	}
	val, err := NewValue(v)
	if err != nil {
		return fmt.Errorf("gguf: key %q: %w", key, err)
	}
	if key == AlignmentKey {
		a, ok := val.AsUint()
		if !ok || a == 0 || a&(a-1) != 0 || a > math.MaxUint32 {
			return fmt.Errorf("gguf: key %q: %s is not a power of two that fits a uint32: %w", key, val, ErrBadAlignment)
		}
		val = Value{typ: TypeUint32, num: a}
		w.alignment = a
	}
	w.keys[key] = struct{}{}
	w.kvs = append(w.kvs, KV{Key: key, Value: val})
	return nil
}

// AddTensor adds a tensor with dimensions dims in ggml order (row length
// first). len(data) must be the exact size of such a tensor. data is not
// copied: it must stay unchanged until the last WriteTo or WriteFile.
func (w *Writer) AddTensor(name string, typ quant.Type, dims []uint64, data []byte) error {
	if name == "" {
		return fmt.Errorf("gguf: empty tensor name: %w", ErrInvalid)
	}
	if len(name) > MaxTensorNameLen {
		return fmt.Errorf("gguf: tensor name %q is %d bytes, more than %d: %w", name, len(name), MaxTensorNameLen, ErrInvalid)
	}
	if _, dup := w.names[name]; dup {
		return fmt.Errorf("gguf: tensor %q added twice: %w", name, ErrDuplicate)
	}
	if !typ.Known() {
		return fmt.Errorf("gguf: tensor %q: %w %d", name, ErrBadTensorType, uint32(typ))
	}
	if len(dims) > MaxDims {
		return fmt.Errorf("gguf: tensor %q: %d dimensions, more than %d: %w", name, len(dims), MaxDims, ErrBadShape)
	}
	size, err := tensorSize(typ, dims)
	if err != nil {
		return fmt.Errorf("gguf: tensor %q: %v: %w", name, err, ErrBadShape)
	}
	if uint64(len(data)) != size {
		return fmt.Errorf("gguf: tensor %q: %d bytes of data, but %s %v needs %d", name, len(data), typ, dims, size)
	}
	w.names[name] = struct{}{}
	w.tensors = append(w.tensors, writerTensor{name: name, typ: typ, dims: append([]uint64(nil), dims...), data: data})
	return nil
}

// WriteTo writes the file to out: a v3 header, the metadata, the tensor
// infos, zero padding to the alignment, then each tensor's data padded to
// the alignment. It returns the number of bytes written.
func (w *Writer) WriteTo(out io.Writer) (int64, error) {
	cw := &countingWriter{w: out}
	e := &encoder{w: bufio.NewWriterSize(cw, 1<<16)}
	e.bytes([]byte(magic))
	e.u32(3)
	e.u64(uint64(len(w.tensors)))
	e.u64(uint64(len(w.kvs)))
	for _, kv := range w.kvs {
		e.str(kv.Key)
		e.u32(uint32(kv.Value.typ))
		e.value(kv.Value)
	}
	off := uint64(0)
	for _, t := range w.tensors {
		e.str(t.name)
		e.u32(uint32(len(t.dims)))
		for _, d := range t.dims {
			e.u64(d)
		}
		e.u32(uint32(t.typ))
		e.u64(off)
		off, _ = alignUp(off+uint64(len(t.data)), w.alignment)
	}
	e.pad(w.alignment)
	for _, t := range w.tensors {
		e.bytes(t.data)
		e.pad(w.alignment)
	}
	if e.err == nil {
		e.err = e.w.Flush()
	}
	if e.err != nil {
		return cw.n, fmt.Errorf("gguf: write: %w", e.err)
	}
	return cw.n, nil
}

// countingWriter counts the bytes that reached the destination, which is
// what WriteTo reports, as opposed to the bytes buffered.
type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// WriteFile writes the file to path atomically: it writes a temporary file
// in the same directory, syncs it and renames it over path, so readers never
// see a partial file.
func (w *Writer) WriteFile(path string) (err error) {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("gguf: %w", err)
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if _, err := w.WriteTo(tmp); err != nil {
		return err
	}
	if err := tmp.Chmod(0o644); err != nil {
		return fmt.Errorf("gguf: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		return fmt.Errorf("gguf: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("gguf: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("gguf: %w", err)
	}
	return nil
}

// encoder writes little-endian fields, tracking the position (for padding)
// and keeping the first error so that callers check once at the end.
type encoder struct {
	w       *bufio.Writer
	n       int64 // bytes handed to w
	err     error
	scratch [8]byte
}

func (e *encoder) bytes(b []byte) {
	if e.err != nil {
		return
	}
	n, err := e.w.Write(b)
	e.n += int64(n)
	e.err = err
}

func (e *encoder) u8(v uint8) { e.scratch[0] = v; e.bytes(e.scratch[:1]) }
func (e *encoder) u16(v uint16) {
	binary.LittleEndian.PutUint16(e.scratch[:], v)
	e.bytes(e.scratch[:2])
}
func (e *encoder) u32(v uint32) {
	binary.LittleEndian.PutUint32(e.scratch[:], v)
	e.bytes(e.scratch[:4])
}
func (e *encoder) u64(v uint64) {
	binary.LittleEndian.PutUint64(e.scratch[:], v)
	e.bytes(e.scratch[:8])
}

func (e *encoder) str(s string) {
	e.u64(uint64(len(s)))
	if e.err != nil {
		return
	}
	n, err := e.w.WriteString(s)
	e.n += int64(n)
	e.err = err
}

var zeros [256]byte

// pad writes zero bytes up to the next multiple of align.
func (e *encoder) pad(align uint64) {
	next, _ := alignUp(uint64(e.n), align)
	for k := next - uint64(e.n); k > 0; {
		c := min(k, uint64(len(zeros)))
		e.bytes(zeros[:c])
		if e.err != nil {
			return
		}
		k -= c
	}
}

// value writes v's encoding without its type tag.
func (e *encoder) value(v Value) {
	switch v.typ {
	case TypeUint8, TypeInt8, TypeBool:
		e.u8(uint8(v.num))
	case TypeUint16, TypeInt16:
		e.u16(uint16(v.num))
	case TypeUint32, TypeInt32, TypeFloat32:
		e.u32(uint32(v.num))
	case TypeUint64, TypeInt64, TypeFloat64:
		e.u64(v.num)
	case TypeString:
		e.str(v.str)
	case TypeArray:
		e.array(v)
	default:
		if e.err == nil {
			e.err = errors.New("value of unknown type " + v.typ.String())
		}
	}
}

// array writes an array body: element type, count, elements.
func (e *encoder) array(v Value) {
	et, _ := v.ElemType()
	e.u32(uint32(et))
	e.u64(uint64(v.Len()))
	switch a := v.arr.(type) {
	case []uint8:
		e.bytes(a)
	case []int8:
		for _, x := range a {
			e.u8(uint8(x))
		}
	case []bool:
		for _, x := range a {
			var b uint8
			if x {
				b = 1
			}
			e.u8(b)
		}
	case []uint16:
		for _, x := range a {
			e.u16(x)
		}
	case []int16:
		for _, x := range a {
			e.u16(uint16(x))
		}
	case []uint32:
		for _, x := range a {
			e.u32(x)
		}
	case []int32:
		for _, x := range a {
			e.u32(uint32(x))
		}
	case []float32:
		for _, x := range a {
			e.u32(math.Float32bits(x))
		}
	case []uint64:
		for _, x := range a {
			e.u64(x)
		}
	case []int64:
		for _, x := range a {
			e.u64(uint64(x))
		}
	case []float64:
		for _, x := range a {
			e.u64(math.Float64bits(x))
		}
	case []string:
		for _, x := range a {
			e.str(x)
		}
	case []Value:
		for _, x := range a {
			e.array(x)
		}
	}
}

package gguf

import (
	"bytes"
	"encoding/binary"
	"math"
	"testing"

	"github.com/baton-serving/baton/kernels/quant"
)

// raw builds GGUF bytes field by field, so tests can write files that the
// Writer would refuse to produce.
type raw struct{ b []byte }

func (r *raw) u8(v uint8) *raw   { r.b = append(r.b, v); return r }
func (r *raw) u32(v uint32) *raw { r.b = binary.LittleEndian.AppendUint32(r.b, v); return r }
func (r *raw) u64(v uint64) *raw { r.b = binary.LittleEndian.AppendUint64(r.b, v); return r }
func (r *raw) str(s string) *raw { r.u64(uint64(len(s))); r.b = append(r.b, s...); return r }

// header starts a file with the given version and counts.
func header(version uint32, nTensors, nKV uint64) *raw {
	r := &raw{b: []byte("GGUF")}
	return r.u32(version).u64(nTensors).u64(nKV)
}

// kvU32 appends a uint32 metadata entry.
func (r *raw) kvU32(key string, v uint32) *raw {
	return r.str(key).u32(uint32(TypeUint32)).u32(v)
}

// tensor appends a tensor info.
func (r *raw) tensor(name string, typ quant.Type, off uint64, dims ...uint64) *raw {
	r.str(name).u32(uint32(len(dims)))
	for _, d := range dims {
		r.u64(d)
	}
	return r.u32(uint32(typ)).u64(off)
}

// data pads to align and appends n bytes of tensor data.
func (r *raw) data(align, n int) *raw {
	for len(r.b)%align != 0 {
		r.b = append(r.b, 0)
	}
	r.b = append(r.b, make([]byte, n)...)
	return r
}

// f32bytes encodes float32s little-endian.
func f32bytes(xs ...float32) []byte {
	b := make([]byte, 0, 4*len(xs))
	for _, x := range xs {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(x))
	}
	return b
}

// sampleWriter returns a Writer holding metadata of every type and tensors
// of several types and shapes.
func sampleWriter(t testing.TB) *Writer {
	t.Helper()
	w := NewWriter()
	nested1, err := NewValue([]float32{1, 2})
	if err != nil {
		t.Fatal(err)
	}
	nested2, err := NewValue([]string{"x", "", "yz"})
	if err != nil {
		t.Fatal(err)
	}
	nested3, err := NewValue([]Value{nested1})
	if err != nil {
		t.Fatal(err)
	}
	kvs := []struct {
		key string
		v   any
	}{
		{"general.architecture", "llama"},
		{"u8", uint8(200)},
		{"i8", int8(-100)},
		{"u16", uint16(60000)},
		{"i16", int16(-30000)},
		{"u32", uint32(4000000000)},
		{"i32", int32(-2000000000)},
		{"f32", float32(1e-5)},
		{"bool.t", true},
		{"bool.f", false},
		{"str.empty", ""},
		{"str.utf8", "▁héllo"},
		{"u64", uint64(math.MaxUint64)},
		{"i64", int64(math.MinInt64)},
		{"f64", math.Pi},
		{"nan", float32(math.NaN())},
		{"int", 7},
		{"arr.u8", []uint8{0, 1, 255}},
		{"arr.i8", []int8{-128, 0, 127}},
		{"arr.u16", []uint16{1, 65535}},
		{"arr.i16", []int16{-32768, 32767}},
		{"arr.u32", []uint32{0, 0xFFFFFFFF}},
		{"arr.i32", []int32{-1, 2, 3}},
		{"arr.f32", []float32{0.5, -0, float32(math.Inf(1))}},
		{"arr.bool", []bool{true, false, true}},
		{"arr.str", []string{"<unk>", "<s>", "</s>", ""}},
		{"arr.u64", []uint64{1 << 63}},
		{"arr.i64", []int64{-1 << 63}},
		{"arr.f64", []float64{1.5}},
		{"arr.empty", []float32{}},
		{"arr.nested", []Value{nested1, nested2, nested3}},
		{"wrapped", nested2},
	}
	for _, kv := range kvs {
		if err := w.AddKV(kv.key, kv.v); err != nil {
			t.Fatalf("AddKV(%q): %v", kv.key, err)
		}
	}
	q8 := make([]byte, 2*34) // 2 rows of one Q8_0 block each
	for i := range q8 {
		q8[i] = byte(i)
	}
	tensors := []struct {
		name string
		typ  quant.Type
		dims []uint64
		data []byte
	}{
		{"token_embd.weight", quant.F32, []uint64{3, 2}, f32bytes(1, 2, 3, 4, 5, 6)},
		{"odd.f16", quant.F16, []uint64{3}, []byte{1, 2, 3, 4, 5, 6}},
		{"blk.0.attn_q.weight", quant.Q8_0, []uint64{32, 2}, q8},
		{"empty", quant.F32, []uint64{0, 4}, nil},
		{"scalar", quant.F32, nil, f32bytes(42)},
		{"q4k", quant.Q4_K, []uint64{256, 1, 1, 1}, bytes.Repeat([]byte{7}, 144)},
	}
	for _, tt := range tensors {
		if err := w.AddTensor(tt.name, tt.typ, tt.dims, tt.data); err != nil {
			t.Fatalf("AddTensor(%q): %v", tt.name, err)
		}
	}
	return w
}

func writeBytes(t testing.TB, w *Writer) []byte {
	t.Helper()
	var buf bytes.Buffer
	n, err := w.WriteTo(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if n != int64(buf.Len()) {
		t.Fatalf("WriteTo returned %d, wrote %d bytes", n, buf.Len())
	}
	return buf.Bytes()
}

package gguf

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"

	"github.com/baton-serving/baton/kernels/quant"
)

func TestRoundTrip(t *testing.T) {
	for _, align := range []uint64{0, 1, 8, 64, 4096} {
		t.Run("align"+uitoa(align), func(t *testing.T) {
			w := sampleWriter(t)
			if align != 0 {
				if err := w.AddKV(AlignmentKey, align); err != nil {
					t.Fatal(err)
				}
			}
			data := writeBytes(t, w)
			f, err := Parse(data)
			if err != nil {
				t.Fatal(err)
			}
			checkSame(t, w, f)
			wantAlign := align
			if align == 0 {
				wantAlign = DefaultAlignment
			}
			if f.Version != 3 || f.Alignment != wantAlign {
				t.Errorf("version %d alignment %d, want 3 and %d", f.Version, f.Alignment, wantAlign)
			}
			if f.DataOffset%wantAlign != 0 {
				t.Errorf("data offset %d not aligned to %d", f.DataOffset, wantAlign)
			}
			if uint64(len(data))%wantAlign != 0 {
				t.Errorf("file length %d not padded to %d", len(data), wantAlign)
			}
			for _, ti := range f.Tensors {
				if ti.Offset%wantAlign != 0 || ti.Offset < f.DataOffset {
					t.Errorf("tensor %q at %d: not aligned or before data offset %d", ti.Name, ti.Offset, f.DataOffset)
				}
			}
			// Writing what was read reproduces the file byte for byte.
			if again := writeBytes(t, rewrite(t, f)); !bytes.Equal(again, data) {
				t.Errorf("re-encoding the parsed file changed it (%d bytes, was %d)", len(again), len(data))
			}
		})
	}
}

func uitoa(x uint64) string {
	if x == 0 {
		return "default"
	}
	return strconv.FormatUint(x, 10)
}

// rewrite copies a parsed file's metadata and tensors into a new Writer.
func rewrite(t testing.TB, f *File) *Writer {
	t.Helper()
	w := NewWriter()
	for _, kv := range f.KVs {
		if err := w.AddKV(kv.Key, kv.Value); err != nil {
			t.Fatalf("AddKV(%q): %v", kv.Key, err)
		}
	}
	for i := range f.Tensors {
		ti := &f.Tensors[i]
		if err := w.AddTensor(ti.Name, ti.Type, ti.Dims, f.TensorData(ti)); err != nil {
			t.Fatalf("AddTensor(%q): %v", ti.Name, err)
		}
	}
	return w
}

// checkSame asserts that f holds exactly what w was given.
func checkSame(t *testing.T, w *Writer, f *File) {
	t.Helper()
	if len(f.KVs) != len(w.kvs) {
		t.Fatalf("%d KVs, want %d", len(f.KVs), len(w.kvs))
	}
	for i, kv := range w.kvs {
		got := f.KVs[i]
		if got.Key != kv.Key || !got.Value.Equal(kv.Value) {
			t.Errorf("KV %d = %s %s, want %s %s", i, got.Key, got.Value, kv.Key, kv.Value)
		}
		if v, ok := f.Get(kv.Key); !ok || !v.Equal(kv.Value) {
			t.Errorf("Get(%q) = %s, %v", kv.Key, v, ok)
		}
	}
	if len(f.Tensors) != len(w.tensors) {
		t.Fatalf("%d tensors, want %d", len(f.Tensors), len(w.tensors))
	}
	for i, wt := range w.tensors {
		ti := &f.Tensors[i]
		if ti.Name != wt.name || ti.Type != wt.typ || !slices.Equal(ti.Dims, wt.dims) {
			t.Errorf("tensor %d = %q %s %v, want %q %s %v", i, ti.Name, ti.Type, ti.Dims, wt.name, wt.typ, wt.dims)
		}
		if ti.Size != uint64(len(wt.data)) || !bytes.Equal(f.TensorData(ti), wt.data) {
			t.Errorf("tensor %q: data differs (size %d, want %d)", ti.Name, ti.Size, len(wt.data))
		}
		if p, ok := f.Tensor(wt.name); !ok || p != ti {
			t.Errorf("Tensor(%q) = %p, %v; want %p", wt.name, p, ok, ti)
		}
	}
}

func TestWriteFileOpen(t *testing.T) {
	w := sampleWriter(t)
	path := filepath.Join(t.TempDir(), "model.gguf")
	if err := os.WriteFile(path, []byte("old contents"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := w.WriteFile(path); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(filepath.Dir(path))
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 {
		t.Errorf("directory holds %d entries after WriteFile, want only the file", len(entries))
	}
	f, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	checkSame(t, w, f)
	ti, _ := f.Tensor("token_embd.weight")
	d := f.TensorData(ti)
	if len(d) != 24 || cap(d) != 24 {
		t.Errorf("TensorData len %d cap %d, want 24 and 24", len(d), cap(d))
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if f.TensorData(ti) != nil {
		t.Error("TensorData after Close is not nil")
	}
	// Metadata outlives the mapping.
	if s, ok := f.Strings("arr.str"); !ok || s[0] != "<unk>" {
		t.Errorf("Strings after Close = %q, %v", s, ok)
	}
}

func TestWriteFileBadDir(t *testing.T) {
	w := NewWriter()
	err := w.WriteFile(filepath.Join(t.TempDir(), "missing", "x.gguf"))
	if err == nil {
		t.Fatal("WriteFile into a missing directory succeeded")
	}
}

type failWriter struct{ after int }

func (f *failWriter) Write(p []byte) (int, error) {
	if len(p) > f.after {
		n := f.after
		f.after = 0
		return n, errors.New("disk full")
	}
	f.after -= len(p)
	return len(p), nil
}

func TestWriteToError(t *testing.T) {
	w := sampleWriter(t)
	full := writeBytes(t, w)
	for _, after := range []int{0, 10, 100, len(full) - 1} {
		n, err := w.WriteTo(&failWriter{after: after})
		if err == nil {
			t.Errorf("WriteTo failing after %d bytes: no error", after)
		}
		if n != int64(after) {
			t.Errorf("WriteTo failing after %d bytes reported %d", after, n)
		}
	}
}

func TestWriterRejects(t *testing.T) {
	w := NewWriter()
	if err := w.AddKV("a", 1); err != nil {
		t.Fatal(err)
	}
	if err := w.AddTensor("t", quant.F32, []uint64{2}, make([]byte, 8)); err != nil {
		t.Fatal(err)
	}
	long := string(bytes.Repeat([]byte("n"), MaxTensorNameLen+1))
	cases := []struct {
		name string
		err  error
		want error
	}{
		{"dup key", w.AddKV("a", 2), ErrDuplicate},
		{"empty key", w.AddKV("", 2), ErrInvalid},
		{"unsupported Go type", w.AddKV("b", struct{}{}), nil},
		{"nil", w.AddKV("b", nil), nil},
		{"[]Value of scalars", w.AddKV("b", []Value{{}}), nil},
		{"alignment 0", w.AddKV(AlignmentKey, 0), ErrBadAlignment},
		{"alignment 48", w.AddKV(AlignmentKey, uint32(48)), ErrBadAlignment},
		{"alignment string", w.AddKV(AlignmentKey, "32"), ErrBadAlignment},
		{"alignment 2^32", w.AddKV(AlignmentKey, uint64(1)<<32), ErrBadAlignment},
		{"dup tensor", w.AddTensor("t", quant.F32, []uint64{2}, make([]byte, 8)), ErrDuplicate},
		{"empty name", w.AddTensor("", quant.F32, []uint64{2}, make([]byte, 8)), ErrInvalid},
		{"long name", w.AddTensor(long, quant.F32, []uint64{2}, make([]byte, 8)), ErrInvalid},
		{"unknown type", w.AddTensor("u", quant.Type(4), []uint64{2}, make([]byte, 8)), ErrBadTensorType},
		{"9 dims", w.AddTensor("u", quant.F32, make([]uint64, 9), nil), ErrBadShape},
		{"overflow", w.AddTensor("u", quant.F32, []uint64{1 << 32, 1 << 32}, nil), ErrBadShape},
		{"partial block", w.AddTensor("u", quant.Q8_0, []uint64{16}, make([]byte, 17)), ErrBadShape},
		{"short data", w.AddTensor("u", quant.F32, []uint64{2}, make([]byte, 7)), nil},
		{"long data", w.AddTensor("u", quant.F32, []uint64{2}, make([]byte, 9)), nil},
	}
	for _, c := range cases {
		if c.err == nil {
			t.Errorf("%s: no error", c.name)
			continue
		}
		if c.want != nil && !errors.Is(c.err, c.want) {
			t.Errorf("%s: error %v is not %v", c.name, c.err, c.want)
		}
	}
	// The rejected additions left the writer as it was.
	f, err := Parse(writeBytes(t, w))
	if err != nil {
		t.Fatal(err)
	}
	if len(f.KVs) != 1 || len(f.Tensors) != 1 || f.Alignment != DefaultAlignment {
		t.Errorf("after rejections: %d KVs, %d tensors, alignment %d", len(f.KVs), len(f.Tensors), f.Alignment)
	}
}

func TestAlignmentStoredAsUint32(t *testing.T) {
	w := NewWriter()
	if err := w.AddKV(AlignmentKey, 64); err != nil {
		t.Fatal(err)
	}
	f, err := Parse(writeBytes(t, w))
	if err != nil {
		t.Fatal(err)
	}
	v, _ := f.Get(AlignmentKey)
	if v.Type() != TypeUint32 || f.Alignment != 64 {
		t.Errorf("alignment stored as %s, parsed alignment %d", v.Type(), f.Alignment)
	}
}

func TestNewValueNestingLimit(t *testing.T) {
	v, err := NewValue([]int32{1})
	if err != nil {
		t.Fatal(err)
	}
	for range MaxArrayDepth - 1 {
		if v, err = NewValue([]Value{v}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := NewValue([]Value{v}); err == nil {
		t.Errorf("nesting %d deep accepted", MaxArrayDepth+1)
	}
	// The deepest accepted value round-trips.
	w := NewWriter()
	if err := w.AddKV("deep", v); err != nil {
		t.Fatal(err)
	}
	f, err := Parse(writeBytes(t, w))
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := f.Get("deep"); !got.Equal(v) {
		t.Error("deep array changed in the round trip")
	}
}

func TestNewValueCopies(t *testing.T) {
	src := []float32{1, 2}
	v, err := NewValue(src)
	if err != nil {
		t.Fatal(err)
	}
	src[0] = 9
	if a, _ := v.Float32s(); a[0] != 1 {
		t.Error("NewValue aliases the caller's slice")
	}
	if a, _ := mustValue(t, []int{-1, 2}).Int64s(); !slices.Equal(a, []int64{-1, 2}) {
		t.Errorf("[]int stored as %v", a)
	}
	if a, _ := mustValue(t, []uint{3}).Uint64s(); !slices.Equal(a, []uint64{3}) {
		t.Errorf("[]uint stored as %v", a)
	}
	if x, _ := mustValue(t, ^uint(0)).AsUint(); x != uint64(^uint(0)) {
		t.Errorf("uint stored as %d", x)
	}
}

func mustValue(t *testing.T, x any) Value {
	t.Helper()
	v, err := NewValue(x)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

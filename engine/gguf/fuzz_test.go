package gguf

import (
	"bytes"
	"errors"
	"os"
	"testing"

	"github.com/baton-serving/baton/engine/refdata"
	"github.com/baton-serving/baton/kernels/quant"
)

// FuzzOpen feeds arbitrary bytes to Parse. Every input must yield a File or
// a *FormatError without panicking; an accepted file must be internally
// consistent and survive a rewrite through the Writer unchanged.
func FuzzOpen(f *testing.F) {
	for _, seed := range fuzzSeeds(f) {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		file, err := Parse(data)
		if err != nil {
			var fe *FormatError
			if !errors.As(err, &fe) {
				t.Fatalf("error %v is not a *FormatError", err)
			}
			return
		}
		checkConsistent(t, file, data)
	})
}

func fuzzSeeds(f *testing.F) [][]byte {
	sample := writeBytes(f, sampleWriter(f))
	seeds := [][]byte{
		sample,
		validFile().b,
		header(3, 0, 0).b,
		header(2, 1, 1).kvU32("k", 1).tensor("a", quant.Q8_0, 0, 32).data(32, 34).b,
		header(3, 0, 1).str("k").u32(uint32(TypeArray)).u32(uint32(TypeArray)).u64(1).u32(uint32(TypeString)).u64(1).str("s").b,
	}
	for _, n := range []int{0, 3, 4, 8, 16, 24, 40, len(sample) / 3, len(sample) / 2, len(sample) - 1} {
		seeds = append(seeds, sample[:n])
	}
	// The metadata and tensor infos of a real model, with the start of its
	// data section.
	if p, ok := refdata.Lookup(refdata.ModelFile); ok {
		if b, err := os.ReadFile(p); err == nil {
			if sf, err := Parse(b); err == nil {
				seeds = append(seeds, b[:min(sf.DataOffset+64, uint64(len(b)))])
			}
		}
	}
	return seeds
}

func checkConsistent(t *testing.T, f *File, data []byte) {
	t.Helper()
	if f.Version != 2 && f.Version != 3 {
		t.Fatalf("accepted version %d", f.Version)
	}
	if f.Alignment == 0 || f.Alignment&(f.Alignment-1) != 0 || f.DataOffset%f.Alignment != 0 {
		t.Fatalf("alignment %d, data offset %d", f.Alignment, f.DataOffset)
	}
	for i := range f.Tensors {
		ti := &f.Tensors[i]
		d := f.TensorData(ti)
		if uint64(len(d)) != ti.Size || ti.Offset < f.DataOffset || (ti.Offset-f.DataOffset)%f.Alignment != 0 {
			t.Fatalf("tensor %q: offset %d size %d, %d bytes of data", ti.Name, ti.Offset, ti.Size, len(d))
		}
		if size, err := tensorSize(ti.Type, ti.Dims); err != nil || size != ti.Size {
			t.Fatalf("tensor %q: size %d, recomputed %d, %v", ti.Name, ti.Size, size, err)
		}
	}
	if f.Alignment > 4096 {
		// Valid, but rewriting would pad to the alignment: up to gigabytes.
		return
	}
	w := NewWriter()
	for _, kv := range f.KVs {
		if err := w.AddKV(kv.Key, kv.Value); err != nil {
			t.Fatalf("Writer refused parsed key %q: %v", kv.Key, err)
		}
	}
	for i := range f.Tensors {
		ti := &f.Tensors[i]
		if err := w.AddTensor(ti.Name, ti.Type, ti.Dims, f.TensorData(ti)); err != nil {
			t.Fatalf("Writer refused parsed tensor %q: %v", ti.Name, err)
		}
	}
	var buf bytes.Buffer
	if _, err := w.WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	g, err := Parse(buf.Bytes())
	if err != nil {
		t.Fatalf("rewritten file does not parse: %v", err)
	}
	if len(g.KVs) != len(f.KVs) || len(g.Tensors) != len(f.Tensors) || g.Alignment != f.Alignment {
		t.Fatalf("rewrite: %d KVs, %d tensors, alignment %d; was %d, %d, %d",
			len(g.KVs), len(g.Tensors), g.Alignment, len(f.KVs), len(f.Tensors), f.Alignment)
	}
	for i, kv := range f.KVs {
		got := g.KVs[i]
		same := got.Value.Equal(kv.Value)
		if kv.Key == AlignmentKey {
			a, _ := got.Value.AsUint()
			b, _ := kv.Value.AsUint()
			same = a == b
		}
		if got.Key != kv.Key || !same {
			t.Fatalf("rewrite changed KV %d: %s=%s, was %s=%s", i, got.Key, got.Value, kv.Key, kv.Value)
		}
	}
	for i := range f.Tensors {
		a, b := &f.Tensors[i], &g.Tensors[i]
		if a.Name != b.Name || a.Type != b.Type || a.Size != b.Size || !bytes.Equal(f.TensorData(a), g.TensorData(b)) {
			t.Fatalf("rewrite changed tensor %q", a.Name)
		}
	}
}

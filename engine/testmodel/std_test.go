package testmodel

import (
	"bytes"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/baton-serving/baton/engine/gguf"
	"github.com/baton-serving/baton/kernels/quant"
)

// TestOutputStd: Spec.OutputStd sets the std of output.weight (and of
// token_embd.weight when tied) and leaves every other tensor at Std, and
// Spec.Weights returns what the file holds; without it (or equal to Std)
// the file is byte for byte the one written before OutputStd existed.
func TestOutputStd(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, s Spec) *gguf.File {
		t.Helper()
		path := filepath.Join(dir, name)
		if err := Write(path, s); err != nil {
			t.Fatal(err)
		}
		f, err := gguf.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		return f
	}
	stdOf := func(f *gguf.File, s Spec, name string) float64 {
		t.Helper()
		info, ok := f.Tensor(name)
		if !ok {
			t.Fatalf("no %s", name)
		}
		cols, rows := int(info.Dims[0]), int(info.Dims[1])
		got := make([]float32, rows*cols)
		if err := quant.Dequantize(quant.F32, f.TensorData(info), got); err != nil {
			t.Fatal(err)
		}
		if want := s.Weights(name, rows, cols); !slices.Equal(got, want) {
			t.Fatalf("%s: the file's values are not Spec.Weights'", name)
		}
		var sq float64
		for _, v := range got {
			sq += float64(v) * float64(v)
		}
		return math.Sqrt(sq / float64(len(got)))
	}
	near := func(what string, got, want float64) {
		t.Helper()
		if math.Abs(got-want) > 0.05*want {
			t.Errorf("%s: std %.4f, want %g", what, got, want)
		}
	}

	s := tiny(t)
	s.Std, s.OutputStd = 0.1, 2
	f := write("out.gguf", s)
	near("output.weight", stdOf(f, s, "output.weight"), 2)
	near("token_embd.weight (untied)", stdOf(f, s, "token_embd.weight"), 0.1)
	near("blk.0.attn_q.weight", stdOf(f, s, "blk.0.attn_q.weight"), 0.1)
	near("blk.1.ffn_down.weight", stdOf(f, s, "blk.1.ffn_down.weight"), 0.1)

	s.Tied = true
	f = write("tied.gguf", s)
	near("token_embd.weight (tied)", stdOf(f, s, "token_embd.weight"), 2)
	near("blk.0.attn_k.weight (tied)", stdOf(f, s, "blk.0.attn_k.weight"), 0.1)

	plain := tiny(t)
	plain.Std = 0.1
	same := plain
	same.OutputStd = 0.1
	write("plain.gguf", plain)
	write("same.gguf", same)
	a, _ := os.ReadFile(filepath.Join(dir, "plain.gguf"))
	b, _ := os.ReadFile(filepath.Join(dir, "same.gguf"))
	if !bytes.Equal(a, b) {
		t.Error("OutputStd equal to Std changed the file")
	}

	bad := tiny(t)
	bad.OutputStd = -1
	if err := bad.Validate(); err == nil {
		t.Error("OutputStd -1 accepted")
	}
}

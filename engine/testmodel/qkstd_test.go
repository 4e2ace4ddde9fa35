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

// TestQKStd: Spec.QKStd sets the std of the query and key weights and
// biases only — attn_q/attn_k (llama, qwen2), their biases (qwen2), and the
// query and key row ranges of phi3's fused attn_qkv, whose value rows keep
// Std — and Spec.Weights returns what the file holds, per row; without it
// (or equal to Std) the file is byte for byte the one written before QKStd
// existed.
func TestQKStd(t *testing.T) {
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
	// rowsStd is the std of rows r0…r1-1 of the named tensor (a vector is
	// one row of Dims[0]); it checks the file against Spec.Weights first.
	rowsStd := func(f *gguf.File, s Spec, name string, r0, r1 int) float64 {
		t.Helper()
		info, ok := f.Tensor(name)
		if !ok {
			t.Fatalf("no %s", name)
		}
		cols, rows := int(info.Dims[0]), 1
		if len(info.Dims) > 1 {
			rows = int(info.Dims[1])
		}
		got := make([]float32, rows*cols)
		if err := quant.Dequantize(quant.F32, f.TensorData(info), got); err != nil {
			t.Fatal(err)
		}
		if want := s.Weights(name, rows, cols); !slices.Equal(got, want) {
			t.Fatalf("%s: the file's values are not Spec.Weights'", name)
		}
		if r1 < 0 {
			r1 = rows
		}
		var sq float64
		for _, v := range got[r0*cols : r1*cols] {
			sq += float64(v) * float64(v)
		}
		return math.Sqrt(sq / float64((r1-r0)*cols))
	}
	// near allows a quarter: a bias has only a few hundred values, and
	// the stds told apart differ by 4× or more.
	near := func(what string, got, want float64) {
		t.Helper()
		if math.Abs(got-want) > 0.25*want {
			t.Errorf("%s: std %.4f, want %g", what, got, want)
		}
	}

	s := tiny(t)
	s.Arch, s.Std, s.QKStd = "qwen2", 1, 0.125
	f := write("qwen2.gguf", s)
	for _, c := range []struct {
		name string
		want float64
	}{
		{"blk.0.attn_q.weight", 0.125}, {"blk.1.attn_k.weight", 0.125},
		{"blk.0.attn_q.bias", 0.125}, {"blk.1.attn_k.bias", 0.125},
		{"blk.0.attn_v.weight", 1}, {"blk.0.attn_v.bias", 1}, {"blk.1.attn_output.weight", 1},
		{"blk.0.ffn_up.weight", 1}, {"token_embd.weight", 1}, {"output.weight", 1},
	} {
		near(c.name, rowsStd(f, s, c.name, 0, -1), c.want)
	}

	p := tiny(t)
	p.Arch, p.Std, p.QKStd = "phi3", 1, 0.25
	f = write("phi3.gguf", p)
	q, kv := p.Heads*p.headDim(), p.KVHeads*p.headDim()
	near("attn_qkv query rows", rowsStd(f, p, "blk.0.attn_qkv.weight", 0, q), 0.25)
	near("attn_qkv key rows", rowsStd(f, p, "blk.1.attn_qkv.weight", q, q+kv), 0.25)
	near("attn_qkv value rows", rowsStd(f, p, "blk.0.attn_qkv.weight", q+kv, q+2*kv), 1)
	near("ffn_up (phi3)", rowsStd(f, p, "blk.0.ffn_up.weight", 0, -1), 1)

	for _, a := range []string{"llama", "phi3", "qwen2"} {
		plain := tiny(t)
		plain.Arch, plain.Std = a, 0.5
		same := plain
		same.QKStd = 0.5
		write(a+"-plain.gguf", plain)
		write(a+"-same.gguf", same)
		x, _ := os.ReadFile(filepath.Join(dir, a+"-plain.gguf"))
		y, _ := os.ReadFile(filepath.Join(dir, a+"-same.gguf"))
		if !bytes.Equal(x, y) {
			t.Errorf("%s: QKStd equal to Std changed the file", a)
		}
	}

	for _, v := range []float64{-1, math.NaN(), 101} {
		bad := tiny(t)
		bad.QKStd = v
		if err := bad.Validate(); err == nil {
			t.Errorf("QKStd %v accepted", v)
		}
	}
}

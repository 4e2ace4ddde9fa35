package runcmd

import (
	"context"
	"math"
	"path/filepath"
	"testing"

	"github.com/baton-serving/baton/engine/gguf"
	"github.com/baton-serving/baton/kernels/quant"
)

// TestGenModelOutputStd: --output-std sets the std of output.weight only;
// the other weights keep --std.
func TestGenModelOutputStd(t *testing.T) {
	out := filepath.Join(t.TempDir(), "m.gguf")
	r := call(context.Background(), wrap(GenModel, "--preset", "tiny", "--std", "0.1", "--output-std", "2", "--out", out))
	if r.code != 0 {
		t.Fatalf("gen-model: exit %d, %q %q", r.code, r.stdout, r.stderr)
	}
	f, err := gguf.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for name, want := range map[string]float64{"output.weight": 2, "token_embd.weight": 0.1, "blk.0.ffn_down.weight": 0.1} {
		info, _ := f.Tensor(name)
		w := make([]float32, info.NumElements())
		if err := quant.Dequantize(info.Type, f.TensorData(info), w); err != nil {
			t.Fatal(err)
		}
		var sq float64
		for _, v := range w {
			sq += float64(v) * float64(v)
		}
		if std := math.Sqrt(sq / float64(len(w))); math.Abs(std-want) > 0.05*want {
			t.Errorf("%s: std %.4f, want %g", name, std, want)
		}
	}
	if r := call(context.Background(), wrap(GenModel, "--preset", "tiny", "--output-std", "-1", "--out", out)); r.code != 2 {
		t.Errorf("--output-std -1: exit %d, %q", r.code, r.stderr)
	}
}

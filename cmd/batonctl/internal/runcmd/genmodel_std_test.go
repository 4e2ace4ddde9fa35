package runcmd

import (
	"context"
	"math"
	"path/filepath"
	"testing"

	"github.com/baton-serving/baton/engine/gguf"
	"github.com/baton-serving/baton/kernels/quant"
)

// TestGenModelStds: --output-std sets the std of output.weight only, and
// --qk-std that of the query and key weights (attn_q, attn_k) only; the
// other weights keep --std; a negative value of either is refused.
func TestGenModelStds(t *testing.T) {
	for _, tc := range []struct {
		flag string
		args []string
		want map[string]float64 // tensor: std
	}{
		{"--output-std", []string{"--std", "0.1", "--output-std", "2"},
			map[string]float64{"output.weight": 2, "token_embd.weight": 0.1, "blk.0.ffn_down.weight": 0.1}},
		{"--qk-std", []string{"--std", "1", "--qk-std", "0.125"},
			map[string]float64{"blk.0.attn_q.weight": 0.125, "blk.1.attn_k.weight": 0.125, "blk.0.attn_v.weight": 1, "output.weight": 1}},
	} {
		t.Run(tc.flag, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "m.gguf")
			r := call(context.Background(), wrap(GenModel, append([]string{"--preset", "tiny", "--out", out}, tc.args...)...))
			if r.code != 0 {
				t.Fatalf("gen-model: exit %d, %q %q", r.code, r.stdout, r.stderr)
			}
			f, err := gguf.Open(out)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			for name, want := range tc.want {
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
			if r := call(context.Background(), wrap(GenModel, "--preset", "tiny", tc.flag, "-1", "--out", out)); r.code != 2 {
				t.Errorf("%s -1: exit %d, %q", tc.flag, r.code, r.stderr)
			}
		})
	}
}

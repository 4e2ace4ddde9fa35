package runcmd

import (
	"context"
	"math"
	"path/filepath"
	"strings"
	"testing"

	"github.com/baton-serving/baton/engine/gguf"
	"github.com/baton-serving/baton/engine/model/arch"
	"github.com/baton-serving/baton/kernels/quant"
)

// TestGenModelArch writes a file of non-llama architectures with --arch,
// --head-dim, --window and --std, checks what the file declares (the
// architecture's keys and tensors, the std of its weights), and runs it.
func TestGenModelArch(t *testing.T) {
	for _, tc := range []struct {
		arch   string
		extra  []string
		tensor string // a tensor only this architecture has
		key    string
		val    uint64 // key's value, when not 0
	}{
		{"qwen2", nil, "blk.1.attn_k.bias", "qwen2.block_count", 0},
		{"qwen3", []string{"--head-dim", "32"}, "blk.0.attn_q_norm.weight", "qwen3.attention.key_length", 32},
		// --window, one flag for the sliding window of every architecture
		// that has one.
		{"gemma2", []string{"--window", "16"}, "blk.0.post_ffw_norm.weight", "gemma2.attention.sliding_window", 16},
		{"phi3", []string{"--window", "16"}, "blk.0.attn_qkv.weight", "phi3.attention.sliding_window", 16},
	} {
		t.Run(tc.arch, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), tc.arch+".gguf")
			args := append([]string{"--preset", "tiny", "--arch", tc.arch, "--std", "0.5", "--out", out}, tc.extra...)
			r := call(context.Background(), wrap(GenModel, args...))
			if r.code != 0 || !strings.Contains(r.stdout, "wrote "+out+": "+tc.arch) {
				t.Fatalf("gen-model: exit %d, %q %q", r.code, r.stdout, r.stderr)
			}
			f, err := gguf.Open(out)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if a, _ := f.String("general.architecture"); a != tc.arch {
				t.Errorf("general.architecture %q", a)
			}
			if _, ok := f.Tensor(tc.tensor); !ok {
				t.Errorf("no %s", tc.tensor)
			}
			if _, ok := f.Get(tc.key); !ok {
				t.Errorf("no %s", tc.key)
			}
			if v, _ := f.Uint(tc.key); tc.val != 0 && v != tc.val {
				t.Errorf("%s = %d, want %d", tc.key, v, tc.val)
			}
			info, _ := f.Tensor("blk.0.ffn_down.weight")
			w := make([]float32, info.NumElements())
			if err := quant.Dequantize(info.Type, f.TensorData(info), w); err != nil {
				t.Fatal(err)
			}
			var sq float64
			for _, v := range w {
				sq += float64(v) * float64(v)
			}
			if std := math.Sqrt(sq / float64(len(w))); math.Abs(std-0.5) > 0.02 {
				t.Errorf("weights std %.4f, want 0.5", std)
			}
			v := decodeRun(t, runCmd(t, "--model", out, "--prompt", "Hello world", "-n", "4", "--temperature", "0", "--json"))
			if len(v.GeneratedIDs) == 0 {
				t.Errorf("run on the generated %s model: %+v", tc.arch, v)
			}
		})
	}
	for _, tc := range []struct {
		args []string
		text string
	}{
		{[]string{"--arch", "gptj"}, `architecture "gptj" is not registered (registered: ` + strings.Join(arch.Names(), ", ") + ")"},
		{[]string{"--std", "-1"}, "std = -1"},
		{[]string{"--head-dim", "7"}, "head dimension 7 is odd"},
		{[]string{"--arch", "gemma2", "--window", "257"}, "window = 257, want [0, context 256]"},
		{[]string{"--arch", "gemma3", "--rope-base", "-5"}, "rope base -5 out of range"},
	} {
		r := call(context.Background(), wrap(GenModel, append([]string{"--preset", "tiny", "--out", filepath.Join(t.TempDir(), "x.gguf")}, tc.args...)...))
		if r.code != 2 || !strings.Contains(r.stderr, tc.text) {
			t.Errorf("%v: exit %d, stderr %q; want 2 mentioning %q", tc.args, r.code, r.stderr, tc.text)
		}
	}
}

package runcmd

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/baton-serving/baton/engine/gguf"
)

// TestGenModelArchFlags: a flag the architecture ignores (its key is not
// one the architecture has, or llama.cpp derives the value) is refused,
// naming the flag and the architecture, before anything is written, even
// at its default value; the architecture-specific flags an architecture
// reads are written under llama.cpp's keys.
func TestGenModelArchFlags(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		args []string
		text string
	}{
		{[]string{"--window", "8"}, "--window: architecture llama ignores window: it has no llama.attention.sliding_window"},
		{[]string{"--window", "0"}, "--window: architecture llama ignores window"},
		{[]string{"--arch", "qwen2", "--head-dim", "32"}, "architecture qwen2 ignores head-dim: llama.cpp derives it"},
		{[]string{"--arch", "phi3", "--head-dim", "32"}, "architecture phi3 ignores head-dim"},
		{[]string{"--rope-dim", "8"}, "architecture llama ignores rope-dim: llama.cpp rotates its whole heads"},
		{[]string{"--arch", "gemma2", "--swa-pattern", "3"}, "--swa-pattern: architecture gemma2 ignores swa-pattern: it has no gemma2.attention.sliding_window_pattern"},
		{[]string{"--arch", "phi3", "--rope-base-local", "500"}, "--rope-base-local: architecture phi3 ignores rope-base-local: it has no phi3.rope.freq_base_swa"},
		{[]string{"--arch", "qwen3", "--final-softcap", "5"}, "--final-softcap: architecture qwen3 ignores final-softcap"},
		{[]string{"--preset", "tiny-phi3", "--arch", "llama"}, "architecture llama ignores window"}, // the preset's window
		{[]string{"--arch", "gemma3", "--rope-base-local", "0"}, "--rope-base-local 0: want a number > 0"},
	} {
		out := filepath.Join(dir, "x.gguf")
		r := call(context.Background(), wrap(GenModel, append([]string{"--preset", "tiny", "--out", out}, tc.args...)...))
		if r.code != 2 || !strings.Contains(r.stderr, tc.text) {
			t.Errorf("%v: exit %d, stderr %q; want 2 mentioning %q", tc.args, r.code, r.stderr, tc.text)
		}
		if _, err := os.Stat(out); err == nil {
			t.Errorf("%v: wrote %s", tc.args, out)
			os.Remove(out)
		}
	}
	for _, tc := range []struct {
		args []string
		keys map[string]float64
	}{
		{[]string{"--arch", "gemma3", "--rope-base-local", "500", "--swa-pattern", "2", "--final-softcap", "5"},
			map[string]float64{"gemma3.rope.freq_base_swa": 500, "gemma3.attention.sliding_window_pattern": 2, "gemma3.final_logit_softcapping": 5}},
		{[]string{"--arch", "gemma2", "--final-softcap", "12"}, map[string]float64{"gemma2.final_logit_softcapping": 12}},
		{[]string{"--arch", "phi3", "--rope-dim", "12"}, map[string]float64{"phi3.rope.dimension_count": 12}},
		{[]string{"--arch", "qwen2", "--head-dim", "16"}, map[string]float64{"qwen2.embedding_length": 64}}, // dim/heads: no change
	} {
		out := filepath.Join(dir, "ok.gguf")
		r := call(context.Background(), wrap(GenModel, append([]string{"--preset", "tiny", "--out", out}, tc.args...)...))
		if r.code != 0 {
			t.Errorf("%v: exit %d, %q", tc.args, r.code, r.stderr)
			continue
		}
		f, err := gguf.Open(out)
		if err != nil {
			t.Fatal(err)
		}
		for k, want := range tc.keys {
			if v, ok := f.Float(k); !ok || v != want {
				t.Errorf("%v: %s = %v (%v), want %v", tc.args, k, v, ok, want)
			}
		}
		f.Close()
	}
}

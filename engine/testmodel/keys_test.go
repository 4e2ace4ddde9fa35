package testmodel

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/baton-serving/baton/engine"
	"github.com/baton-serving/baton/engine/gguf"
	"github.com/baton-serving/baton/engine/model"
	"github.com/baton-serving/baton/engine/model/arch"
	"github.com/baton-serving/baton/kernels/quant"
)

// TestArchSettings: the settings only some architectures read (Gemma 3's
// local rope base and window pattern, the final soft-cap, a partial
// rotation, phi3's longrope factors at its rotated width) are written
// under the keys llama.cpp d32676d reads, only when set, and
// engine/model reads them back; an architecture that ignores one refuses
// it, naming the setting and the architecture.
func TestArchSettings(t *testing.T) {
	dir := t.TempDir()
	open := func(name string, s Spec) *gguf.File {
		t.Helper()
		path := filepath.Join(dir, name+".gguf")
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
	base := Spec{Dim: 64, Hidden: 96, Layers: 2, Heads: 4, KVHeads: 2, Vocab: MinVocab, Context: 64, Type: quant.F32, Seed: 1}

	g3 := base
	g3.Arch = "gemma3"
	plain := open("gemma3", g3)
	for _, k := range []string{"rope.freq_base_swa", "attention.sliding_window_pattern", "final_logit_softcapping"} {
		if _, ok := plain.Get("gemma3." + k); ok {
			t.Errorf("gemma3 with the defaults: gemma3.%s written", k)
		}
	}
	g3.RopeBaseLocal, g3.SWAPattern, g3.FinalSoftCap = 500, 2, 5
	f := open("gemma3-set", g3)
	if v, _ := f.Float("gemma3.rope.freq_base_swa"); v != 500 {
		t.Errorf("rope.freq_base_swa %v", v)
	}
	if v, _ := f.Uint("gemma3.attention.sliding_window_pattern"); v != 2 {
		t.Errorf("attention.sliding_window_pattern %v", v)
	}
	if v, _ := f.Float("gemma3.final_logit_softcapping"); v != 5 {
		t.Errorf("final_logit_softcapping %v", v)
	}
	c, _, err := model.Inspect(f, 0)
	if err != nil || c.RopeBaseLocal != 500 || c.SWAPattern != 2 || c.FinalSoftCap != 5 {
		t.Errorf("read back: local base %v, pattern %d, final soft-cap %v (%v)", c.RopeBaseLocal, c.SWAPattern, c.FinalSoftCap, err)
	}

	g2 := base
	g2.Arch, g2.FinalSoftCap = "gemma2", 12
	if c, _, err := model.Inspect(open("gemma2", g2), 0); err != nil || c.FinalSoftCap != 12 {
		t.Errorf("gemma2 final soft-cap %v (%v)", c.FinalSoftCap, err)
	}

	// Phi-4-mini's shape: 12 of 16 head dimensions rotated, longrope
	// factors of 6.
	p := base
	p.Arch, p.RopeDim, p.LongRope, p.RopeOrigContext = "phi3", 12, true, 16
	f = open("phi4mini", p)
	if v, _ := f.Uint("phi3.rope.dimension_count"); v != 12 {
		t.Errorf("rope.dimension_count %d", v)
	}
	for _, name := range []string{"rope_factors_long.weight", "rope_factors_short.weight"} {
		if info, ok := f.Tensor(name); !ok || len(info.Dims) != 1 || info.Dims[0] != 6 {
			t.Errorf("%s: %v", name, info)
		}
	}
	m, err := model.Load(f, model.Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	m.Close()

	for _, tc := range []struct {
		edit func(*Spec)
		text string
	}{
		{func(s *Spec) { s.SlidingWindow = 8 }, "architecture llama ignores window: it has no llama.attention.sliding_window"},
		{func(s *Spec) { s.Arch, s.SWAPattern = "gemma2", 3 }, "architecture gemma2 ignores swa-pattern: it has no gemma2.attention.sliding_window_pattern"},
		{func(s *Spec) { s.Arch, s.RopeBaseLocal = "phi3", 500 }, "architecture phi3 ignores rope-base-local"},
		{func(s *Spec) { s.Arch, s.FinalSoftCap = "qwen3", 5 }, "architecture qwen3 ignores final-softcap"},
		{func(s *Spec) { s.RopeDim = 8 }, "architecture llama ignores rope-dim: llama.cpp rotates its whole heads"},
		{func(s *Spec) { s.Arch, s.HeadDim = "qwen2", 8 }, "architecture qwen2 ignores head-dim"},
		{func(s *Spec) { s.Arch, s.HeadDim = "phi3", 32 }, "architecture phi3 ignores head-dim"},
		{func(s *Spec) { s.Arch, s.RopeDim = "phi3", 7 }, "rope-dim = 7, want an even number in [0, head dimension 16]"},
	} {
		s := base
		tc.edit(&s)
		if err := s.Validate(); !errors.Is(err, engine.ErrInvalidInput) || !strings.Contains(err.Error(), tc.text) {
			t.Errorf("Validate = %v, want ErrInvalidInput containing %q", err, tc.text)
		}
	}
	// The head dimension the heads fill anyway is no change: accepted.
	s := base
	s.Arch, s.HeadDim = "qwen2", 16
	if err := s.Validate(); err != nil {
		t.Errorf("qwen2 with head-dim = dim/heads: %v", err)
	}
	if err := Uses(&arch.Arch{Name: "x"}, "tied"); err == nil || !strings.Contains(err.Error(), `unknown setting "tied"`) {
		t.Errorf("Uses of an unknown setting: %v", err)
	}
}

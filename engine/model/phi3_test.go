package model

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/baton-serving/baton/engine"
	"github.com/baton-serving/baton/engine/gguf"
	"github.com/baton-serving/baton/engine/model/arch"
	"github.com/baton-serving/baton/kernels"
)

// phi3Prompt runs through the phi3 tests: a prompt and decoded tokens.
var phi3Prompt = []int32{1, 270, 281, 299, 17, 263, 290, 275}

// refFor is the reference reading of f, as loaded with context window ctx
// (0: the file's): rope factors and their attention factor as llama.cpp
// picks them, read here from the file by name.
func refFor(t *testing.T, f *gguf.File, m Model) *refModel {
	c := m.Config()
	r := &refModel{f: f, c: c, neox: c.RopeLayout == kernels.RopeNeoX}
	orig, ok := f.Uint(c.Architecture + ".rope.scaling.original_context_length")
	if !ok {
		orig = uint64(c.TrainContextLength)
	}
	name := "rope_factors_short.weight"
	if uint64(c.ContextLength) > orig {
		name = "rope_factors_long.weight"
	}
	r.factors = r.tensor(t, name)
	if a, ok := f.Float(c.Architecture + ".rope.scaling.attn_factor"); ok {
		r.mscale = a
	}
	return r
}

func checkRef(t *testing.T, r *refModel, got [][]float32, prompt int) {
	t.Helper()
	for i := range got {
		want := r.logits(t, phi3Prompt[:prompt+i])
		if e := relLogitErr(want, got[i]); e > 1e-4 {
			t.Errorf("position %d: relative logit error %.3g against the reference", prompt-1+i, e)
		}
	}
}

// TestPhi3FusedSplit: a phi3 file and the same weights stored unfused
// (attn_q/k/v, ffn_gate/up, bound through a table of plain matrices) give
// bit-identical logits, so the fused rows go to the right roles in the
// right order (queries, keys, values; gate, then up).
func TestPhi3FusedSplit(t *testing.T) {
	s := archSpecs()["phi3"]
	f := writeModel(t, s)
	fm := load(t, f, Options{Threads: 1})
	want := run(t, fm, phi3Prompt[:4], phi3Prompt[4:])
	c := fm.Config()

	rowBytes := 4 * c.Dim
	g := rewriteKVs(t, f, nil, nil)
	w := gguf.NewWriter()
	for _, e := range g.KVs {
		w.AddKV(e.Key, e.Value)
	}
	for _, info := range f.Tensors {
		data := f.TensorData(&info)
		var l int
		var rest string
		fmt.Sscanf(info.Name, "blk.%d.%s", &l, &rest)
		p := fmt.Sprintf("blk.%d.", l)
		switch {
		case strings.HasPrefix(info.Name, "blk.") && rest == "attn_qkv.weight":
			q, k := c.QDim()*rowBytes, c.KVDim()*rowBytes
			w.AddTensor(p+"attn_q.weight", info.Type, []uint64{uint64(c.Dim), uint64(c.QDim())}, data[:q])
			w.AddTensor(p+"attn_k.weight", info.Type, []uint64{uint64(c.Dim), uint64(c.KVDim())}, data[q:q+k])
			w.AddTensor(p+"attn_v.weight", info.Type, []uint64{uint64(c.Dim), uint64(c.KVDim())}, data[q+k:])
		case strings.HasPrefix(info.Name, "blk.") && rest == "ffn_up.weight":
			h := c.Hidden * rowBytes
			w.AddTensor(p+"ffn_gate.weight", info.Type, []uint64{uint64(c.Dim), uint64(c.Hidden)}, data[:h])
			w.AddTensor(p+"ffn_up.weight", info.Type, []uint64{uint64(c.Dim), uint64(c.Hidden)}, data[h:])
		default:
			w.AddTensor(info.Name, info.Type, info.Dims, data)
		}
	}
	path := t.TempDir() + "/unfused.gguf"
	if err := w.WriteFile(path); err != nil {
		t.Fatal(err)
	}
	uf, err := gguf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer uf.Close()
	a := mustArch(t, "phi3")
	var ts []arch.Tensor
	for _, tn := range a.Tensors {
		switch tn.Name {
		case "blk.%d.attn_qkv.weight":
			ts = append(ts, arch.Mat("blk.%d.attn_q.weight", arch.Wq, arch.QDim, arch.Dim),
				arch.Mat("blk.%d.attn_k.weight", arch.Wk, arch.KVDim, arch.Dim), arch.Mat("blk.%d.attn_v.weight", arch.Wv, arch.KVDim, arch.Dim))
		case "blk.%d.ffn_up.weight":
			ts = append(ts, arch.Mat("blk.%d.ffn_gate.weight", arch.Gate, arch.Hidden, arch.Dim), arch.Mat("blk.%d.ffn_up.weight", arch.Up, arch.Hidden, arch.Dim))
		default:
			ts = append(ts, tn)
		}
	}
	a.Tensors = ts
	um, err := loadDecoder(uf, a, c, Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer um.Close()
	got := run(t, um, phi3Prompt[:4], phi3Prompt[4:])
	for i := range want {
		if !slices.Equal(want[i], got[i]) {
			t.Fatalf("step %d: the fused file's logits differ from the unfused file's (first %v vs %v)", i, want[i][:3], got[i][:3])
		}
	}
	// And both are what phi3 computes: the reference reads the fused
	// tensors by row range, silu on the first half of ffn_up.
	checkRef(t, refFor(t, f, fm), want, 4)
}

// TestPhi3LongRope: a 128k-style file (longrope factors, an original
// context of 16 in a context of 64) uses rope_factors_long when the
// context window in use exceeds 16 and rope_factors_short otherwise, with
// rope.scaling.attn_factor on cos and sin either way, as llama.cpp does;
// the two choices compute differently, and the fingerprint tells them
// apart (a prefill and a decode worker must pick the same).
func TestPhi3LongRope(t *testing.T) {
	s := archSpecs()["phi3"]
	s.LongRope, s.RopeOrigContext = true, 16
	f := writeModel(t, s)
	if a, ok := f.Float("phi3.rope.scaling.attn_factor"); !ok || math.Abs(a-math.Sqrt(1+math.Log(4)/math.Log(16))) > 1e-6 {
		t.Fatalf("attn_factor %v %v", a, ok)
	}
	logits := map[int][][]float32{}
	fps := map[int]string{}
	for _, ctx := range []int{0, 17, 16, 8} {
		m := load(t, f, Options{Threads: 2, ContextLength: ctx})
		c := m.Config()
		if wantLong := ctx == 0 || ctx == 17; c.LongRope() != wantLong || c.RopeOrigContext != 16 {
			t.Fatalf("context %d: LongRope %v, original context %d", ctx, c.LongRope(), c.RopeOrigContext)
		}
		got := run(t, m, phi3Prompt[:3], phi3Prompt[3:6])
		checkRef(t, refFor(t, f, m), got, 3)
		logits[ctx], fps[ctx] = got, m.Fingerprint()
		if _, fp, err := Inspect(f, ctx); err != nil || fp != fps[ctx] {
			t.Errorf("context %d: Inspect fingerprint %s (%v), Load %s", ctx, fp, err, fps[ctx])
		}
	}
	if relLogitErr(logits[0][2], logits[16][2]) < 1e-2 {
		t.Error("long and short factors give the same logits")
	}
	if !slices.Equal(logits[0][2], logits[17][2]) || !slices.Equal(logits[16][2], logits[8][2]) {
		t.Error("the same factors give different logits")
	}
	if fps[0] != fps[17] || fps[16] != fps[8] || fps[0] == fps[16] {
		t.Errorf("fingerprints: long %s %s, short %s %s", fps[0], fps[17], fps[16], fps[8])
	}
}

// TestPhi3SlidingWindow: with attention.sliding_window 3 every layer
// attends to its last 3 positions (llama.cpp masks pq − pk ≥ n_swa), in a
// prompt and in decoding; the same file without the window computes
// something else, so the window is really applied. A window at least the
// context window masks nothing and runs on a backend without ExtendedOps.
func TestPhi3SlidingWindow(t *testing.T) {
	s := archSpecs()["phi3"]
	s.SlidingWindow = 3
	f := writeModel(t, s)
	m := load(t, f, Options{Threads: 2})
	got := run(t, m, phi3Prompt[:5], phi3Prompt[5:])
	if c := m.Config(); c.SlidingWindow != 3 || c.SWAPattern != 0 {
		t.Fatalf("window %d, pattern %d; want 3 on every layer", c.SlidingWindow, c.SWAPattern)
	}
	r := refFor(t, f, m)
	r.c.SlidingWindow = 3 // every layer (SWAPattern 0)
	checkRef(t, r, got, 5)
	r.c.SlidingWindow = 0
	if e := relLogitErr(r.logits(t, phi3Prompt), got[len(got)-1]); e < 1e-2 {
		t.Errorf("without the window the reference differs by %.3g only", e)
	}

	plain := plainBackend{kernels.NewCPU(1)}
	defer plain.Close()
	_, err := Load(f, Options{Backend: plain})
	if !errors.Is(err, engine.ErrUnsupported) || !strings.Contains(err.Error(), "sliding-window attention (a window of 3 positions)") {
		t.Fatalf("Load on a backend without ExtendedOps: %v", err)
	}
	s.SlidingWindow = s.Context
	wide, err := Load(writeModel(t, s), Options{Backend: plain})
	if err != nil {
		t.Fatalf("a window the size of the context: %v", err)
	}
	wide.Close()
}

// plainBackend is the CPU backend seen through kernels.Backend alone, as
// a backend without ExtendedOps (the CUDA one today) is.
type plainBackend struct{ kernels.Backend }

// TestRopeAttnFactor: rope.scaling.attn_factor multiplies cos and sin for
// every architecture, as llama.cpp reads it for every one (it was ignored
// before); NumericsLlamaCpp, which does not emulate it, refuses the file.
func TestRopeAttnFactor(t *testing.T) {
	for _, name := range []string{"llama", "qwen2"} {
		f := writeModel(t, archSpecs()[name])
		g := rewriteKVs(t, f, setKVs(map[string]any{name + ".rope.scaling.attn_factor": float32(1.5)}), nil)
		m := load(t, g, Options{Threads: 2})
		got := run(t, m, phi3Prompt[:3], phi3Prompt[3:5])
		r := refFor(t, g, m)
		if r.mscale != 1.5 {
			t.Fatalf("mscale %v", r.mscale)
		}
		checkRef(t, r, got, 3)
		if name == "llama" {
			_, err := Load(g, Options{Numerics: NumericsLlamaCpp})
			if !errors.Is(err, engine.ErrUnsupported) {
				t.Errorf("NumericsLlamaCpp with an attn_factor: %v", err)
			}
		}
	}
}

// TestPhi3BadInput: mis-shaped fused tensors, longrope factors of the
// wrong length or not positive, inconsistent metadata — each a clear
// error naming it.
func TestPhi3BadInput(t *testing.T) {
	s := archSpecs()["phi3"]
	s.LongRope, s.RopeOrigContext = true, 16
	reshape := func(name string, dims ...uint64) func(gguf.TensorInfo, []byte) (gguf.TensorInfo, []byte, bool) {
		return func(info gguf.TensorInfo, data []byte) (gguf.TensorInfo, []byte, bool) {
			if info.Name == name {
				info.Dims = dims
				n := 1
				for _, d := range dims {
					n *= int(d)
				}
				data = append(slices.Clone(data), make([]byte, 4*n)...)[:4*n]
			}
			return info, data, true
		}
	}
	setFactor := func(name string, i int, v float32) func(gguf.TensorInfo, []byte) (gguf.TensorInfo, []byte, bool) {
		return func(info gguf.TensorInfo, data []byte) (gguf.TensorInfo, []byte, bool) {
			if info.Name == name {
				data = slices.Clone(data)
				binary.LittleEndian.PutUint32(data[4*i:], math.Float32bits(v))
			}
			return info, data, true
		}
	}
	tests := []struct {
		name   string
		kv     kvEdit
		tensor func(gguf.TensorInfo, []byte) (gguf.TensorInfo, []byte, bool)
		want   error
		text   string
	}{
		{"qkv rows", nil, reshape("blk.1.attn_qkv.weight", 64, 100), engine.ErrInvalidInput, "tensor blk.1.attn_qkv.weight has dims [64 100], want [64 128]"},
		{"qkv cols", nil, reshape("blk.0.attn_qkv.weight", 32, 128), engine.ErrInvalidInput, "tensor blk.0.attn_qkv.weight has dims [32 128], want [64 128]"},
		{"gate+up rows", nil, reshape("blk.0.ffn_up.weight", 64, 96), engine.ErrInvalidInput, "tensor blk.0.ffn_up.weight has dims [64 96], want [64 192]"},
		{"long factors length", nil, reshape("rope_factors_long.weight", 4), engine.ErrInvalidInput, "tensor rope_factors_long.weight has dims [4], want [8]"},
		{"short factors length", nil, reshape("rope_factors_short.weight", 16), engine.ErrInvalidInput, "tensor rope_factors_short.weight has dims [16], want [8]"},
		{"zero factor", nil, setFactor("rope_factors_short.weight", 3, 0), engine.ErrInvalidInput, "rope_factors_short.weight[3] = 0, want a finite number > 0"},
		{"negative factor", nil, setFactor("rope_factors_long.weight", 0, -2), engine.ErrInvalidInput, "rope_factors_long.weight[0] = -2, want a finite number > 0"},
		{"NaN factor", nil, setFactor("rope_factors_long.weight", 7, float32(math.NaN())), engine.ErrInvalidInput, "rope_factors_long.weight[7] = NaN"},
		{"infinite factor", nil, setFactor("rope_factors_long.weight", 1, float32(math.Inf(1))), engine.ErrInvalidInput, "rope_factors_long.weight[1] = +Inf"},
		{"no window key", setKVs(map[string]any{"phi3.attention.sliding_window": nil}), nil, engine.ErrInvalidInput, "required key phi3.attention.sliding_window is missing"},
		{"window type", setKVs(map[string]any{"phi3.attention.sliding_window": "wide"}), nil, engine.ErrInvalidInput, `phi3.attention.sliding_window = "wide", want an integer`},
		{"head width", setKVs(map[string]any{"phi3.attention.key_length": uint32(8), "phi3.attention.value_length": uint32(8), "phi3.rope.dimension_count": uint32(8)}), nil,
			engine.ErrInvalidInput, "phi3 needs head_count × key_length = embedding_length"},
		{"attn factor", setKVs(map[string]any{"phi3.rope.scaling.attn_factor": float32(-1)}), nil, engine.ErrInvalidInput, "phi3.rope.scaling.attn_factor = -1, want a finite number > 0"},
		{"orig context", setKVs(map[string]any{"phi3.rope.scaling.original_context_length": uint32(0)}), nil, engine.ErrInvalidInput, "phi3.rope.scaling.original_context_length = 0"},
		{"scaling type", setKVs(map[string]any{"phi3.rope.scaling.type": "su"}), nil, engine.ErrUnsupported, `phi3.rope.scaling.type "su" is not supported (supported: none, linear, yarn, longrope)`},
	}
	f := writeModel(t, s)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			g := rewriteKVs(t, f, tc.kv, tc.tensor)
			_, err := Load(g, Options{Threads: 1})
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.text) {
				t.Fatalf("Load = %v, want %v containing %q", err, tc.want, tc.text)
			}
		})
	}
}

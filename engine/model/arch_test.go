package model

import (
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/baton-serving/baton/engine"
	"github.com/baton-serving/baton/engine/gguf"
	"github.com/baton-serving/baton/engine/model/arch"
	"github.com/baton-serving/baton/engine/testmodel"
	"github.com/baton-serving/baton/kernels"
	"github.com/baton-serving/baton/kernels/quant"
)

// archSpecs are small files of every registered architecture, with a std
// large enough for the logits to spread, for qwen3 a head width that is
// not dim/heads, and for those with a sliding window one of 3 positions,
// which the 5-token runs reach past (phi3: every layer; Gemma: gemmaSpec).
func archSpecs() map[string]testmodel.Spec {
	base := testmodel.Spec{Dim: 64, Hidden: 96, Layers: 2, Heads: 4, KVHeads: 2, Vocab: 300, Context: 64, Type: quant.F32, Seed: 3, Std: 0.3}
	out := map[string]testmodel.Spec{}
	for _, name := range arch.Names() {
		s := base
		s.Arch = name
		switch name {
		case "qwen3":
			s.HeadDim = 24
		case "phi3":
			s.SlidingWindow = 3
		}
		gemmaSpec(&s)
		out[name] = s
	}
	return out
}

// refModel is a straightforward float64 reading of what each architecture
// computes, written from the tensor names and llama.cpp's build functions
// (not from the decoder or the tables): it reads tensors by name, so a
// binding that put a weight in the wrong role, a bias added at the wrong
// place or the wrong RoPE pairing shows up as a logit difference.
type refModel struct {
	f *gguf.File
	// c's scales, soft-caps and sliding window (SlidingWindow in its
	// Local layers: every phi3 layer, Gemma's local ones) apply as score
	// (gemma_test.go) reads them.
	c    Config
	neox bool
	gelu bool // GeGLU (gemma_test.go) instead of SwiGLU
	// RoPE beyond the plain rotation: frequency divisors (rope_freqs,
	// phi3's long or short factors) and the multiplier of cos and sin
	// (attn_factor; 0 means 1).
	factors []float64
	mscale  float64
}

// matrix reads block l's matrix name, or its rows of a fused tensor: the
// q, k, v rows of phi3's attn_qkv, the gate and up rows of its ffn_up.
func (r *refModel) matrix(t testing.TB, l int, name string) []float64 {
	p := fmt.Sprintf("blk.%d.", l)
	c := r.c
	if _, ok := r.f.Tensor(p + "attn_qkv.weight"); ok {
		qkv := r.tensor(t, p+"attn_qkv.weight")
		q, k := c.QDim()*c.Dim, c.KVDim()*c.Dim
		switch name {
		case "attn_q.weight":
			return qkv[:q]
		case "attn_k.weight":
			return qkv[q : q+k]
		case "attn_v.weight":
			return qkv[q+k:]
		}
	}
	if _, ok := r.f.Tensor(p + "ffn_gate.weight"); !ok && (name == "ffn_gate.weight" || name == "ffn_up.weight") {
		gu := r.tensor(t, p+"ffn_up.weight")
		if name == "ffn_gate.weight" {
			return gu[:len(gu)/2]
		}
		return gu[len(gu)/2:]
	}
	return r.tensor(t, p+name)
}

func (r *refModel) tensor(t testing.TB, name string) []float64 {
	info, ok := r.f.Tensor(name)
	if !ok {
		return nil
	}
	v := make([]float32, info.NumElements())
	if err := quant.Dequantize(info.Type, r.f.TensorData(info), v); err != nil {
		t.Fatal(err)
	}
	out := make([]float64, len(v))
	for i, x := range v {
		out[i] = float64(x)
	}
	return out
}

// matVec is w·x for w of len(x) columns.
func matVec(w, x []float64) []float64 {
	n := len(w) / len(x)
	out := make([]float64, n)
	for r := range n {
		var s float64
		for i, xv := range x {
			s += w[r*len(x)+i] * xv
		}
		out[r] = s
	}
	return out
}

func addTo(x, b []float64) {
	for i := range b {
		x[i] += b[i]
	}
}

// rmsRows normalizes each row of len(w) elements of x, in place.
func rmsRows(x, w []float64, eps float64) {
	for lo := 0; lo < len(x); lo += len(w) {
		row := x[lo : lo+len(w)]
		var ss float64
		for _, v := range row {
			ss += v * v
		}
		s := 1 / math.Sqrt(ss/float64(len(row))+eps)
		for i := range row {
			row[i] *= s * w[i]
		}
	}
}

func (r *refModel) rope(x []float64, pos int) {
	c := r.c
	half := c.RopeDim / 2
	for h := 0; h < len(x); h += c.HeadDim {
		v := x[h : h+c.HeadDim]
		for i := range half {
			th := float64(pos) * math.Pow(float64(c.RopeBase), -float64(2*i)/float64(c.RopeDim))
			if r.factors != nil {
				th /= r.factors[i]
			}
			th *= float64(c.RopeScale)
			s, co := math.Sincos(th)
			if r.mscale != 0 {
				s, co = s*r.mscale, co*r.mscale
			}
			a, b := 2*i, 2*i+1
			if r.neox {
				a, b = i, i+half
			}
			v[a], v[b] = v[a]*co-v[b]*s, v[a]*s+v[b]*co
		}
	}
}

// logits runs tokens from position 0 and returns the last one's logits.
func (r *refModel) logits(t testing.TB, tokens []int32) []float32 {
	c := r.c
	eps := float64(c.NormEps)
	emb := r.tensor(t, "token_embd.weight")
	xs := make([][]float64, len(tokens))
	for i, id := range tokens {
		xs[i] = slices.Clone(emb[int(id)*c.Dim : (int(id)+1)*c.Dim])
		scaleBy(xs[i], c.EmbedScale)
	}
	for l := range c.Layers {
		w := func(s string) []float64 { return r.tensor(t, fmt.Sprintf("blk.%d.%s", l, s)) }
		mw := func(s string) []float64 { return r.matrix(t, l, s) }
		ks, vs := make([][]float64, len(tokens)), make([][]float64, len(tokens))
		qs := make([][]float64, len(tokens))
		for p, x := range xs {
			h := slices.Clone(x)
			rmsRows(h, w("attn_norm.weight"), eps)
			q, k, v := matVec(mw("attn_q.weight"), h), matVec(mw("attn_k.weight"), h), matVec(mw("attn_v.weight"), h)
			addTo(q, w("attn_q.bias"))
			addTo(k, w("attn_k.bias"))
			addTo(v, w("attn_v.bias"))
			if qn := w("attn_q_norm.weight"); qn != nil {
				rmsRows(q, qn, eps)
				rmsRows(k, w("attn_k_norm.weight"), eps)
			}
			r.ropeAt(q, p, l)
			r.ropeAt(k, p, l)
			scaleBy(q, c.QueryScale)
			qs[p], ks[p], vs[p] = q, k, v
		}
		for p, x := range xs {
			att := make([]float64, c.QDim())
			for h := range c.Heads {
				kh := h / (c.Heads / c.KVHeads)
				q := qs[p][h*c.HeadDim : (h+1)*c.HeadDim]
				sc := make([]float64, p+1)
				mx := math.Inf(-1)
				for j := range p + 1 {
					var d float64
					for i, qv := range q {
						d += qv * ks[j][kh*c.HeadDim+i]
					}
					sc[j] = r.score(d, p-j, l)
					mx = max(mx, sc[j])
				}
				var sum float64
				for j := range sc {
					sc[j] = math.Exp(sc[j] - mx)
					sum += sc[j]
				}
				for j := range sc {
					for i := range c.HeadDim {
						att[h*c.HeadDim+i] += sc[j] / sum * vs[j][kh*c.HeadDim+i]
					}
				}
			}
			o := matVec(w("attn_output.weight"), att)
			addTo(o, w("attn_output.bias"))
			if pn := w("post_attention_norm.weight"); pn != nil {
				rmsRows(o, pn, eps)
			}
			addTo(x, o)
			h := slices.Clone(x)
			rmsRows(h, w("ffn_norm.weight"), eps)
			g, u := matVec(mw("ffn_gate.weight"), h), matVec(mw("ffn_up.weight"), h)
			for i := range g {
				g[i] = r.act(g[i]) * u[i]
			}
			d := matVec(w("ffn_down.weight"), g)
			if pn := w("post_ffw_norm.weight"); pn != nil {
				rmsRows(d, pn, eps)
			}
			addTo(x, d)
		}
	}
	x := xs[len(xs)-1]
	rmsRows(x, r.tensor(t, "output_norm.weight"), eps)
	out := r.tensor(t, "output.weight")
	if out == nil {
		out = emb
	}
	lg := matVec(out, x)
	if fc := float64(c.FinalSoftCap); fc > 0 {
		for i := range lg {
			lg[i] = fc * math.Tanh(lg[i]/fc)
		}
	}
	res := make([]float32, len(lg))
	for i, v := range lg {
		res[i] = float32(v)
	}
	return res
}

// TestArchitecturesMatchReference runs a small file of every registered
// architecture through Forward, prefill and decode, and compares the
// logits with the float64 reference. The decoder computes in float32, so
// agreement is to rounding: max |Δlogit| ≤ 1e-4 × std(logits).
func TestArchitecturesMatchReference(t *testing.T) {
	prompt := []int32{1, 270, 281, 299, 17}
	for name, s := range archSpecs() {
		t.Run(name, func(t *testing.T) {
			f := writeModel(t, s)
			m := load(t, f, Options{Threads: 2})
			c := m.Config()
			if c.Architecture != name || c.HeadDim != s.Config(mustArch(t, name)).HeadDim {
				t.Fatalf("config %+v", c)
			}
			ref := &refModel{f: f, c: c, neox: c.RopeLayout == kernels.RopeNeoX, gelu: mustArch(t, name).Act == arch.GELU}
			got := run(t, m, prompt[:3], prompt[3:])
			for i := range got {
				want := ref.logits(t, prompt[:3+i])
				if e := relLogitErr(want, got[i]); e > 1e-4 {
					t.Errorf("position %d: relative logit error %.3g", 2+i, e)
				}
			}
			// The std makes the logits spread: a greedy comparison has
			// margins to work with.
			if sd := stddev(got[0]); sd < 0.5 {
				t.Errorf("logit std %.3g with weight std %g: too flat", sd, s.Std)
			}
		})
	}
}

func mustArch(t testing.TB, name string) *arch.Arch {
	a, ok := arch.Lookup(name)
	if !ok {
		t.Fatalf("no architecture %s", name)
	}
	return a
}

func stddev(v []float32) float64 {
	var m, s float64
	for _, x := range v {
		m += float64(x)
	}
	m /= float64(len(v))
	for _, x := range v {
		s += (float64(x) - m) * (float64(x) - m)
	}
	return math.Sqrt(s / float64(len(v)))
}

// TestFusedTensors binds a llama file whose q, k, v and gate, up matrices
// are fused into one tensor each (as phi3 files store them) through a
// table of Fused declarations: the row split must hand each role its own
// rows, so the logits are exactly those of the unfused file.
func TestFusedTensors(t *testing.T) {
	s := archSpecs()["llama"]
	f := writeModel(t, s)
	want := run(t, load(t, f, Options{Threads: 1}), []int32{1, 280, 290}, []int32{300 - 1})

	w := gguf.NewWriter()
	for _, e := range f.KVs {
		w.AddKV(e.Key, e.Value)
	}
	data := func(name string) []byte {
		info, _ := f.Tensor(name)
		return f.TensorData(info)
	}
	c := m0Config(t, f)
	for _, info := range f.Tensors {
		var l int
		var rest string
		if _, err := fmt.Sscanf(info.Name, "blk.%d.%s", &l, &rest); err == nil {
			p := fmt.Sprintf("blk.%d.", l)
			switch rest {
			case "attn_q.weight":
				qkv := slices.Concat(data(p+"attn_q.weight"), data(p+"attn_k.weight"), data(p+"attn_v.weight"))
				w.AddTensor(p+"attn_qkv.weight", info.Type, []uint64{uint64(c.Dim), uint64(c.QDim() + 2*c.KVDim())}, qkv)
				continue
			case "attn_k.weight", "attn_v.weight", "ffn_up.weight":
				continue
			case "ffn_gate.weight":
				gu := slices.Concat(data(p+"ffn_gate.weight"), data(p+"ffn_up.weight"))
				w.AddTensor(p+"ffn_up.weight", info.Type, []uint64{uint64(c.Dim), uint64(2 * c.Hidden)}, gu)
				continue
			}
		}
		w.AddTensor(info.Name, info.Type, info.Dims, f.TensorData(&info))
	}
	path := filepath.Join(t.TempDir(), "fused.gguf")
	if err := w.WriteFile(path); err != nil {
		t.Fatal(err)
	}
	g, err := gguf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()

	fused := mustArch(t, "llama")
	var ts []arch.Tensor
	for _, tn := range fused.Tensors {
		switch tn.Name {
		case "blk.%d.attn_q.weight":
			tn = arch.Fused("blk.%d.attn_qkv.weight", arch.Dim, arch.Part{Role: arch.Wq, Rows: arch.QDim},
				arch.Part{Role: arch.Wk, Rows: arch.KVDim}, arch.Part{Role: arch.Wv, Rows: arch.KVDim})
		case "blk.%d.attn_k.weight", "blk.%d.attn_v.weight", "blk.%d.ffn_gate.weight":
			continue
		case "blk.%d.ffn_up.weight":
			tn = arch.Fused("blk.%d.ffn_up.weight", arch.Dim, arch.Part{Role: arch.Gate, Rows: arch.Hidden}, arch.Part{Role: arch.Up, Rows: arch.Hidden})
		}
		ts = append(ts, tn)
	}
	fused.Tensors = ts
	fm, err := loadDecoder(g, fused, c, Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer fm.Close()
	got := run(t, fm, []int32{1, 280, 290}, []int32{300 - 1})
	for i := range want {
		if !slices.Equal(want[i], got[i]) {
			t.Fatalf("step %d: fused logits differ from the unfused file's (first %v vs %v)", i, got[i][:3], want[i][:3])
		}
	}
}

func m0Config(t testing.TB, f *gguf.File) Config {
	c, _, err := Inspect(f, 0)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestArchLoadErrors: per-architecture bad input is a clear error naming
// the tensor or setting, never a panic.
func TestArchLoadErrors(t *testing.T) {
	specs := archSpecs()
	drop := func(name string) func(gguf.TensorInfo, []byte) (gguf.TensorInfo, []byte, bool) {
		return func(info gguf.TensorInfo, data []byte) (gguf.TensorInfo, []byte, bool) {
			return info, data, info.Name != name
		}
	}
	reshape := func(name string, dims ...uint64) func(gguf.TensorInfo, []byte) (gguf.TensorInfo, []byte, bool) {
		return func(info gguf.TensorInfo, data []byte) (gguf.TensorInfo, []byte, bool) {
			if info.Name == name {
				info.Dims = dims
				data = data[:4*info.NumElements()]
			}
			return info, data, true
		}
	}
	setKV := func(key string, val any) kvEdit { return setKVs(map[string]any{key: val}) }
	tests := []struct {
		arch, name string
		kv         kvEdit
		tensor     func(gguf.TensorInfo, []byte) (gguf.TensorInfo, []byte, bool)
		want       error
		text       string
	}{
		{"qwen2", "required bias", nil, drop("blk.1.attn_k.bias"), engine.ErrInvalidInput, "tensor blk.1.attn_k.bias is missing"},
		{"qwen2", "bias shape", nil, reshape("blk.0.attn_v.bias", 16), engine.ErrInvalidInput, "tensor blk.0.attn_v.bias has dims [16], want [32]"},
		{"qwen3", "q norm missing", nil, drop("blk.0.attn_q_norm.weight"), engine.ErrInvalidInput, "tensor blk.0.attn_q_norm.weight is missing"},
		{"qwen3", "k norm shape", nil, reshape("blk.1.attn_k_norm.weight", 12), engine.ErrInvalidInput, "tensor blk.1.attn_k_norm.weight has dims [12], want [24]"},
		{"qwen3", "key length", setKVs(map[string]any{"qwen3.attention.key_length": uint32(16), "qwen3.attention.value_length": uint32(16), "qwen3.rope.dimension_count": uint32(16)}), nil,
			engine.ErrInvalidInput, "tensor blk.0.attn_q.weight has dims [64 96], want [64 64]"},
		{"qwen3", "rope dims", setKV("qwen3.rope.dimension_count", uint32(26)), nil, engine.ErrInvalidInput, "rope.dimension_count 26 must be even and at most the head dimension 24"},
		{"qwen3", "value length", setKV("qwen3.attention.value_length", uint32(16)), nil, engine.ErrUnsupported, "value_length 16 differs from key_length 24"},
		{"qwen2", "heads", setKV("qwen2.attention.head_count_kv", uint32(3)), nil, engine.ErrInvalidInput, "head_count 4 is not a multiple of head_count_kv 3"},
		{"qwen2", "heads divide dim", setKV("qwen2.attention.head_count", uint32(5)), nil, engine.ErrInvalidInput, "embedding_length 64 is not a multiple of head_count 5"},
		{"qwen2", "rope scaling type", setKVs(map[string]any{"qwen2.rope.scaling.type": "llama3", "qwen2.rope.scaling.factor": float32(4)}), nil,
			engine.ErrUnsupported, `rope.scaling.type "llama3" is not supported (supported: none, linear, yarn, longrope)`},
		{"llama", "yarn context", setKVs(map[string]any{"llama.rope.scaling.type": "yarn", "llama.rope.scaling.original_context_length": "x"}), nil,
			engine.ErrInvalidInput, `rope.scaling.original_context_length = "x"`},
		{"llama", "attn factor", setKVs(map[string]any{"llama.rope.scaling.attn_factor": float32(-2)}), nil,
			engine.ErrInvalidInput, "rope.scaling.attn_factor = -2"},
		{"qwen3", "relabelled llama", setKV("general.architecture", "llama"), nil, engine.ErrInvalidInput, "required key llama.embedding_length is missing"},
		{"qwen3", "relabelled qwen2", relabel("qwen3", "qwen2"), nil, engine.ErrInvalidInput, "tensor blk.0.attn_q.bias is missing"},
		{"qwen2", "relabelled qwen3", relabel("qwen2", "qwen3"), nil, engine.ErrInvalidInput, "tensor blk.0.attn_q_norm.weight is missing"},
		{"llama", "unknown", setKV("general.architecture", "gemma7"), nil, engine.ErrUnsupported, `architecture "gemma7" is not supported (supported: ` + strings.Join(Architectures(), ", ") + ")"},
	}
	for _, tc := range tests {
		t.Run(tc.arch+"/"+tc.name, func(t *testing.T) {
			f := writeModel(t, specs[tc.arch])
			g := rewriteKVs(t, f, tc.kv, tc.tensor)
			_, err := Load(g, Options{Threads: 1})
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.text) {
				t.Fatalf("Load = %v, want %v containing %q", err, tc.want, tc.text)
			}
		})
	}
}

// TestExtendedHooksRefused: a model that needs the kernels' ExtendedOps
// (GELU, soft-caps, sliding windows, …) fails to load on a backend without
// them, with ErrUnsupported naming what it needs, instead of computing
// something else; on the CPU backend, which has them, it loads.
func TestExtendedHooksRefused(t *testing.T) {
	a := mustArch(t, "llama")
	cpu := kernels.NewCPU(1)
	defer cpu.Close()
	plain := opaque{cpu} // kernels.Backend alone: no ExtendedOps
	for _, tc := range []struct {
		set  func(*Config, *arch.Arch)
		text string
	}{
		{func(c *Config, _ *arch.Arch) { c.EmbedScale = 8 }, "embedding scale"},
		{func(c *Config, _ *arch.Arch) { c.FinalSoftCap = 30 }, "final logit soft-cap"},
		{func(c *Config, _ *arch.Arch) { c.AttnSoftCap = 50 }, "attention soft-cap"},
		{func(c *Config, _ *arch.Arch) { c.RopeBaseLocal = 1e4 }, "per-layer rope base"},
		{func(c *Config, _ *arch.Arch) { c.AttnScale = 0.1 }, "attention scale"},
		{func(c *Config, _ *arch.Arch) { c.QueryScale = 0.1 }, "query scale"},
		{func(_ *Config, a *arch.Arch) { a.Act = arch.GELU }, "gelu activation"},
		{func(c *Config, _ *arch.Arch) { c.Layers, c.ContextLength, c.SlidingWindow, c.SWAPattern = 4, 64, 16, 2 }, "sliding-window attention (a window of 16 positions)"},
		{func(c *Config, _ *arch.Arch) { c.Layers, c.ContextLength, c.SlidingWindow = 4, 64, 63 }, "sliding-window attention (a window of 63 positions)"},
	} {
		c, aa := Config{}, *a
		tc.set(&c, &aa)
		_, err := extendedOps(&aa, c, plain)
		if !errors.Is(err, engine.ErrUnsupported) || !strings.Contains(err.Error(), tc.text) || !strings.Contains(err.Error(), "no kernels.ExtendedOps") {
			t.Errorf("%s: %v", tc.text, err)
		}
		if ext, err := extendedOps(&aa, c, cpu); ext == nil || err != nil {
			t.Errorf("%s on the CPU backend: %v, %v", tc.text, ext, err)
		}
	}
	// A window that masks nothing (at least the context window in use), or
	// one on global layers only, needs nothing.
	for _, c := range []Config{{}, {Layers: 4, ContextLength: 64, SlidingWindow: 64}, {Layers: 4, ContextLength: 64, SlidingWindow: 16, SWAPattern: 1}} {
		if ext, err := extendedOps(a, c, plain); ext != nil || err != nil {
			t.Errorf("plain llama with %+v: %v, %v", c, ext, err)
		}
	}
}

// kvEdit maps each metadata entry to its new value (false: drop it). Asked
// for the key "", it returns entries to add (a map[string]any) or an
// architecture to rename every {arch}.* key to (a renameTo).
type kvEdit func(key string, v gguf.Value) (any, bool)

type renameTo string

// setKVs sets (adds or replaces) the given entries; a nil value drops one.
func setKVs(kvs map[string]any) kvEdit {
	return func(k string, v gguf.Value) (any, bool) {
		if k == "" {
			return kvs, true
		}
		if val, ok := kvs[k]; ok {
			return val, val != nil
		}
		return v, true
	}
}

// relabel turns a file of architecture from into one of to, its
// from.* keys renamed to.*.
func relabel(from, to string) kvEdit {
	return func(k string, v gguf.Value) (any, bool) {
		switch k {
		case "":
			return renameTo(to), true
		case "general.architecture":
			return to, true
		}
		return v, true
	}
}

// rewriteKVs is rewrite with kvEdit's additions and renames.
func rewriteKVs(t testing.TB, f *gguf.File, kv kvEdit, tensor func(gguf.TensorInfo, []byte) (gguf.TensorInfo, []byte, bool)) *gguf.File {
	t.Helper()
	w := gguf.NewWriter()
	from, _ := f.String("general.architecture")
	var add map[string]any
	var to renameTo
	if kv != nil {
		if a, ok := kv("", gguf.Value{}); ok {
			add, _ = a.(map[string]any)
			to, _ = a.(renameTo)
		}
	}
	for _, e := range f.KVs {
		key, val, keep := e.Key, any(e.Value), true
		if kv != nil {
			val, keep = kv(e.Key, e.Value)
		}
		if _, ok := add[key]; !keep || ok {
			continue // dropped, or set below
		}
		if rest, ok := strings.CutPrefix(key, from+"."); ok && to != "" {
			key = string(to) + "." + rest
		}
		if err := w.AddKV(key, val); err != nil {
			t.Fatal(err)
		}
	}
	for k, v := range add {
		if v != nil {
			if err := w.AddKV(k, v); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, info := range f.Tensors {
		data, keep := f.TensorData(&info), true
		if tensor != nil {
			info, data, keep = tensor(info, data)
		}
		if keep {
			if err := w.AddTensor(info.Name, info.Type, info.Dims, data); err != nil {
				t.Fatal(err)
			}
		}
	}
	path := filepath.Join(t.TempDir(), "edited.gguf")
	if err := w.WriteFile(path); err != nil {
		t.Fatal(err)
	}
	g, err := gguf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	return g
}

// TestHugeBlockCount: a block_count far beyond the tensors the file holds
// is refused before anything is sized by it (FuzzLoad found a 16-bit
// block_count stalling Load on 200 MB of per-layer tables; 2^24 would
// have asked for 50 GB).
func TestHugeBlockCount(t *testing.T) {
	f := writeModel(t, archSpecs()["llama"])
	g := rewriteKVs(t, f, setKVs(map[string]any{"llama.block_count": uint32(200000)}), nil)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	_, err := Load(g, Options{Threads: 1})
	runtime.ReadMemStats(&after)
	if !errors.Is(err, engine.ErrInvalidInput) || !strings.Contains(err.Error(), "block_count 200000, but the file holds only") {
		t.Errorf("Load = %v, want ErrInvalidInput naming block_count 200000", err)
	}
	if n := after.TotalAlloc - before.TotalAlloc; n > 16<<20 {
		t.Errorf("Load allocated %d MB before refusing", n>>20)
	}
}

// TestYaRN checks the YaRN table against its definition (pairs that turn
// fast over the original context keep their angle, slow ones are
// interpolated, the magnitude is corrected) and that a file declaring
// YaRN loads with it and computes differently from the same file without.
// (Greedy ids on such files match llama.cpp c392e50's: docs/models.md.)
func TestYaRN(t *testing.T) {
	c := Config{RopeBase: 10000, RopeScale: 0.25, RopeDim: 64, RopeYarnOrigCtx: 32}
	cos, sin := make([]float32, 32), make([]float32, 32)
	plainCos, plainSin := make([]float32, 32), make([]float32, 32)
	interpCos, interpSin := make([]float32, 32), make([]float32, 32)
	const pos = 17
	ropeTable(cos, sin, pos, c, nil)
	kernels.RopeTable(plainCos, plainSin, pos, c.RopeBase, 1, nil)
	kernels.RopeTable(interpCos, interpSin, pos, c.RopeBase, c.RopeScale, nil)
	mscale := 1 + 0.1*math.Log(4)
	// lo = floor(64·ln(32/(32·2π))/(2·ln 1e4)) < 0 → 0; hi = ceil(64·ln(32/2π)/(2·ln 1e4)) = 6.
	for i := range cos {
		var wc, ws float32
		switch {
		case i == 0:
			wc, ws = plainCos[i], plainSin[i]
		case i >= 6:
			wc, ws = interpCos[i], interpSin[i]
		default:
			continue // mixed
		}
		if math.Abs(float64(cos[i])-float64(wc)*mscale) > 1e-6 || math.Abs(float64(sin[i])-float64(ws)*mscale) > 1e-6 {
			t.Errorf("pair %d: (%v, %v), want (%v, %v)·%.4f", i, cos[i], sin[i], wc, ws, mscale)
		}
	}
	// Without YaRN or an attention factor it is RopeTable itself.
	c.RopeYarnOrigCtx = 0
	ropeTable(cos, sin, pos, c, nil)
	if !slices.Equal(cos, interpCos) || !slices.Equal(sin, interpSin) {
		t.Error("ropeTable without YaRN differs from kernels.RopeTable")
	}

	f := writeModel(t, archSpecs()["llama"])
	y := rewriteKVs(t, f, setKVs(map[string]any{"llama.rope.scaling.type": "yarn", "llama.rope.scaling.factor": float32(4),
		"llama.rope.scaling.original_context_length": uint32(32)}), nil)
	m := load(t, y, Options{Threads: 1})
	if got := m.Config(); got.RopeYarnOrigCtx != 32 || got.RopeScale != 0.25 {
		t.Fatalf("config: YaRN context %d, scale %v", got.RopeYarnOrigCtx, got.RopeScale)
	}
	prompt := []int32{1, 270, 281, 299, 17, 30}
	if a, b := run(t, m, prompt, nil)[0], run(t, load(t, f, Options{Threads: 1}), prompt, nil)[0]; slices.Equal(a, b) {
		t.Error("YaRN changes nothing")
	}
	if _, err := Load(y, Options{Numerics: NumericsLlamaCpp}); !errors.Is(err, engine.ErrUnsupported) {
		t.Errorf("llama.cpp numerics with YaRN: %v", err)
	}
}

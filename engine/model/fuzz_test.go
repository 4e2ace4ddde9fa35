package model

import (
	"bytes"
	"errors"
	"math"
	"path/filepath"
	"testing"

	"github.com/baton-serving/baton/engine"
	"github.com/baton-serving/baton/engine/gguf"
	"github.com/baton-serving/baton/engine/model/arch"
	"github.com/baton-serving/baton/engine/testmodel"
	"github.com/baton-serving/baton/kernels/quant"
)

// fuzzBase is one small generated file of an architecture, parsed.
type fuzzBase struct {
	f    *gguf.File
	keys []string // its {arch}.* metadata keys
}

func fuzzBases(f *testing.F) []fuzzBase {
	var out []fuzzBase
	for _, name := range arch.Names() {
		s := testmodel.Spec{Arch: name, Dim: 32, Hidden: 48, Layers: 2, Heads: 4, KVHeads: 2, Vocab: testmodel.MinVocab,
			Context: 32, Type: quant.F32, Seed: 1, Std: 0.5}
		if name == "qwen3" {
			s.HeadDim = 12
		}
		path := filepath.Join(f.TempDir(), name+".gguf")
		if err := testmodel.Write(path, s); err != nil {
			f.Fatal(err)
		}
		g, err := gguf.Open(path)
		if err != nil {
			f.Fatal(err)
		}
		f.Cleanup(func() { g.Close() })
		a, _ := arch.Lookup(name)
		var keys []string
		for _, kv := range arch.Keys(a, s.Config(a)) {
			keys = append(keys, kv.Key)
		}
		keys = append(keys, name+".rope.scaling.factor", name+".rope.scaling.type", name+".expert_count")
		out = append(out, fuzzBase{f: g, keys: keys})
	}
	return out
}

// FuzzLoad loads small generated files of every architecture with their
// metadata and tensors mutated as ops says (4 bytes an edit: set an
// integer or float key, re-shape, drop or re-type a tensor, relabel the
// architecture). Whatever the edits, Inspect and Load return a model or an
// error wrapping engine.ErrInvalidInput or engine.ErrUnsupported, never
// panic; a model that loads runs a token.
func FuzzLoad(f *testing.F) {
	bases := fuzzBases(f)
	f.Add(uint8(0), []byte{})
	f.Add(uint8(1), []byte{0, 4, 3, 0})             // qwen2: head_count = 3
	f.Add(uint8(2), []byte{1, 12, 0, 7})            // qwen3: a tensor re-shaped
	f.Add(uint8(1), []byte{2, 5, 0, 0})             // a tensor dropped
	f.Add(uint8(0), []byte{3, 2, 0, 0})             // relabelled
	f.Add(uint8(2), []byte{4, 6, 2, 0, 0, 1, 0, 0}) // a float key, then block_count
	f.Add(uint8(0), []byte{0, 6, 1, 0, 0, 0, 0, 1}) // rope dims, then context
	f.Fuzz(func(t *testing.T, which uint8, ops []byte) {
		base := bases[int(which)%len(bases)]
		src := base.f
		kvs := make(map[string]any, len(src.KVs))
		var order []string
		for _, e := range src.KVs {
			kvs[e.Key] = e.Value
			order = append(order, e.Key)
		}
		type tens struct {
			name string
			typ  quant.Type
			dims []uint64
			data []byte
		}
		var ts []tens
		for i := range src.Tensors {
			info := &src.Tensors[i]
			ts = append(ts, tens{info.Name, info.Type, append([]uint64(nil), info.Dims...), src.TensorData(info)})
		}
		set := func(k string, v any) {
			if _, ok := kvs[k]; !ok {
				order = append(order, k)
			}
			kvs[k] = v
		}
		floats := []float32{0, -1, float32(math.NaN()), float32(math.Inf(1)), 1e-30, 1e30, 0.5, 4}
		for len(ops) >= 4 && len(ts) > 0 {
			op, a, b, c := ops[0], int(ops[1]), ops[2], ops[3]
			ops = ops[4:]
			switch op % 6 {
			case 0: // an integer key
				set(base.keys[a%len(base.keys)], uint32(b)|uint32(c)<<8)
			case 1: // re-shape a tensor, its data resized to match
				t := &ts[a%len(ts)]
				t.dims[int(b)%len(t.dims)] = uint64(c)
				n := uint64(1)
				for _, d := range t.dims {
					n *= d
				}
				rb, err := quant.RowBytes(t.typ, n)
				if err != nil {
					continue
				}
				d := make([]byte, rb)
				copy(d, t.data)
				t.data = d
			case 2: // drop a tensor
				i := a % len(ts)
				ts = append(ts[:i], ts[i+1:]...)
			case 3: // relabel the architecture
				names := append(arch.Names(), "gpt-j", "")
				set("general.architecture", names[a%len(names)])
			case 4: // a float key
				set(base.keys[a%len(base.keys)], floats[int(b)%len(floats)])
			case 5: // a string key (rope.scaling.type and the like)
				vals := []string{"linear", "yarn", "none", "longrope", ""}
				set(base.keys[a%len(base.keys)], vals[int(b)%len(vals)])
			}
		}
		w := gguf.NewWriter()
		for _, k := range order {
			if err := w.AddKV(k, kvs[k]); err != nil {
				return // a value the writer refuses (an empty string key)
			}
		}
		for _, t := range ts {
			if err := w.AddTensor(t.name, t.typ, t.dims, t.data); err != nil {
				return
			}
		}
		var buf bytes.Buffer
		if _, err := w.WriteTo(&buf); err != nil {
			return
		}
		g, err := gguf.Parse(buf.Bytes())
		if err != nil {
			return // not a file any more: gguf's own fuzzing covers this
		}
		checkErr := func(what string, err error) {
			if err != nil && !errors.Is(err, engine.ErrInvalidInput) && !errors.Is(err, engine.ErrUnsupported) {
				t.Fatalf("%s: %v wraps neither ErrInvalidInput nor ErrUnsupported", what, err)
			}
		}
		_, _, err = Inspect(g, 0)
		checkErr("Inspect", err)
		m, err := Load(g, Options{Threads: 1})
		checkErr("Load", err)
		if err != nil {
			return
		}
		defer m.Close()
		cache, err := NewContiguousCache(m.Config(), min(m.Config().ContextLength, 8))
		if err != nil {
			checkErr("cache", err)
			return
		}
		logits := make([]float32, m.Config().Vocab)
		if err := m.Forward([]int32{1}, 0, cache, logits); err != nil {
			t.Fatalf("Forward on a model that loaded: %v", err)
		}
	})
}

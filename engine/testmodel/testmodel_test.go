package testmodel

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/baton-serving/baton/engine"
	"github.com/baton-serving/baton/engine/gguf"
	"github.com/baton-serving/baton/engine/model/arch"
	"github.com/baton-serving/baton/engine/tokenizer"
	"github.com/baton-serving/baton/kernels/quant"
)

func tiny(t *testing.T) Spec {
	t.Helper()
	s, ok := Preset("tiny")
	if !ok {
		t.Fatal("no tiny preset")
	}
	return s
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name string
		set  func(*Spec)
		want string
		err  error
	}{
		{"zero dim", func(s *Spec) { s.Dim = 0 }, "dim = 0", engine.ErrInvalidInput},
		{"heads", func(s *Spec) { s.Heads = 5 }, "not a multiple of heads", engine.ErrInvalidInput},
		{"kv heads", func(s *Spec) { s.KVHeads = 3 }, "not a multiple of kv-heads", engine.ErrInvalidInput},
		{"odd head dim", func(s *Spec) { s.Dim, s.Heads, s.KVHeads = 36, 4, 4 }, "odd", engine.ErrInvalidInput},
		{"small vocab", func(s *Spec) { s.Vocab = 259 }, "vocab = 259", engine.ErrInvalidInput},
		{"k-quant rows", func(s *Spec) { s.Type = quant.Q4_K }, "multiples of it", engine.ErrInvalidInput},
		{"q8 rows", func(s *Spec) { s.Dim, s.Hidden, s.Type = 64, 100, quant.Q8_0 }, "blocks of 32", engine.ErrInvalidInput},
		{"unsupported type", func(s *Spec) { s.Type = quant.IQ2_XXS }, "not supported", engine.ErrUnsupported},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := tiny(t)
			tc.set(&s)
			err := s.Validate()
			if !errors.Is(err, tc.err) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate = %v, want %v containing %q", err, tc.err, tc.want)
			}
			if err := Write(filepath.Join(t.TempDir(), "m.gguf"), s); err == nil {
				t.Fatal("Write accepted an invalid spec")
			}
		})
	}
	for _, name := range Presets() {
		s, _ := Preset(name)
		if err := s.Validate(); err != nil {
			t.Errorf("preset %s: %v", name, err)
		}
		// Every type whose blocks divide the rows stores the preset; the
		// others are refused naming the block size (Qwen2.5-0.5B's 896 and
		// Gemma-3-1B's 1152 are not multiples of 256, as in llama.cpp,
		// whose quantizer falls back to another type for them).
		for _, typ := range quant.SupportedTypes() {
			s.Type = typ
			bs := typ.BlockSize()
			fits := s.Dim%bs == 0 && s.Hidden%bs == 0 && s.Heads*s.headDim()%bs == 0
			err := s.Validate()
			switch {
			case fits && err != nil:
				t.Errorf("preset %s as %s: %v", name, typ, err)
			case !fits && (err == nil || !strings.Contains(err.Error(), fmt.Sprintf("%s stores rows in blocks of %d", typ, bs))):
				t.Errorf("preset %s as %s: %v, want the block size named", name, typ, err)
			}
		}
	}
	if s, _ := Preset("tinyllama-1.1b"); s.Params() < 1_000_000_000 || s.Params() > 1_200_000_000 {
		t.Errorf("tinyllama-1.1b has %d parameters", s.Params())
	}
}

func TestVocabulary(t *testing.T) {
	tokens, scores, types := Vocabulary(1000, 7)
	if len(tokens) != 1000 || len(scores) != 1000 || len(types) != 1000 {
		t.Fatalf("sizes %d %d %d", len(tokens), len(scores), len(types))
	}
	seen := map[string]bool{}
	for i, tok := range tokens {
		if seen[tok] {
			t.Fatalf("token %q (id %d) repeats", tok, i)
		}
		seen[tok] = true
	}
	if tokens[0] != "<unk>" || tokens[1] != "<s>" || tokens[2] != "</s>" || tokens[3] != "<0x00>" || tokens[258] != "<0xFF>" {
		t.Errorf("special/byte layout wrong: %q", tokens[:5])
	}
	again, _, _ := Vocabulary(1000, 7)
	other, _, _ := Vocabulary(1000, 8)
	if strings.Join(again, " ") != strings.Join(tokens, " ") {
		t.Error("same seed gave a different vocabulary")
	}
	if strings.Join(other, " ") == strings.Join(tokens, " ") {
		t.Error("different seeds gave the same vocabulary")
	}
	// The smallest vocabulary still has a text piece.
	if tk, _, _ := Vocabulary(MinVocab, 1); len(tk) != MinVocab || tk[259] != "▁" {
		t.Errorf("minimal vocabulary ends %q", tk[255:])
	}
}

func TestWriteTiny(t *testing.T) {
	s := tiny(t)
	dir := t.TempDir()
	path := filepath.Join(dir, "tiny.gguf")
	var calls int
	var last, total int64
	if err := WriteProgress(context.Background(), path, s, func(d, tot int64) { calls++; last, total = d, tot }); err != nil {
		t.Fatal(err)
	}
	if calls == 0 || last != total {
		t.Errorf("progress: %d calls, ended at %d of %d", calls, last, total)
	}
	f, err := gguf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if a, _ := f.String("general.architecture"); a != "llama" {
		t.Errorf("architecture %q", a)
	}
	for key, want := range map[string]uint64{
		"llama.embedding_length": 64, "llama.feed_forward_length": 192, "llama.block_count": 2,
		"llama.attention.head_count": 4, "llama.attention.head_count_kv": 2, "llama.context_length": 256,
		"llama.rope.dimension_count": 16, "llama.vocab_size": 512,
	} {
		if v, ok := f.Uint(key); !ok || v != want {
			t.Errorf("%s = %d (%v), want %d", key, v, ok, want)
		}
	}
	wantTensors := 1 + 9*s.Layers + 1 + 1
	if len(f.Tensors) != wantTensors {
		t.Errorf("%d tensors, want %d", len(f.Tensors), wantTensors)
	}
	// The stored F32 weights are exactly the generator's values.
	info, _ := f.Tensor("blk.1.ffn_down.weight")
	if info.Dims[0] != 192 || info.Dims[1] != 64 {
		t.Fatalf("ffn_down dims %v", info.Dims)
	}
	got := make([]float32, 192*64)
	if err := quant.Dequantize(quant.F32, f.TensorData(info), got); err != nil {
		t.Fatal(err)
	}
	want := Weights(s.Seed, "blk.1.ffn_down.weight", 64, 192)
	var sum, sq float64
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("element %d = %v, want %v", i, got[i], want[i])
		}
		sum += float64(got[i])
		sq += float64(got[i]) * float64(got[i])
	}
	mean, std := sum/float64(len(got)), math.Sqrt(sq/float64(len(got)))
	if math.Abs(mean) > 0.001 || math.Abs(std-WeightStd) > 0.001 {
		t.Errorf("weights mean %.5f std %.5f, want 0 and %g", mean, std, WeightStd)
	}
	norm, _ := f.Tensor("blk.0.attn_norm.weight")
	nv := make([]float32, 64)
	quant.Dequantize(norm.Type, f.TensorData(norm), nv)
	if len(norm.Dims) != 1 || nv[0] != 1 || nv[63] != 1 {
		t.Errorf("norm dims %v values %v", norm.Dims, nv[:2])
	}

	// The tokenizer reads the vocabulary and round-trips plain text.
	tok, err := tokenizer.FromGGUF(f)
	if err != nil {
		t.Fatal(err)
	}
	text := "Hello, world! 123 (ok)"
	ids := tok.Encode(text, tokenizer.EncodeOptions{AddSpecial: true})
	if len(ids) < 2 || ids[0] != 1 {
		t.Fatalf("ids %v", ids)
	}
	if got := tok.Decode(ids[1:]); got != text {
		t.Errorf("round trip %q → %v → %q", text, ids, got)
	}

	// Writing again gives the same bytes; leftovers of the temporary file
	// are gone.
	path2 := filepath.Join(dir, "again.gguf")
	if err := Write(path2, s); err != nil {
		t.Fatal(err)
	}
	a, _ := os.ReadFile(path)
	b, _ := os.ReadFile(path2)
	if !bytes.Equal(a, b) {
		t.Error("two writes of the same spec differ")
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 2 {
		t.Errorf("directory holds %d entries, want 2", len(entries))
	}
}

func TestWriteTypesAndTied(t *testing.T) {
	for _, typ := range quant.SupportedTypes() {
		s := Spec{Dim: 256, Hidden: 256, Layers: 1, Heads: 4, KVHeads: 1, Vocab: MinVocab, Context: 32, Type: typ, Tied: true, Seed: 3}
		path := filepath.Join(t.TempDir(), "m.gguf")
		if err := Write(path, s); err != nil {
			t.Fatalf("%s: %v", typ, err)
		}
		f, err := gguf.Open(path)
		if err != nil {
			t.Fatalf("%s: %v", typ, err)
		}
		if _, ok := f.Tensor("output.weight"); ok {
			t.Errorf("%s: tied model has output.weight", typ)
		}
		q, _ := f.Tensor("blk.0.attn_q.weight")
		if q.Type != typ {
			t.Errorf("attn_q is %s, want %s", q.Type, typ)
		}
		// The stored row dequantizes close to the generator's values.
		row := make([]float32, 256)
		rb, _ := quant.RowBytes(typ, 256)
		quant.Dequantize(typ, f.TensorData(q)[:rb], row)
		want := Weights(s.Seed, "blk.0.attn_q.weight", 1, 256)
		var errSq float64
		for i := range row {
			errSq += math.Pow(float64(row[i]-want[i]), 2)
		}
		// Relative RMS error: 4-bit types ~0.1, 8-bit and 16-bit far less;
		// Q3_K ~0.15 and Q2_K ~0.3.
		limit := 0.15
		if typ == quant.Q2_K || typ == quant.Q3_K {
			limit = 0.35
		}
		if rel := math.Sqrt(errSq/256) / WeightStd; rel > limit {
			t.Errorf("%s: relative RMS error %.3f of the stored row", typ, rel)
		}
		f.Close()
	}
}

func TestWriteCancelled(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	s, _ := Preset("llama-110m")
	err := WriteProgress(ctx, filepath.Join(dir, "m.gguf"), s, nil)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("cancelled write left %d files", len(entries))
	}
}

// TestWriteEveryArch writes each registered architecture and checks the
// file against the declaration it came from: every required tensor of the
// table (per block), no other, shapes as the table says, Params the
// file's element count, and the metadata arch.Keys gives.
func TestWriteEveryArch(t *testing.T) {
	for _, name := range arch.Names() {
		t.Run(name, func(t *testing.T) {
			a, _ := arch.Lookup(name)
			s := tiny(t)
			s.Arch, s.HeadDim, s.Std = name, 8, 0.5
			if a.SquareAttn {
				s.HeadDim = 0 // heads fill the embedding: Validate refuses another width
			}
			path := filepath.Join(t.TempDir(), name+".gguf")
			if err := Write(path, s); err != nil {
				t.Fatal(err)
			}
			f, err := gguf.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			c := s.Config(a)
			want := map[string][]uint64{}
			for _, tn := range a.Tensors {
				if tn.Optional && !(tn.Parts[0].Role == arch.Output && !s.Tied) {
					continue
				}
				for l := range s.Layers {
					dims := []uint64{uint64(tn.Cols(c)), uint64(tn.Rows(c))}
					if tn.Vector {
						dims = dims[:1]
					}
					want[tn.NameAt(l)] = dims
				}
			}
			var elems int64
			for _, info := range f.Tensors {
				w, ok := want[info.Name]
				if !ok || !slices.Equal(w, info.Dims) {
					t.Errorf("tensor %s %v, table says %v (declared: %v)", info.Name, info.Dims, w, ok)
				}
				delete(want, info.Name)
				elems += int64(info.NumElements())
			}
			if len(want) > 0 {
				t.Errorf("tensors missing from the file: %v", want)
			}
			if elems != s.Params() {
				t.Errorf("Params %d, file holds %d elements", s.Params(), elems)
			}
			for _, kv := range arch.Keys(a, c) {
				if _, ok := f.Get(kv.Key); !ok {
					t.Errorf("metadata %s missing", kv.Key)
				}
			}
			if kl, ok := f.Uint(name + ".attention.key_length"); s.HeadDim != 0 && (!ok || kl != 8) {
				t.Errorf("key_length %d (%v), want 8", kl, ok)
			}
		})
	}
	s := tiny(t)
	s.Arch, s.HeadDim, s.Type = "qwen3", 10, quant.Q8_0
	if err := s.Validate(); err == nil || !strings.Contains(err.Error(), "heads×head-dim 40") {
		t.Errorf("qwen3 rows of 40 in Q8_0 blocks: %v", err)
	}
	s.Arch = "nope"
	if err := s.Validate(); !errors.Is(err, engine.ErrUnsupported) {
		t.Errorf("unknown architecture: %v", err)
	}
}

package gguf

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/baton-serving/baton/engine/refdata"
	"github.com/baton-serving/baton/kernels/quant"
)

const storiesSHA256 = "047bf46455a544931cff6fef14d7910154c56afbc23ab1c5e56a72e69912c04b"

func storiesPath(t testing.TB) string {
	t.Helper()
	p := refdata.Model(t)
	fh, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	h := sha256.New()
	if _, err := io.Copy(h, fh); err != nil {
		t.Fatal(err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != storiesSHA256 {
		t.Fatalf("%s has sha256 %s, want %s", p, got, storiesSHA256)
	}
	return p
}

func TestStories260K(t *testing.T) {
	path := storiesPath(t)
	f, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()

	if f.Version != 3 || f.Alignment != 32 || f.DataOffset%32 != 0 {
		t.Errorf("version %d alignment %d data offset %d", f.Version, f.Alignment, f.DataOffset)
	}
	if f.Size() != 1185376 {
		t.Errorf("size %d, want 1185376", f.Size())
	}
	if len(f.KVs) != 19 {
		t.Errorf("%d KVs, want 19", len(f.KVs))
	}

	str := map[string]string{
		"general.architecture": "llama",
		"general.name":         "llama",
		"tokenizer.ggml.model": "llama",
	}
	for k, want := range str {
		if got, ok := f.String(k); got != want || !ok {
			t.Errorf("%s = %q, %v; want %q", k, got, ok, want)
		}
	}
	uints := map[string]uint64{
		"llama.context_length":              128,
		"llama.embedding_length":            64,
		"llama.feed_forward_length":         172,
		"llama.attention.head_count":        8,
		"llama.attention.head_count_kv":     4,
		"llama.block_count":                 5,
		"llama.rope.dimension_count":        8,
		"tokenizer.ggml.unknown_token_id":   0,
		"tokenizer.ggml.bos_token_id":       1,
		"tokenizer.ggml.eos_token_id":       2,
		"tokenizer.ggml.seperator_token_id": 0xFFFFFFFF,
		"tokenizer.ggml.padding_token_id":   0xFFFFFFFF,
	}
	for k, want := range uints {
		if got, ok := f.Uint(k); got != want || !ok {
			t.Errorf("%s = %d, %v; want %d", k, got, ok, want)
		}
	}
	if eps, ok := f.Float("llama.attention.layer_norm_rms_epsilon"); !ok || eps != float64(float32(1e-5)) {
		t.Errorf("rms epsilon = %g, %v", eps, ok)
	}
	for _, absent := range []string{"llama.rope.freq_base", "general.file_type", AlignmentKey} {
		if _, ok := f.Get(absent); ok {
			t.Errorf("%s present", absent)
		}
	}

	tokens, ok := f.Strings("tokenizer.ggml.tokens")
	if !ok || len(tokens) != 512 {
		t.Fatalf("tokens: %d, %v", len(tokens), ok)
	}
	if tokens[0] != "<unk>" || tokens[1] != "<s>" || tokens[2] != "</s>" || tokens[3] != "<0x00>" || tokens[258] != "<0xFF>" {
		t.Errorf("tokens start %q, byte tokens %q…%q", tokens[:3], tokens[3], tokens[258])
	}
	spaced := 0
	for _, tok := range tokens[259:] {
		if strings.HasPrefix(tok, "▁") {
			spaced++
		}
	}
	if spaced == 0 {
		t.Error("no normal piece starts with ▁")
	}
	scores, ok := f.Float32s("tokenizer.ggml.scores")
	if !ok || len(scores) != 512 {
		t.Errorf("scores: %d, %v", len(scores), ok)
	}
	types, ok := f.Int32s("tokenizer.ggml.token_type")
	if !ok || len(types) != 512 {
		t.Fatalf("token types: %d, %v", len(types), ok)
	}
	counts := map[int32]int{}
	for _, ty := range types {
		counts[ty]++
	}
	if types[0] != 2 || types[1] != 3 || types[2] != 3 || counts[6] != 256 || counts[1] != 253 {
		t.Errorf("token types: first %v, counts %v", types[:3], counts)
	}

	if len(f.Tensors) != 48 {
		t.Fatalf("%d tensors, want 48", len(f.Tensors))
	}
	wantDims := map[string][]uint64{
		"token_embd.weight":        {64, 512},
		"output_norm.weight":       {64},
		"output.weight":            {64, 512},
		"blk.0.attn_q.weight":      {64, 64},
		"blk.4.attn_k.weight":      {64, 32},
		"blk.2.attn_v.weight":      {64, 32},
		"blk.1.attn_output.weight": {64, 64},
		"blk.3.attn_norm.weight":   {64},
		"blk.0.ffn_gate.weight":    {64, 172},
		"blk.0.ffn_down.weight":    {172, 64},
		"blk.4.ffn_up.weight":      {64, 172},
		"blk.4.ffn_norm.weight":    {64},
	}
	for name, dims := range wantDims {
		ti, ok := f.Tensor(name)
		if !ok {
			t.Errorf("tensor %s missing", name)
			continue
		}
		if !slices.Equal(ti.Dims, dims) {
			t.Errorf("%s dims %v, want %v", name, ti.Dims, dims)
		}
	}
	var elems, end uint64
	for i := range f.Tensors {
		ti := &f.Tensors[i]
		if ti.Type != quant.F32 {
			t.Errorf("%s is %s, want F32", ti.Name, ti.Type)
		}
		if ti.Size != 4*ti.NumElements() || uint64(len(f.TensorData(ti))) != ti.Size {
			t.Errorf("%s: size %d for %d elements", ti.Name, ti.Size, ti.NumElements())
		}
		elems += ti.NumElements()
		end = max(end, ti.Offset+ti.Size)
	}
	if elems != 292800 {
		t.Errorf("%d parameters, want 292800", elems)
	}
	if end > f.Size() {
		t.Errorf("data ends at %d past %d", end, f.Size())
	}

	emb, _ := f.Tensor("token_embd.weight")
	out, _ := f.Tensor("output.weight")
	if !bytes.Equal(f.TensorData(emb), f.TensorData(out)) {
		t.Error("output.weight is not a copy of token_embd.weight")
	}
	// The converter copied the llama2.c weights unchanged: the token
	// embedding is the float32 block right after the 28-byte header.
	if bin, err := os.ReadFile(filepath.Join(filepath.Dir(path), "stories260K.bin")); err == nil {
		if !bytes.Equal(f.TensorData(emb), bin[28:28+512*64*4]) {
			t.Error("token_embd.weight differs from stories260K.bin's token embedding")
		}
	} else if os.Getenv(refdata.EnvCI) != "" {
		t.Error(err)
	}
	norm, _ := f.Tensor("output_norm.weight")
	for i, x := range decodeF32(f.TensorData(norm)) {
		if math.IsNaN(float64(x)) || x == 0 {
			t.Errorf("output_norm[%d] = %g", i, x)
		}
	}
}

func decodeF32(b []byte) []float32 {
	out := make([]float32, len(b)/4)
	for i := range out {
		out[i] = math.Float32frombits(uint32(b[4*i]) | uint32(b[4*i+1])<<8 | uint32(b[4*i+2])<<16 | uint32(b[4*i+3])<<24)
	}
	return out
}

// TestStories260KRewrite writes the parsed model back out: the Writer lays
// files out as llama.cpp's converter does, so the result is byte-identical.
func TestStories260KRewrite(t *testing.T) {
	path := storiesPath(t)
	orig, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	f, err := Parse(orig)
	if err != nil {
		t.Fatal(err)
	}
	got := writeBytes(t, rewrite(t, f))
	if !bytes.Equal(got, orig) {
		i := 0
		for i < min(len(got), len(orig)) && got[i] == orig[i] {
			i++
		}
		t.Errorf("rewritten file (%d bytes) differs from the original (%d bytes) from byte %d", len(got), len(orig), i)
	}
}

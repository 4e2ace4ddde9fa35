package testmodel

import (
	"errors"
	"fmt"
	"math"
	"strings"

	"github.com/baton-serving/baton/engine"
	"github.com/baton-serving/baton/engine/gguf"
)

// Tokenizer is a vocabulary copied from another GGUF: every tokenizer.*
// metadata entry of that file (tokenizer.ggml.model, pre, tokens, scores,
// token_type, merges, the special token ids, add_bos/add_eos,
// tokenizer.chat_template, …), unchanged and in the file's order. A Spec
// with a Tokenizer writes these entries instead of the synthetic
// vocabulary, and sizes its embedding and output rows by the token count,
// as a real model's are.
type Tokenizer struct {
	// Source names where the entries came from (a path), for messages.
	Source string
	kvs    []gguf.KV
	tokens int
	model  string
}

// errNoTokenizer means a GGUF file has no vocabulary to copy. It is always
// wrapped with engine.ErrInvalidInput, which callers test for.
var errNoTokenizer = errors.New("no tokenizer")

// ReadTokenizer copies the tokenizer of the GGUF file at path. A file that
// is not a GGUF is an error wrapping engine.ErrInvalidInput (and gguf's
// own error); one without tokenizer.ggml.model or a non-empty
// tokenizer.ggml.tokens array wraps errNoTokenizer as well.
func ReadTokenizer(path string) (*Tokenizer, error) {
	f, err := gguf.Open(path)
	if err != nil {
		return nil, fmt.Errorf("testmodel: reading the vocabulary of %s: %w: %w", path, err, engine.ErrInvalidInput)
	}
	defer f.Close()
	return TokenizerFromGGUF(f, path)
}

// TokenizerFromGGUF copies f's tokenizer entries; source names f in
// messages. The entries are copied out of f: the result outlives f.Close.
func TokenizerFromGGUF(f *gguf.File, source string) (*Tokenizer, error) {
	t := &Tokenizer{Source: source}
	for _, kv := range f.KVs {
		if strings.HasPrefix(kv.Key, "tokenizer.") {
			t.kvs = append(t.kvs, kv)
		}
	}
	model, ok := f.String("tokenizer.ggml.model")
	if !ok || model == "" {
		return nil, fmt.Errorf("testmodel: %s has no tokenizer (tokenizer.ggml.model is missing or not a string): %w: %w", source, errNoTokenizer, engine.ErrInvalidInput)
	}
	tokens, ok := f.Strings("tokenizer.ggml.tokens")
	if !ok || len(tokens) == 0 {
		return nil, fmt.Errorf("testmodel: %s has no tokenizer (tokenizer.ggml.tokens is missing, empty or not an array of strings): %w: %w", source, errNoTokenizer, engine.ErrInvalidInput)
	}
	if len(tokens) > 1<<20 {
		return nil, fmt.Errorf("testmodel: %s has %d tokens, more than the %d a generated model may have: %w", source, len(tokens), 1<<20, engine.ErrInvalidInput)
	}
	t.tokens, t.model = len(tokens), model
	return t, nil
}

// Len is the number of tokens: the vocabulary size of a model using it.
func (t *Tokenizer) Len() int { return t.tokens }

// Model is tokenizer.ggml.model ("llama", "gpt2", …).
func (t *Tokenizer) Model() string { return t.model }

// Pre is tokenizer.ggml.pre, or "" when the file has none.
func (t *Tokenizer) Pre() string {
	for _, kv := range t.kvs {
		if kv.Key == "tokenizer.ggml.pre" {
			s, _ := kv.Value.AsString()
			return s
		}
	}
	return ""
}

// KVs returns the copied entries (not to be modified).
func (t *Tokenizer) KVs() []gguf.KV { return t.kvs }

// WithTokenizer returns s using t's vocabulary: Tokenizer set and Vocab
// replaced by t's token count, the embedding and output rows of a model
// with that vocabulary.
func (s Spec) WithTokenizer(t *Tokenizer) Spec {
	s.Tokenizer = t
	if t != nil {
		s.Vocab = t.Len()
	}
	return s
}

// tokenizerKVs returns the tokenizer entries the file gets: the copied
// ones, or the synthetic vocabulary's; then ChatTemplate, which replaces a
// copied tokenizer.chat_template.
func (s Spec) tokenizerKVs() []gguf.KV {
	var kvs []gguf.KV
	if s.Tokenizer != nil {
		for _, kv := range s.Tokenizer.kvs {
			if s.ChatTemplate != "" && kv.Key == "tokenizer.chat_template" {
				continue
			}
			kvs = append(kvs, kv)
		}
	} else {
		tokens, scores, types := Vocabulary(s.Vocab, s.Seed)
		for _, e := range []struct {
			key string
			v   any
		}{
			{"tokenizer.ggml.model", "llama"},
			{"tokenizer.ggml.tokens", tokens},
			{"tokenizer.ggml.scores", scores},
			{"tokenizer.ggml.token_type", types},
			{"tokenizer.ggml.unknown_token_id", uint32(0)},
			{"tokenizer.ggml.bos_token_id", uint32(1)},
			{"tokenizer.ggml.eos_token_id", uint32(2)},
			{"tokenizer.ggml.add_bos_token", true},
			{"tokenizer.ggml.add_eos_token", false},
		} {
			v, _ := gguf.NewValue(e.v) // every value above is of a type NewValue takes
			kvs = append(kvs, gguf.KV{Key: e.key, Value: v})
		}
	}
	if s.ChatTemplate != "" {
		v, _ := gguf.NewValue(s.ChatTemplate)
		kvs = append(kvs, gguf.KV{Key: "tokenizer.chat_template", Value: v})
	}
	return kvs
}

// Llama3Rope is Llama 3.1's "llama3" RoPE scaling, which GGUF files carry
// not as metadata but as rope_freqs.weight: one divisor per rotated pair,
// 1 for the fast (short-wavelength) pairs, Factor for the slow ones, and a
// smooth blend between, computed from the RoPE base and head width as
// llama.cpp's converter does. The zero value means none.
type Llama3Rope struct {
	Factor         float64 // rope_scaling.factor (32 for Llama 3.2, 8 for 3.1)
	LowFreqFactor  float64 // low_freq_factor (1)
	HighFreqFactor float64 // high_freq_factor (4)
	OrigContext    int     // original_max_position_embeddings (8192)
}

// enabled reports whether r asks for rope_freqs.weight.
func (r Llama3Rope) enabled() bool { return r != Llama3Rope{} }

func (r Llama3Rope) validate() error {
	switch {
	case !(r.Factor >= 1) || r.Factor > 1e6:
		return fmt.Errorf("llama3 rope factor %v, want [1, 1e6]", r.Factor)
	case !(r.LowFreqFactor > 0) || !(r.HighFreqFactor > r.LowFreqFactor) || r.HighFreqFactor > 1e6:
		return fmt.Errorf("llama3 rope low/high frequency factors %v/%v, want 0 < low < high", r.LowFreqFactor, r.HighFreqFactor)
	case r.OrigContext <= 0 || r.OrigContext > 1<<24:
		return fmt.Errorf("llama3 rope original context %d, want [1, %d]", r.OrigContext, 1<<24)
	}
	return nil
}

// Factors returns the rope_freqs.weight values for a head of headDim
// (headDim/2 pairs) rotated with base: pair i's frequency is
// base^(-2i/headDim), its wavelength 2π over that; a wavelength shorter
// than OrigContext/HighFreqFactor keeps its frequency (1), one longer than
// OrigContext/LowFreqFactor is divided by Factor, and one between by
// 1/((1-t)/Factor + t) with t = (OrigContext/wavelength - low)/(high - low).
func (r Llama3Rope) Factors(headDim int, base float64) []float32 {
	lowWave := float64(r.OrigContext) / r.LowFreqFactor
	highWave := float64(r.OrigContext) / r.HighFreqFactor
	out := make([]float32, headDim/2)
	for i := range out {
		// float32 as the converter's torch computation.
		freq := float64(float32(1 / math.Pow(base, float64(2*i)/float64(headDim))))
		wave := 2 * math.Pi / freq
		switch {
		case wave < highWave:
			out[i] = 1
		case wave > lowWave:
			out[i] = float32(r.Factor)
		default:
			t := (float64(r.OrigContext)/wave - r.LowFreqFactor) / (r.HighFreqFactor - r.LowFreqFactor)
			out[i] = float32(1 / ((1-t)/r.Factor + t))
		}
	}
	return out
}

package model

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/baton-serving/baton/engine/gguf"
	"github.com/baton-serving/baton/engine/refdata"
	"github.com/baton-serving/baton/engine/sample"
	"github.com/baton-serving/baton/engine/tokenizer"
)

// golden mirrors the parts of shared/golden/stories260K.json the test uses
// (see the file's "schema" key).
type golden struct {
	Generations []struct {
		Prompt       string  `json:"prompt"`
		PromptIDs    []int32 `json:"prompt_ids"`
		GeneratedIDs []int32 `json:"generated_ids"`
		Steps        []struct {
			Pos int   `json:"pos"`
			ID  int32 `json:"id"`
			Top []struct {
				ID      int32   `json:"id"`
				Logprob float64 `json:"logprob"`
				Prob    float64 `json:"prob"`
			} `json:"top"`
		} `json:"steps"`
	} `json:"generations"`
}

func openStories(t testing.TB) (*gguf.File, *golden) {
	t.Helper()
	f, err := gguf.Open(refdata.Model(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	raw, err := os.ReadFile(refdata.Golden(t))
	if err != nil {
		t.Fatal(err)
	}
	var g golden
	if err := json.Unmarshal(raw, &g); err != nil {
		t.Fatal(err)
	}
	if len(g.Generations) == 0 {
		t.Fatal("golden file has no generations")
	}
	return f, &g
}

// reference mirrors testdata/llama2c_stories260K.json: llama2.c's float32
// top-5 probabilities for the same prompts and steps (see the file's
// description for how it was made).
type reference struct {
	Generations []struct {
		Prompt    string         `json:"prompt"`
		PromptIDs []int32        `json:"prompt_ids"`
		Top5      [][][2]float64 `json:"top5"` // [step][rank] = {id, prob}
	} `json:"generations"`
}

// Tolerances on next-token probabilities, by reference:
//
//   - llama.cpp (the golden file) keeps its KV cache in F16 and multiplies
//     F16-rounded queries and attention weights with it, which moves
//     probabilities away from any float32 computation: llama2.c's float32
//     run.c differs from the golden file by up to 2.14e-3 (prompt "The cat"),
//     exactly as much as this engine does. The brief's 1e-4 is therefore out
//     of reach for a float32 engine; 3e-3 bounds the measured 2.14e-3 with
//     margin, while a real bug (a wrong RoPE pair, head mapping or norm)
//     moves probabilities by 1e-2 to 1 within a few steps.
//   - llama2.c is float32 like this engine: the measured largest difference
//     is 1.6e-6, so 2e-5 leaves room for summation-order changes (SIMD
//     kernels) and nothing else.
const (
	tolLlamaCpp = 3e-3
	tolLlama2c  = 2e-5
)

// checkTop compares our top-5 against a reference's (ids and
// probabilities): ids must agree except where the two reference entries that
// would be swapped are closer than tol.
func checkTop(t *testing.T, what string, logits []float32, ref [][2]float64, tol float64) {
	t.Helper()
	for i, r := range ref {
		id := int32(r[0])
		lp, _ := sample.Logprobs(logits, id, 0)
		if p := math.Exp(float64(lp)); math.Abs(p-r[1]) > tol {
			t.Fatalf("%s: token %d (rank %d) has probability %.7f, reference %.7f (tolerance %g)", what, id, i, p, r[1], tol)
		}
	}
	_, top := sample.Logprobs(logits, -1, len(ref))
	for i, r := range ref {
		if top[i].ID == int32(r[0]) {
			continue
		}
		// A swap is acceptable only between near-equal probabilities,
		// which the loop above has already checked token by token.
		if i+1 < len(ref) && math.Abs(ref[i][1]-ref[i+1][1]) <= 2*tol || i > 0 && math.Abs(ref[i][1]-ref[i-1][1]) <= 2*tol {
			continue
		}
		t.Fatalf("%s: rank %d is token %d, reference %d (reference top %v)", what, i, top[i].ID, int32(r[0]), ref)
	}
}

// TestGoldenStories260K is the acceptance test: llama.cpp's greedy
// generations for the real stories260K model, token for token, with the
// top-5 probabilities of every step compared against llama.cpp and against
// llama2.c's float32 run.c (see the tolerances above).
func TestGoldenStories260K(t *testing.T) {
	f, g := openStories(t)
	tok, err := tokenizer.FromGGUF(f)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join("testdata", "llama2c_stories260K.json"))
	if err != nil {
		t.Fatal(err)
	}
	var ref reference
	if err := json.Unmarshal(raw, &ref); err != nil {
		t.Fatal(err)
	}
	if len(ref.Generations) != len(g.Generations) {
		t.Fatalf("reference has %d generations, golden %d", len(ref.Generations), len(g.Generations))
	}
	// Two threads, so that the worker pool is exercised; that the thread
	// count does not change results is TestThreadsIdentical's business.
	for _, threads := range []int{2} {
		m, err := Load(f, Options{Threads: threads})
		if err != nil {
			t.Fatal(err)
		}
		cfg := m.Config()
		if cfg.Dim != 64 || cfg.Heads != 8 || cfg.KVHeads != 4 || cfg.Layers != 5 || cfg.Vocab != 512 ||
			cfg.HeadDim != 8 || cfg.Hidden != 172 || cfg.ContextLength != 128 || cfg.RopeBase != 10000 || cfg.TiedOutput {
			t.Fatalf("config %+v", cfg)
		}
		for gi, gen := range g.Generations {
			r := ref.Generations[gi]
			if r.Prompt != gen.Prompt || len(r.Top5) != len(gen.GeneratedIDs) {
				t.Fatalf("reference generation %d (%q, %d steps) does not match golden (%q, %d)", gi, r.Prompt, len(r.Top5), gen.Prompt, len(gen.GeneratedIDs))
			}
			ids := tok.Encode(gen.Prompt, tokenizer.EncodeOptions{AddSpecial: true, ParseSpecial: true})
			if !slices.Equal(ids, gen.PromptIDs) {
				t.Fatalf("prompt %q: ids %v, want %v", gen.Prompt, ids, gen.PromptIDs)
			}
			cache, err := NewContiguousCache(cfg, 0)
			if err != nil {
				t.Fatal(err)
			}
			logits := make([]float32, cfg.Vocab)
			if err := m.Forward(ids, 0, cache, logits); err != nil {
				t.Fatal(err)
			}
			pos := len(ids)
			var got []int32
			for step := range gen.GeneratedIDs {
				what := fmt.Sprintf("threads %d, prompt %q, step %d", threads, gen.Prompt, step)
				gold := make([][2]float64, len(gen.Steps[step].Top))
				for i, e := range gen.Steps[step].Top {
					gold[i] = [2]float64{float64(e.ID), e.Prob}
				}
				checkTop(t, what+" vs llama.cpp", logits, gold, tolLlamaCpp)
				checkTop(t, what+" vs llama2.c", logits, r.Top5[step], tolLlama2c)

				id := sample.Greedy(logits)
				got = append(got, id)
				if id != gen.GeneratedIDs[step] {
					t.Fatalf("%s: generated %v, diverges from %v", what, got, gen.GeneratedIDs)
				}
				if err := m.Forward([]int32{id}, pos, cache, logits); err != nil {
					t.Fatal(err)
				}
				pos++
			}
		}
		if err := m.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

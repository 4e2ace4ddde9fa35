package testmodel_test

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/baton-serving/baton/engine/gguf"
	"github.com/baton-serving/baton/engine/model"
)

// recording is the part of a scripts/golden/llamacpp_greedy JSON file the
// comparison reads.
type recording struct {
	Prompts []struct {
		Text         string  `json:"text"`
		PromptIDs    []int32 `json:"prompt_ids"`
		GeneratedIDs []int32 `json:"generated_ids"`
		FirstLow     int     `json:"first_low_margin_step"`
		Error        string  `json:"error"`
		Steps        []struct {
			Margin float64 `json:"margin"`
			Top    []struct {
				ID    int32   `json:"id"`
				Logit float32 `json:"logit"`
			} `json:"top"`
		} `json:"steps"`
	} `json:"prompts"`
}

// TestCompareLlamaCpp is a measuring tool, not a regression test: with
// BATON_LLAMACPP_DIR set to a folder of NAME.gguf files (gen-model) and
// NAME.json recordings of them (scripts/golden/llamacpp_greedy), it runs
// Baton's greedy decoding from each recorded prompt's ids (Forward, F32 KV
// cache, one thread, argmax with the lowest id on a tie, end-of-generation
// not stopped at, as the recorder does) and prints, per file, the steps
// compared (those before llama.cpp's first top-2 margin below 1e-3), the
// prompts whose ids differ within them (flips) and the llama.cpp margin at
// each flip. It fails when any compared step differs. Used to choose the
// weight stds in docs/models.md.
func TestCompareLlamaCpp(t *testing.T) {
	dir := os.Getenv("BATON_LLAMACPP_DIR")
	if dir == "" {
		t.Skip("BATON_LLAMACPP_DIR not set")
	}
	jsons, _ := filepath.Glob(filepath.Join(dir, "*.json"))
	slices.Sort(jsons)
	if len(jsons) == 0 {
		t.Fatalf("no recordings in %s", dir)
	}
	for _, js := range jsons {
		name := strings.TrimSuffix(filepath.Base(js), ".json")
		compared, total, flips, detail := compareOne(t, js, strings.TrimSuffix(js, ".json")+".gguf")
		fmt.Printf("RESULT %s compared %d/%d flips %d %s\n", name, compared, total, flips, detail)
		if flips > 0 {
			t.Errorf("%s: %d prompts flip", name, flips)
		}
	}
}

func compareOne(t *testing.T, jsonPath, modelPath string) (compared, total, flips int, detail string) {
	raw, err := os.ReadFile(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	var rec recording
	if err := json.Unmarshal(raw, &rec); err != nil {
		t.Fatalf("%s: %v", jsonPath, err)
	}
	f, err := gguf.Open(modelPath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	m, err := model.Load(f, model.Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	c := m.Config()
	var notes []string
	var maxDiff, maxDiff0 float64
	var drift []int // per prompt, the first step a top logit is 0.01 apart (-1: none)
	defer func() {
		detail = fmt.Sprintf("maxdlogit %.3g (prompt step %.3g) apart@%v %s", maxDiff, maxDiff0, drift, detail)
	}()
	for pi, p := range rec.Prompts {
		if p.Error != "" {
			continue
		}
		steps := len(p.GeneratedIDs)
		total += steps
		upto := steps
		if p.FirstLow >= 0 && p.FirstLow < upto {
			upto = p.FirstLow
		}
		cache, err := model.NewContiguousCache(c, len(p.PromptIDs)+steps+1)
		if err != nil {
			t.Fatal(err)
		}
		logits := make([]float32, c.Vocab)
		if err := m.Forward(p.PromptIDs, 0, cache, logits); err != nil {
			t.Fatal(err)
		}
		pos := len(p.PromptIDs)
		flip, apart := -1, -1
		for i := range upto {
			for _, tp := range p.Steps[i].Top {
				d := math.Abs(float64(logits[tp.ID] - tp.Logit))
				if d > 0.01 && apart < 0 {
					apart = i
				}
				maxDiff = max(maxDiff, d)
				if i == 0 {
					maxDiff0 = max(maxDiff0, d)
				}
			}
			id := argmax(logits)
			if id != p.GeneratedIDs[i] {
				flip = i
				break
			}
			if err := m.Forward([]int32{id}, pos, cache, logits); err != nil {
				t.Fatal(err)
			}
			pos++
		}
		drift = append(drift, apart)
		if flip >= 0 {
			flips++
			compared += flip
			notes = append(notes, fmt.Sprintf("p%d@%d(margin %.3g)", pi, flip, p.Steps[flip].Margin))
		} else {
			compared += upto
			if upto < steps {
				notes = append(notes, fmt.Sprintf("p%d stops@%d", pi, upto))
			}
		}
	}
	return compared, total, flips, strings.Join(notes, " ")
}

func argmax(l []float32) int32 {
	best := 0
	for i, v := range l {
		if v > l[best] {
			best = i
		}
	}
	return int32(best)
}

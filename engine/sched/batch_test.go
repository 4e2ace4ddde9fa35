package sched

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/baton-serving/baton/engine/model"
	"github.com/baton-serving/baton/engine/refdata"
	"github.com/baton-serving/baton/engine/sample"
	"github.com/baton-serving/baton/kernels/quant"
)

type goldenGen struct {
	Prompt        string  `json:"prompt"`
	PromptIDs     []int32 `json:"prompt_ids"`
	GeneratedIDs  []int32 `json:"generated_ids"`
	GeneratedText string  `json:"generated_text"`
}

func readGolden(t *testing.T, shared string) []goldenGen {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(shared, "golden", "stories260K.json"))
	if err != nil {
		t.Fatal(err)
	}
	var g struct {
		Generations []goldenGen `json:"generations"`
	}
	if err := json.Unmarshal(raw, &g); err != nil {
		t.Fatal(err)
	}
	if len(g.Generations) == 0 {
		t.Fatal("no golden generations")
	}
	return g.Generations
}

// TestGoldenBatch runs 16 greedy requests over the golden prompts at once
// and checks that every one produces llama.cpp's tokens (and text, with the
// F32 cache), exactly as each does run alone, with F32 and F16 caches.
func TestGoldenBatch(t *testing.T) {
	shared := refdata.Dir(t)
	gens := readGolden(t, shared)
	tm := loadGGUF(t, filepath.Join(shared, "models", "stories260K.gguf"), 2)
	// Under the race detector: the first 20 tokens of each, F32 only.
	n, dtypes := 64, []quant.Type{quant.F32, quant.F16}
	if raceEnabled {
		n, dtypes = 20, dtypes[:1]
	}
	for i := range gens {
		gens[i].GeneratedIDs = gens[i].GeneratedIDs[:min(n, len(gens[i].GeneratedIDs))]
	}
	for _, dtype := range dtypes {
		t.Run(dtype.String(), func(t *testing.T) {
			pool := newPool(t, tm, 16, 16*5, dtype)
			obs := &maxSeqs{}
			s := newSched(t, Config{Model: tm.m, Pool: pool, Tokenizer: tm.tok, Observer: obs})
			var reqs []Request
			for i := range 16 {
				g := gens[i%len(gens)]
				reqs = append(reqs, Request{Prompt: g.PromptIDs, MaxTokens: len(g.GeneratedIDs), Params: greedy()})
			}
			batch := runAll(t, s, reqs)
			if m, _ := obs.get(); m < 8 {
				t.Errorf("largest batch had %d sequences; the requests did not run together", m)
			}
			// Alone, each prompt once. With the F16 cache the golden ids
			// (llama.cpp's, made with an F16 cache too) stand in for the
			// alone runs, which keeps the race-detector run short.
			alone := make([]result, len(gens))
			for i := range gens {
				if dtype == quant.F32 {
					alone[i] = runAll(t, s, reqs[i:i+1])[0]
				} else {
					alone[i] = result{ids: gens[i].GeneratedIDs, text: batch[i].text}
				}
			}
			for i, res := range batch {
				g, a := gens[i%len(gens)], alone[i%len(gens)]
				if !slices.Equal(res.ids, a.ids) || res.text != a.text {
					t.Errorf("request %d (%q): batched %v differs from alone %v", i, g.Prompt, res.ids, a.ids)
				}
				if res.done.Finish != FinishLength || res.done.Usage.CompletionTokens != len(g.GeneratedIDs) || res.done.Usage.PromptTokens != len(g.PromptIDs) {
					t.Errorf("request %d: done %+v", i, res.done)
				}
				if dtype == quant.F32 {
					if !slices.Equal(res.ids, g.GeneratedIDs) {
						t.Errorf("request %d (%q): %v, golden %v", i, g.Prompt, res.ids, g.GeneratedIDs)
					}
					if len(g.GeneratedIDs) == 64 && res.text != g.GeneratedText {
						t.Errorf("request %d (%q): text %q, golden %q", i, g.Prompt, res.text, g.GeneratedText)
					}
				} else if !slices.Equal(res.ids, g.GeneratedIDs) {
					// llama.cpp made the golden file with an F16 cache too.
					t.Errorf("request %d (%q), F16 cache: %v, golden %v", i, g.Prompt, res.ids, g.GeneratedIDs)
				}
			}
			checkClean(t, s)
		})
	}
}

// checkClean asserts that the auditor is happy and no page is in use.
func checkClean(t testing.TB, s *Scheduler) {
	t.Helper()
	// Releases happen before EventDone is sent, so everything is back.
	if rep := s.Audit(); !rep.OK() || rep.PagesUsed != 0 || rep.Live != 0 {
		t.Fatalf("after all requests: %+v", rep)
	}
}

// randomRequests makes n requests with random prompts and lengths: greedy
// ones and seeded sampled ones with filters and penalties.
func randomRequests(rng *rand.Rand, cfg model.Config, n int) []Request {
	var reqs []Request
	for i := range n {
		plen := 1 + rng.IntN(40)
		prompt := make([]int32, plen)
		for j := range prompt {
			prompt[j] = int32(3 + rng.IntN(cfg.Vocab-3))
		}
		p := greedy()
		if i%2 == 1 {
			p = sample.Defaults()
			p.Temperature, p.TopK, p.TopP, p.MinP = 0.9, 40, 0.95, 0.02
			p.Seed = uint64(i)
			if i%4 == 3 {
				p.RepeatPenalty, p.FrequencyPenalty, p.PresencePenalty = 1.1, 0.2, 0.1
				p.Logprobs, p.TopLogprobs = true, 3
			}
		}
		reqs = append(reqs, Request{
			ID: fmt.Sprintf("r%d", i), Prompt: prompt,
			MaxTokens: 1 + rng.IntN(min(40, cfg.ContextLength-plen)), Params: p,
		})
	}
	return reqs
}

// referenceGreedy decodes prompt greedily with Forward on a contiguous
// cache: the engine's single-sequence path.
func referenceGreedy(t *testing.T, m model.Model, prompt []int32, n int) []int32 {
	t.Helper()
	cache, err := model.NewContiguousCache(m.Config(), 0)
	if err != nil {
		t.Fatal(err)
	}
	logits := make([]float32, m.Config().Vocab)
	if err := m.Forward(prompt, 0, cache, logits); err != nil {
		t.Fatal(err)
	}
	var out []int32
	for pos := len(prompt); len(out) < n; pos++ {
		id := sample.Greedy(logits)
		out = append(out, id)
		if len(out) == n {
			break
		}
		if err := m.Forward([]int32{id}, pos, cache, logits); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

func sameResult(a, b result) bool {
	if !slices.Equal(a.ids, b.ids) || a.text != b.text || a.done.Finish != b.done.Finish {
		return false
	}
	var la, lb [][]sample.TokenLogprob
	for _, ev := range a.events {
		la = append(la, ev.Token.Top)
	}
	for _, ev := range b.events {
		lb = append(lb, ev.Token.Top)
	}
	return slices.EqualFunc(la, lb, func(x, y []sample.TokenLogprob) bool { return slices.Equal(x, y) })
}

// TestRandomBatchEquivalence: on a random-weight model, 16 requests with
// random prompts, lengths and sampling parameters give the same tokens,
// text and logprobs batched (with chunked prefill mixed into decode steps)
// as alone, and greedy ones match the single-sequence Forward path.
func TestRandomBatchEquivalence(t *testing.T) {
	tm := loadSmall(t, 2)
	cfg := tm.cfg()
	reqs := randomRequests(rand.New(rand.NewPCG(11, 12)), cfg, 16)
	for i := range reqs {
		reqs[i].IgnoreEOS = true
	}
	aloneSched := newSched(t, Config{Model: tm.m, Pool: newPool(t, tm, 16, 64, quant.F32), Tokenizer: tm.tok})
	alone := make([]result, len(reqs))
	for i := range reqs {
		alone[i] = runAll(t, aloneSched, reqs[i:i+1])[0]
	}
	for _, budget := range []int{7, 512} {
		t.Run(fmt.Sprint("budget", budget), func(t *testing.T) {
			obs := &maxSeqs{}
			s := newSched(t, Config{Model: tm.m, Pool: newPool(t, tm, 4, 512, quant.F32), Tokenizer: tm.tok,
				MaxBatchTokens: budget, Observer: obs})
			batch := runAll(t, s, reqs)
			for i := range reqs {
				if !sameResult(batch[i], alone[i]) {
					t.Errorf("request %d: batched %v (%s) differs from alone %v (%s)", i, batch[i].ids, batch[i].done.Finish, alone[i].ids, alone[i].done.Finish)
				}
			}
			if m, pre := obs.get(); m < 4 || pre != 0 {
				t.Errorf("largest batch %d, preemptions %d", m, pre)
			}
			checkClean(t, s)
		})
	}
	for i, r := range reqs {
		if r.Params.Temperature != 0 || alone[i].done.Finish != FinishLength {
			continue
		}
		if want := referenceGreedy(t, tm.m, r.Prompt, r.MaxTokens); !slices.Equal(alone[i].ids, want) {
			t.Errorf("request %d: scheduler %v, Forward %v", i, alone[i].ids, want)
		}
	}
}

// TestPageExhaustion submits more requests than the pool can hold at once:
// preemption and recomputation must complete every one with the output it
// has alone, and nothing may hang.
func TestPageExhaustion(t *testing.T) {
	tm := loadSmall(t, 2)
	cfg := tm.cfg()
	reqs := randomRequests(rand.New(rand.NewPCG(21, 22)), cfg, 24)
	maxPages := 0
	for i := range reqs {
		reqs[i].IgnoreEOS = true
		maxPages = max(maxPages, (len(reqs[i].Prompt)+reqs[i].MaxTokens-1+3)/4)
	}
	aloneSched := newSched(t, Config{Model: tm.m, Pool: newPool(t, tm, 4, 64, quant.F16), Tokenizer: tm.tok})
	obs := &maxSeqs{}
	// Room for about two of the longest requests.
	s := newSched(t, Config{Model: tm.m, Pool: newPool(t, tm, 4, 2*maxPages+1, quant.F16), Tokenizer: tm.tok, Observer: obs, MaxBatchTokens: 16})
	batch := runAll(t, s, reqs)
	for i := range reqs {
		alone := runAll(t, aloneSched, reqs[i:i+1])[0]
		if !sameResult(batch[i], alone) {
			t.Errorf("request %d: under page pressure %v (%s), alone %v", i, batch[i].ids, batch[i].done.Finish, alone.ids)
		}
	}
	_, pre := obs.get()
	total := 0
	for _, r := range batch {
		total += r.done.Usage.Preemptions
	}
	if pre == 0 || total != pre {
		t.Errorf("%d preemptions by the steps, %d by the requests' usage; the test must exercise preemption", pre, total)
	}
	t.Logf("%d requests in %d pages: %d preemptions", len(reqs), 2*maxPages+1, pre)
	checkClean(t, s)
}

// TestPrefillDecodeHandover runs requests split over two schedulers — a
// prefill-only one and a decode one importing its pages — and checks the
// output equals colocated generation token for token, greedy and sampled.
func TestPrefillDecodeHandover(t *testing.T) {
	tm := loadSmall(t, 1)
	cfg := tm.cfg()
	reqs := randomRequests(rand.New(rand.NewPCG(31, 32)), cfg, 6)
	for _, dtype := range []quant.Type{quant.F32, quant.F16} {
		t.Run(dtype.String(), func(t *testing.T) {
			colo := newSched(t, Config{Model: tm.m, Pool: newPool(t, tm, 4, 64, dtype), Tokenizer: tm.tok})
			ppool, dpool := newPool(t, tm, 4, 64, dtype), newPool(t, tm, 4, 64, dtype)
			pre := newSched(t, Config{Model: tm.m, Pool: ppool, Tokenizer: tm.tok, MaxBatchTokens: 5})
			dec := newSched(t, Config{Model: tm.m, Pool: dpool, Tokenizer: tm.tok})
			for i, r := range reqs {
				want := runAll(t, colo, []Request{r})[0]

				dr := r
				dr.Mode = ModeDecodeImported
				dst, err := dec.Submit(context.Background(), dr)
				if err != nil {
					t.Fatal(err)
				}
				ev := <-dst.Events()
				if ev.Kind != EventReserved || len(ev.Pages) != (len(r.Prompt)+3)/4 {
					t.Fatalf("request %d: first decode event %+v", i, ev)
				}
				dpages := ev.Pages

				pr := r
				pr.Mode = ModePrefillOnly
				pst, err := pre.Submit(context.Background(), pr)
				if err != nil {
					t.Fatal(err)
				}
				imported, announcements := 0, 0
				var first sample.Token
				for ev := range pst.Events() {
					switch ev.Kind {
					case EventPagesReady:
						announcements++
						if ev.Ready <= imported || ev.Ready > len(ev.Pages) {
							t.Fatalf("request %d: ready %d after %d", i, ev.Ready, imported)
						}
						for ; imported < ev.Ready; imported++ {
							for l := range cfg.Layers {
								k, v := ppool.PageBytes(ev.Pages[imported], l)
								if err := dpool.Import(dpages[imported], l, k, v); err != nil {
									t.Fatal(err)
								}
							}
						}
					case EventToken:
						if imported != len(dpages) {
							t.Fatalf("request %d: first token before all pages were ready", i)
						}
						first = ev.Token
						if err := pst.Handover(); err != nil {
							t.Fatal(err)
						}
					case EventDone:
						if ev.Finish != FinishHandedOver || ev.Err != nil {
							t.Fatalf("request %d: prefill ended %s: %v", i, ev.Finish, ev.Err)
						}
					}
				}
				if len(r.Prompt) > 8 && announcements < 2 {
					t.Errorf("request %d: %d-token prompt announced its pages in %d events; transfer cannot overlap compute", i, len(r.Prompt), announcements)
				}
				if err := dst.Activate(first); err != nil {
					t.Fatal(err)
				}
				got := collect(t, dst, time.Minute)
				if !sameResult(got, want) {
					t.Errorf("request %d: PD %v (%s), colocated %v (%s)", i, got.ids, got.done.Finish, want.ids, want.done.Finish)
				}
			}
			checkClean(t, pre)
			checkClean(t, dec)
		})
	}
}

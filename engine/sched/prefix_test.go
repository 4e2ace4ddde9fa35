package sched

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/baton-serving/baton/engine/kvcache"
	"github.com/baton-serving/baton/kernels/quant"
)

// sharedPrefixRequests makes n greedy requests whose prompts start with one
// of two shared prefixes (48 and 21 tokens) and end in a random suffix.
func sharedPrefixRequests(rng *rand.Rand, vocab, n int) []Request {
	prefixes := [][]int32{make([]int32, 48), make([]int32, 21)}
	for _, p := range prefixes {
		for i := range p {
			p[i] = int32(3 + rng.IntN(vocab-3))
		}
	}
	reqs := make([]Request, n)
	for i := range reqs {
		prompt := append([]int32(nil), prefixes[i%2]...)
		for range rng.IntN(9) {
			prompt = append(prompt, int32(3+rng.IntN(vocab-3)))
		}
		reqs[i] = Request{Prompt: prompt, MaxTokens: 4 + rng.IntN(12), Params: greedy(), IgnoreEOS: true}
	}
	return reqs
}

func cachedPool(t *testing.T, tm testModel, pageSize, pages int, dtype quant.Type, maxCached int) *kvcache.Pool {
	t.Helper()
	p := newPool(t, tm, pageSize, pages, dtype)
	if err := p.EnableCache(tm.m.Fingerprint(), maxCached); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestPrefixCacheSameOutput: requests sharing prefixes, submitted in waves
// so that later ones find the earlier ones' pages cached, give exactly the
// tokens and logprobs they give without a cache — with room to spare and
// in a pool so small that requests are preempted and recomputed — and the
// later waves do reuse pages (CachedTokens).
func TestPrefixCacheSameOutput(t *testing.T) {
	tm := loadSmall(t, 2)
	reqs := sharedPrefixRequests(rand.New(rand.NewPCG(5, 6)), tm.cfg().Vocab, 12)
	plain := newSched(t, Config{Model: tm.m, Pool: newPool(t, tm, 4, 256, quant.F16), Tokenizer: tm.tok})
	want := make([]result, len(reqs))
	for i := range reqs {
		want[i] = runAll(t, plain, reqs[i:i+1])[0]
		if want[i].done.Usage.CachedTokens != 0 {
			t.Fatalf("request %d reused %d tokens without a cache", i, want[i].done.Usage.CachedTokens)
		}
	}
	for _, tc := range []struct {
		name  string
		pages int
		waves int
	}{{"roomy", 256, 3}, {"preempting", 40, 2}} {
		t.Run(tc.name, func(t *testing.T) {
			obs := &maxSeqs{}
			pool := cachedPool(t, tm, 4, tc.pages, quant.F16, tc.pages)
			s := newSched(t, Config{Model: tm.m, Pool: pool, Tokenizer: tm.tok, Observer: obs, MaxBatchTokens: 24})
			cached := 0
			per := len(reqs) / tc.waves
			for w := 0; w < len(reqs); w += per {
				got := runAll(t, s, reqs[w:min(w+per, len(reqs))])
				for j, g := range got {
					i := w + j
					if !sameResult(g, want[i]) {
						t.Errorf("request %d: with the cache %v, without %v", i, g.ids, want[i].ids)
					}
					if w == 0 && j < 2 && g.done.Usage.CachedTokens != 0 {
						t.Errorf("request %d: first of its prefix reused %d tokens", i, g.done.Usage.CachedTokens)
					}
					if c := g.done.Usage.CachedTokens; c%4 != 0 || c >= len(reqs[i].Prompt) {
						t.Errorf("request %d: %d cached tokens of a %d-token prompt", i, c, len(reqs[i].Prompt))
					}
					cached += g.done.Usage.CachedTokens
				}
			}
			if cached == 0 {
				t.Fatal("no request reused a cached page")
			}
			_, pre := obs.get()
			if tc.name == "preempting" && pre == 0 {
				t.Error("the small pool preempted nothing; the test must exercise preemption")
			}
			t.Logf("%d cached tokens, %d preemptions, %+v", cached, pre, pool.CacheStats())
			if rep := s.Audit(); !rep.OK() || rep.Live != 0 || rep.PagesUsed != pool.Stats().Cached {
				t.Fatalf("audit: %+v", rep)
			}
			if n := s.FlushCache(); n == 0 {
				t.Error("flush freed nothing")
			}
			checkClean(t, s)
		})
	}
}

// TestPrefixCacheComputesLastPosition: a prompt that is exactly cached
// pages still computes its last page (the first token needs its logits),
// and prompt log-probabilities are computed, never reused.
func TestPrefixCacheComputesLastPosition(t *testing.T) {
	tm := loadSmall(t, 1)
	pool := cachedPool(t, tm, 4, 64, quant.F32, 64)
	s := newSched(t, Config{Model: tm.m, Pool: pool, Tokenizer: tm.tok})
	prompt := make([]int32, 16)
	for i := range prompt {
		prompt[i] = int32(10 + i)
	}
	req := Request{Prompt: prompt, MaxTokens: 3, Params: greedy(), IgnoreEOS: true}
	first := runAll(t, s, []Request{req})[0]
	second := runAll(t, s, []Request{req})[0]
	if !sameResult(first, second) || second.done.Usage.CachedTokens != 12 {
		t.Fatalf("again: %v (cached %d), first %v", second.ids, second.done.Usage.CachedTokens, first.ids)
	}
	lp := req
	lp.PromptLogprobs = true
	third := runAll(t, s, []Request{lp})[0]
	if third.done.Usage.CachedTokens != 0 || len(third.events[0].PromptLogprobs) != len(prompt)-1 {
		t.Fatalf("with prompt logprobs: %d cached, %d entries", third.done.Usage.CachedTokens, len(third.events[0].PromptLogprobs))
	}
	if fmt.Sprint(third.ids) != fmt.Sprint(first.ids) {
		t.Fatalf("with prompt logprobs %v, want %v", third.ids, first.ids)
	}
	s.FlushCache()
	checkClean(t, s)
}

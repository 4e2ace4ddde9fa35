package sched

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/baton-serving/baton/engine/kvcache"
	"github.com/baton-serving/baton/engine/sample"
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

// TestImportedHoldsCachedPrefix: a decode worker's imported request attaches
// the leading pages its prefix cache has (EventReserved.Held), receives only
// the rest from prefill, and generates exactly what a colocated request
// does; a multi-turn conversation so imports only its new turn's pages.
func TestImportedHoldsCachedPrefix(t *testing.T) {
	tm := loadSmall(t, 1)
	const ps = 4
	colo := newSched(t, Config{Model: tm.m, Pool: newPool(t, tm, ps, 64, quant.F16), Tokenizer: tm.tok})
	ppool := cachedPool(t, tm, ps, 64, quant.F16, 64)
	dpool := cachedPool(t, tm, ps, 64, quant.F16, 64)
	pre := newSched(t, Config{Model: tm.m, Pool: ppool, Tokenizer: tm.tok, MaxBatchTokens: 5})
	dec := newSched(t, Config{Model: tm.m, Pool: dpool, Tokenizer: tm.tok})
	rng := rand.New(rand.NewPCG(8, 9))
	var conv []int32
	for turn := range 3 {
		for range 5 + rng.IntN(6) { // the user's new message
			conv = append(conv, int32(3+rng.IntN(tm.cfg().Vocab-3)))
		}
		r := Request{Prompt: slices.Clone(conv), MaxTokens: 6, Params: greedy(), IgnoreEOS: true}
		want := runAll(t, colo, []Request{r})[0]

		dr := r
		dr.Mode = ModeDecodeImported
		dst, err := dec.Submit(context.Background(), dr)
		if err != nil {
			t.Fatal(err)
		}
		ev := <-dst.Events()
		if ev.Kind != EventReserved || len(ev.Pages) != dpool.Layout().PagesFor(len(r.Prompt)) {
			t.Fatalf("turn %d: first decode event %+v", turn, ev)
		}
		// Every earlier turn's full pages, but never the page of the
		// prompt's last token.
		if maxHeld := (len(r.Prompt) - 1) / ps; ev.Held > maxHeld || turn > 0 && ev.Held == 0 {
			t.Fatalf("turn %d: %d pages held of a %d-token prompt", turn, ev.Held, len(r.Prompt))
		}
		if turn == 0 && ev.Held != 0 {
			t.Fatalf("first turn: %d pages held by an empty cache", ev.Held)
		}
		for _, id := range ev.Pages[:ev.Held] {
			if dpool.Refs(id) < 2 {
				t.Fatalf("turn %d: held page %d has %d refs, want the cache's and the request's", turn, id, dpool.Refs(id))
			}
		}
		pr := r
		pr.Mode = ModePrefillOnly
		pst, err := pre.Submit(context.Background(), pr)
		if err != nil {
			t.Fatal(err)
		}
		var first sample.Token
		imported := ev.Held
		for pev := range pst.Events() {
			switch pev.Kind {
			case EventPagesReady:
				for ; imported < pev.Ready; imported++ {
					for l := range tm.cfg().Layers {
						k, v := ppool.PageBytes(pev.Pages[imported], l)
						if err := dpool.Import(ev.Pages[imported], l, k, v); err != nil {
							t.Fatal(err)
						}
					}
				}
				// The held pages hold what prefill computed, byte for byte.
				for p := 0; p < min(ev.Held, pev.Ready); p++ {
					for l := range tm.cfg().Layers {
						pk, pv := ppool.PageBytes(pev.Pages[p], l)
						dk, dv := dpool.PageBytes(ev.Pages[p], l)
						if !slices.Equal(pk, dk) || !slices.Equal(pv, dv) {
							t.Fatalf("turn %d: held page %d layer %d differs from prefill's", turn, p, l)
						}
					}
				}
			case EventToken:
				first = pev.Token
				if err := pst.Handover(); err != nil {
					t.Fatal(err)
				}
			}
		}
		if err := dst.Activate(first); err != nil {
			t.Fatal(err)
		}
		got := collect(t, dst, time.Minute)
		if !sameResult(got, want) {
			t.Errorf("turn %d: PD with held pages %v, colocated %v", turn, got.ids, want.ids)
		}
		conv = append(conv, got.ids...)
	}
	for _, s := range []*Scheduler{pre, dec} {
		if rep := s.Audit(); !rep.OK() || rep.Live != 0 {
			t.Fatalf("audit: %+v", rep)
		}
		s.FlushCache()
		checkClean(t, s)
	}
}

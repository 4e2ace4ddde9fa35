package sched

import (
	"context"
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"github.com/baton-serving/baton/engine/model"
	"github.com/baton-serving/baton/engine/sample"
	"github.com/baton-serving/baton/kernels/quant"
)

// referencePromptLogprobs feeds prompt one token at a time through Forward
// on a contiguous cache and returns, for every prompt token after the
// first, its log-probability and top alternatives under the logits after
// the token before it.
func referencePromptLogprobs(t testing.TB, m model.Model, prompt []int32, top int) []sample.Token {
	t.Helper()
	cache, err := model.NewContiguousCache(m.Config(), len(prompt))
	if err != nil {
		t.Fatal(err)
	}
	logits := make([]float32, m.Config().Vocab)
	var out []sample.Token
	for i, id := range prompt {
		if i > 0 {
			lp, alts := sample.Logprobs(logits, id, top)
			out = append(out, sample.Token{ID: id, Logprob: lp, Top: alts})
		}
		if err := m.Forward([]int32{id}, i, cache, logits); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// promptLogprobsOf returns the prompt logprobs a stream delivered and fails
// the test unless exactly one event — the first token's, or EventDone when
// there was none — carried them.
func promptLogprobsOf(t testing.TB, res result) []sample.Token {
	t.Helper()
	var got []sample.Token
	carriers := 0
	firstToken := -1
	for i, ev := range res.events {
		if ev.Kind == EventToken && firstToken < 0 {
			firstToken = i
		}
		if ev.PromptLogprobs != nil {
			carriers++
			got = ev.PromptLogprobs
			if want := firstToken; want < 0 && ev.Kind != EventDone || want >= 0 && i != want {
				t.Errorf("prompt logprobs on event %d (%v), want the first token's (event %d) or EventDone without tokens", i, ev.Kind, firstToken)
			}
		}
	}
	if carriers > 1 {
		t.Errorf("prompt logprobs on %d events, want one", carriers)
	}
	return got
}

// checkOrdered fails unless every entry's alternatives are ordered most
// likely first, lowest id first on ties, and number top.
func checkOrdered(t testing.TB, lps []sample.Token, top int) {
	t.Helper()
	for i, lp := range lps {
		if len(lp.Top) != top {
			t.Fatalf("entry %d: %d alternatives, want %d", i, len(lp.Top), top)
		}
		for k := 1; k < len(lp.Top); k++ {
			a, b := lp.Top[k-1], lp.Top[k]
			if a.Logprob < b.Logprob || a.Logprob == b.Logprob && a.ID > b.ID {
				t.Fatalf("entry %d: alternatives %v not ordered most likely first, lowest id on ties", i, lp.Top)
			}
		}
		if top > 0 && lp.Logprob > lp.Top[0].Logprob {
			t.Fatalf("entry %d: token logprob %v above the best alternative's %v", i, lp.Logprob, lp.Top[0].Logprob)
		}
	}
}

// TestPromptLogprobs: with Request.PromptLogprobs, a colocated request and
// a prefill-only one return, on their first token, the log-probability of
// every prompt token after the first, bit-identical to the prompt fed one
// token at a time through Forward — whatever the chunking (budgets of 5
// and 512 tokens, prompts longer than the model's output-head group) and
// whatever else is batched. Requests without the flag beside them get
// none and the same tokens as alone.
func TestPromptLogprobs(t *testing.T) {
	tm := loadSmall(t, 2)
	cfg := tm.cfg()
	rng := rand.New(rand.NewPCG(41, 42))
	prompt := func(n int) []int32 {
		p := make([]int32, n)
		for i := range p {
			p[i] = int32(3 + rng.IntN(cfg.Vocab-3))
		}
		return p
	}
	type echoReq struct {
		prompt []int32
		top    int
	}
	echoes := []echoReq{{prompt(1), 3}, {prompt(2), 0}, {prompt(45), 5}, {prompt(70), sample.MaxTopLogprobs}, {prompt(33), 1}}
	plain := randomRequests(rng, cfg, 4)
	aloneSched := newSched(t, Config{Model: tm.m, Pool: newPool(t, tm, 4, 128, quant.F32), Tokenizer: tm.tok})
	alone := make([]result, len(plain))
	for i := range plain {
		alone[i] = runAll(t, aloneSched, plain[i:i+1])[0]
	}
	for _, budget := range []int{5, 512} {
		for _, mode := range []Mode{ModeGenerate, ModePrefillOnly} {
			t.Run(fmt.Sprint("budget", budget, "/", mode), func(t *testing.T) {
				s := newSched(t, Config{Model: tm.m, Pool: newPool(t, tm, 4, 256, quant.F32), Tokenizer: tm.tok, MaxBatchTokens: budget})
				var reqs []Request
				for i, e := range echoes {
					p := greedy()
					p.Logprobs, p.TopLogprobs = e.top > 0, e.top
					reqs = append(reqs, Request{ID: fmt.Sprint("echo", i), Mode: mode, Prompt: e.prompt, MaxTokens: 3, Params: p, PromptLogprobs: true})
				}
				reqs = append(reqs, plain...)
				ctx := context.Background()
				streams := make([]*Stream, len(reqs))
				for i, r := range reqs {
					st, err := s.Submit(ctx, r)
					if err != nil {
						t.Fatal(err)
					}
					streams[i] = st
				}
				got := make([]result, len(reqs))
				for i, st := range streams {
					if reqs[i].Mode == ModePrefillOnly {
						got[i] = collectHandover(t, st, time.Minute)
					} else {
						got[i] = collect(t, st, time.Minute)
					}
				}
				for i, e := range echoes {
					lps := promptLogprobsOf(t, got[i])
					want := referencePromptLogprobs(t, tm.m, e.prompt, e.top)
					if len(lps) != len(e.prompt)-1 || !reflect.DeepEqual(lps, want) && len(want) > 0 {
						t.Fatalf("echo %d (%d tokens): prompt logprobs %d entries, differ from Forward one token at a time (%d entries)",
							i, len(e.prompt), len(lps), len(want))
					}
					checkOrdered(t, lps, e.top)
				}
				for i := range plain {
					res := got[len(echoes)+i]
					if lps := promptLogprobsOf(t, res); lps != nil {
						t.Errorf("request %d without the flag got %d prompt logprobs", i, len(lps))
					}
					if !sameResult(res, alone[i]) {
						t.Errorf("request %d without the flag: %v (%s) beside echo requests, %v (%s) alone", i, res.ids, res.done.Finish, alone[i].ids, alone[i].done.Finish)
					}
				}
				checkClean(t, s)
			})
		}
	}
}

// collectHandover reads a prefill-only stream, handing over after its
// first token, to its end.
func collectHandover(t testing.TB, st *Stream, timeout time.Duration) result {
	t.Helper()
	res := collectEach(t, st, timeout, func(Event) {
		if err := st.Handover(); err != nil {
			t.Fatal(err)
		}
	})
	if res.done.Finish != FinishHandedOver {
		t.Fatalf("request %s: ended %+v, want handed over", st.ID(), res.done)
	}
	return res
}

// TestPromptLogprobsPreempted: echo requests under page pressure are
// preempted while prefilling or decoding and recomputed; each still
// reports every prompt token once, equal to the reference, and every page
// comes back.
func TestPromptLogprobsPreempted(t *testing.T) {
	tm := loadSmall(t, 2)
	cfg := tm.cfg()
	reqs := randomRequests(rand.New(rand.NewPCG(51, 52)), cfg, 16)
	maxPages := 0
	for i := range reqs {
		reqs[i].IgnoreEOS = true
		reqs[i].PromptLogprobs = true
		maxPages = max(maxPages, (len(reqs[i].Prompt)+reqs[i].MaxTokens-1+3)/4)
	}
	obs := &maxSeqs{}
	s := newSched(t, Config{Model: tm.m, Pool: newPool(t, tm, 4, 2*maxPages+1, quant.F32), Tokenizer: tm.tok, Observer: obs, MaxBatchTokens: 6})
	res := runAll(t, s, reqs)
	for i, r := range reqs {
		want := referencePromptLogprobs(t, tm.m, r.Prompt, r.Params.TopLogprobs)
		if got := promptLogprobsOf(t, res[i]); len(got) != len(r.Prompt)-1 || len(want) > 0 && !reflect.DeepEqual(got, want) {
			t.Errorf("request %d (%d-token prompt, %d preemptions): %d prompt logprobs, differ from the reference", i, len(r.Prompt), res[i].done.Usage.Preemptions, len(got))
		}
	}
	if _, pre := obs.get(); pre == 0 {
		t.Error("no preemption: the test must exercise recomputation")
	}
	checkClean(t, s)
}

// TestPromptLogprobsNoToken: a greedy request whose first token is an
// end-of-generation token emits no EventToken; its EventDone carries the
// prompt logprobs instead.
func TestPromptLogprobsNoToken(t *testing.T) {
	tm := loadSmall(t, 1)
	cfg := tm.cfg()
	// A prompt whose greedy continuation is an end-of-generation token.
	cache, err := model.NewContiguousCache(cfg, 0)
	if err != nil {
		t.Fatal(err)
	}
	logits := make([]float32, cfg.Vocab)
	rng := rand.New(rand.NewPCG(61, 62))
	var prompt []int32
	for try := 0; try < 40 && prompt == nil; try++ {
		base := make([]int32, 1+try%8)
		for i := range base {
			base[i] = int32(rng.IntN(cfg.Vocab))
		}
		if err := tm.m.Forward(base, 0, cache, nil); err != nil {
			t.Fatal(err)
		}
		for x := range int32(cfg.Vocab) {
			if err := tm.m.Forward([]int32{x}, len(base), cache, logits); err != nil {
				t.Fatal(err)
			}
			if tm.tok.IsEOG(sample.Greedy(logits)) {
				prompt = append(base, x)
				break
			}
		}
	}
	if prompt == nil {
		t.Fatal("no prompt found whose greedy next token ends generation")
	}
	s := newSched(t, Config{Model: tm.m, Pool: newPool(t, tm, 4, 16, quant.F32), Tokenizer: tm.tok})
	p := greedy()
	p.TopLogprobs = 2
	res := runAll(t, s, []Request{{Prompt: prompt, MaxTokens: 4, Params: p, PromptLogprobs: true}})[0]
	if len(res.ids) != 0 || res.done.Finish != FinishStop {
		t.Fatalf("tokens %v, finish %s; want none, stop", res.ids, res.done.Finish)
	}
	if got, want := res.done.PromptLogprobs, referencePromptLogprobs(t, tm.m, prompt, 2); !reflect.DeepEqual(got, want) {
		t.Fatalf("EventDone's prompt logprobs %v, want %v", got, want)
	}
	checkClean(t, s)
}

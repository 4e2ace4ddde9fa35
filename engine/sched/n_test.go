package sched

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/baton-serving/baton/engine"
	"github.com/baton-serving/baton/engine/kvcache"
	"github.com/baton-serving/baton/engine/sample"
	"github.com/baton-serving/baton/kernels/quant"
)

// collectChoices reads a stream of n choices to its end and splits it by
// Event.Choice, failing on an event after its choice's EventDone, a
// choice outside [0, n) or a channel closed before every choice ended.
func collectChoices(t testing.TB, st *Stream, n int, timeout time.Duration) []result {
	t.Helper()
	res := make([]result, n)
	deadline := time.After(timeout)
	for {
		select {
		case ev, ok := <-st.Events():
			if !ok {
				for k, r := range res {
					if r.done.Kind != EventDone {
						t.Fatalf("request %s: channel closed before choice %d's EventDone", st.ID(), k)
					}
				}
				return res
			}
			if ev.Choice < 0 || ev.Choice >= n {
				t.Fatalf("request %s: event of choice %d of %d", st.ID(), ev.Choice, n)
			}
			r := &res[ev.Choice]
			if r.done.Kind == EventDone {
				t.Fatalf("request %s: choice %d: event %v after EventDone", st.ID(), ev.Choice, ev.Kind)
			}
			r.events = append(r.events, ev)
			switch ev.Kind {
			case EventToken:
				r.ids = append(r.ids, ev.Token.ID)
				r.text += ev.Text
			case EventDone:
				r.text += ev.Text
				r.done = ev
			}
		case <-deadline:
			t.Fatalf("request %s: no end after %v", st.ID(), timeout)
		}
	}
}

// choiceRequests makes requests whose prompt lengths land the fork point
// at every place in a page of 4 (a one-token prompt, the last position
// starting a page, in the middle, at its end), greedy and seeded.
func choiceRequests(rng *rand.Rand, vocab int) []Request {
	var reqs []Request
	for i, plen := range []int{1, 5, 7, 8, 13, 30} {
		prompt := make([]int32, plen)
		for j := range prompt {
			prompt[j] = int32(3 + rng.IntN(vocab-3))
		}
		p := greedy()
		if i%3 != 0 {
			p = sample.Defaults()
			p.Temperature, p.TopK, p.TopP = 0.9, 40, 0.95
			p.Seed = uint64(100 + i)
			p.TopLogprobs = 2
		}
		reqs = append(reqs, Request{Prompt: prompt, MaxTokens: 6 + rng.IntN(8), Params: p, StopIDs: []int32{int32(3 + rng.IntN(vocab-3))}})
	}
	return reqs
}

// independent returns the requests that choice k of req equals on its own.
func independent(req Request, n int) []Request {
	out := make([]Request, n)
	for k := range out {
		out[k] = req
		out[k].N = 0
		out[k].Params.Seed = sample.ChoiceSeed(req.Params.Seed, k)
	}
	return out
}

// TestChoicesSameOutput: each choice of a request with N = 3 gives exactly
// the tokens, text, logprobs and finish of a request of its own with the
// choice's derived seed (greedy ones: all alike) — without and with the
// prefix cache, and in a pool small enough to preempt — while the choices
// share the prompt: each but the first reuses all but one prompt position.
func TestChoicesSameOutput(t *testing.T) {
	tm := loadSmall(t, 2)
	reqs := choiceRequests(rand.New(rand.NewPCG(41, 42)), tm.cfg().Vocab)
	const n = 3
	plain := newSched(t, Config{Model: tm.m, Pool: newPool(t, tm, 4, 256, quant.F32), Tokenizer: tm.tok})
	want := make([][]result, len(reqs))
	for i, r := range reqs {
		want[i] = runAll(t, plain, independent(r, n))
	}
	for _, tc := range []struct {
		name  string
		cache bool
		pages int
	}{{"plain", false, 256}, {"prefix-cache", true, 256}, {"preempting", false, 14}, {"preempting-cache", true, 14}} {
		t.Run(tc.name, func(t *testing.T) {
			obs := &maxSeqs{}
			pool := newPool(t, tm, 4, tc.pages, quant.F32)
			if tc.cache {
				if err := pool.EnableCache(tm.m.Fingerprint(), tc.pages); err != nil {
					t.Fatal(err)
				}
			}
			s := newSched(t, Config{Model: tm.m, Pool: pool, Tokenizer: tm.tok, Observer: obs, MaxBatchTokens: 16})
			streams := make([]*Stream, len(reqs))
			for i, r := range reqs {
				r.N = n
				st, err := s.Submit(t.Context(), r)
				if err != nil {
					t.Fatal(err)
				}
				streams[i] = st
			}
			for i, st := range streams {
				got := collectChoices(t, st, n, 2*time.Minute)
				for k := range n {
					if !sameResult(got[k], want[i][k]) {
						t.Errorf("request %d choice %d: %v (%s), alone %v (%s)", i, k, got[k].ids, got[k].done.Finish, want[i][k].ids, want[i][k].done.Finish)
					}
					if u := got[k].done.Usage; u.PromptTokens != len(reqs[i].Prompt) || u.CompletionTokens != len(got[k].ids) {
						t.Errorf("request %d choice %d: usage %+v for %d tokens", i, k, u, len(got[k].ids))
					}
				}
				if reqs[i].Params.Temperature == 0 {
					for k := 1; k < n; k++ {
						if !sameResult(got[k], got[0]) {
							t.Errorf("greedy request %d: choice %d %v, choice 0 %v", i, k, got[k].ids, got[0].ids)
						}
					}
				}
			}
			if _, pre := obs.get(); tc.pages < 256 && pre == 0 {
				t.Errorf("the small pool preempted nothing")
			}
			// The summaries are reported after the events: only once the
			// scheduler's goroutine has exited are they all in.
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			obs.mu.Lock()
			defer obs.mu.Unlock()
			if tc.pages == 256 {
				// Nothing was preempted: every choice after the first
				// forked, reusing all but the last prompt position.
				choices := 0
				for _, d := range obs.done {
					if d.Choice == 0 {
						continue
					}
					choices++
					if !strings.HasSuffix(d.ID, fmt.Sprintf("/%d", d.Choice)) || d.Usage.CachedTokens != d.Usage.PromptTokens-1 {
						t.Errorf("%s (choice %d): %d of %d prompt tokens reused, want all but one", d.ID, d.Choice, d.Usage.CachedTokens, d.Usage.PromptTokens)
					}
				}
				if choices != len(reqs)*(n-1) {
					t.Errorf("%d summaries of choices after the first, want %d", choices, len(reqs)*(n-1))
				}
				// The prompt is computed once: each choice after the
				// first computes one position (a one-token prompt's own).
				want, alone := 0, 0
				for _, r := range reqs {
					want += len(r.Prompt) + n - 1
					alone += n * len(r.Prompt)
				}
				if tc.cache {
					want = obs.prefill // the cache may save more: only bound it
				}
				if obs.prefill != want || obs.prefill > alone {
					t.Errorf("%d prompt positions computed, want %d (%d for %d independent requests)", obs.prefill, want, alone, n*len(reqs))
				}
				t.Logf("%d prompt positions computed for %d requests of %d choices (%d as independent requests)", obs.prefill, len(reqs), n, alone)
			}
			s.FlushCache()
			checkClean(t, s)
		})
	}
}

// TestChoicesSharePages pins down the fork on the fake model: the choices
// after the first hold a reference to each full page of the first choice's
// prompt (the auditor's references = holders) and their own copy of the
// partial page, compute only the last prompt position, and once all have
// finished every page is free.
func TestChoicesSharePages(t *testing.T) {
	fm := newFakeModel(0)
	pool, err := kvcache.New(fm.cfg.KVLayout(2, quant.F32), 32)
	if err != nil {
		t.Fatal(err)
	}
	s := newSched(t, Config{Model: fm, Pool: pool, Manual: true, MaxBatchTokens: 8})
	// 6 prompt tokens, pages of 2: the fork point 5 shares pages 0 and 1
	// and copies page 2.
	st, err := s.Submit(t.Context(), Request{ID: "r", Prompt: []int32{1, 2, 3, 4, 5, 6}, MaxTokens: 3, Params: greedy(), N: 3})
	if err != nil {
		t.Fatal(err)
	}
	step := func() {
		t.Helper()
		if _, _, err := s.Step(); err != nil {
			t.Fatal(err)
		}
		if rep := s.Audit(); !rep.OK() {
			t.Fatalf("audit: %+v", rep)
		}
	}
	step() // choice 0 computes the prompt; 1 and 2 fork from it at once
	snap := s.Snapshot()
	if len(snap.Requests) != 3 || snap.Requests[1].State != StatePrefilling || snap.Requests[1].Pages != 3 || snap.Requests[1].Computed != 5 {
		t.Fatalf("after the first step: %+v", snap.Requests)
	}
	step() // 1 and 2 compute position 5; 0 decodes
	s.mu.Lock()
	g := st.r.grp
	p0, p1, p2 := g.members[0].table.Clone(), g.members[1].table.Clone(), g.members[2].table.Clone()
	s.mu.Unlock()
	for i := range 2 {
		if p1[i] != p0[i] || p2[i] != p0[i] || pool.Refs(p0[i]) != 3 {
			t.Errorf("full page %d: choices hold %d, %d, %d with %d references, want one page, 3", i, p0[i], p1[i], p2[i], pool.Refs(p0[i]))
		}
	}
	if p1[2] == p0[2] || p2[2] == p0[2] || p1[2] == p2[2] || pool.Refs(p1[2]) != 1 {
		t.Errorf("partial pages %d, %d, %d: want three copies", p0[2], p1[2], p2[2])
	}
	// The second batch: choice 0's decode token at 6, the others' last
	// prompt position 5, each with logits.
	b := fm.recorded()
	last := b[len(b)-1]
	if len(last) != 3 || last[0].Pos != 6 || last[1].Pos != 5 || len(last[1].Tokens) != 1 || !last[1].Logits || last[2].Pos != 5 {
		t.Errorf("second batch %v", last)
	}
	stepUntilIdle(t, s)
	res := collectChoices(t, st, 3, time.Second)
	for k, r := range res {
		if len(r.ids) != 3 || r.done.Finish != FinishLength {
			t.Errorf("choice %d: %v %s", k, r.ids, r.done.Finish)
		}
	}
	checkClean(t, s)
}

// TestChoicesFirstEnds: when the first choice ends at its first token
// (MaxTokens 1), the others have already forked from its prompt: the
// prompt is computed once even without the prefix cache, and each choice
// still equals its request alone.
func TestChoicesFirstEnds(t *testing.T) {
	tm := loadSmall(t, 1)
	const n = 3
	for _, imported := range []bool{false, true} {
		obs := &maxSeqs{}
		s := newSched(t, Config{Model: tm.m, Pool: newPool(t, tm, 4, 64, quant.F32), Tokenizer: tm.tok, Observer: obs})
		p := sample.Defaults()
		p.Seed = 3
		r := Request{Prompt: []int32{5, 6, 7, 8, 9, 10, 11, 12, 13, 14}, MaxTokens: 1, Params: p, N: n}
		want := runAll(t, newSched(t, Config{Model: tm.m, Pool: newPool(t, tm, 4, 64, quant.F32), Tokenizer: tm.tok}), independent(r, n))
		if imported {
			// The first choice imports the prompt (zero keys and values
			// would do for the fork's bookkeeping, but the outputs are
			// compared: compute them colocated first and copy).
			r.Mode = ModeDecodeImported
		}
		st, err := s.Submit(t.Context(), r)
		if err != nil {
			t.Fatal(err)
		}
		if imported {
			ev := <-st.Events()
			src := newPool(t, tm, 4, 64, quant.F32)
			pre := newSched(t, Config{Model: tm.m, Pool: src, Tokenizer: tm.tok})
			pr := r
			pr.Mode, pr.N = ModePrefillOnly, 0
			pst, err := pre.Submit(t.Context(), pr)
			if err != nil {
				t.Fatal(err)
			}
			var first sample.Token
			for pev := range pst.Events() {
				switch pev.Kind {
				case EventPagesReady:
					if pev.Ready == len(pev.Pages) {
						for j := range pev.Pages {
							for l := range tm.cfg().Layers {
								k, v := src.PageBytes(pev.Pages[j], l)
								if err := s.cfg.Pool.Import(ev.Pages[j], l, k, v); err != nil {
									t.Fatal(err)
								}
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
			if err := st.Activate(first); err != nil {
				t.Fatal(err)
			}
		}
		got := collectChoices(t, st, n, time.Minute)
		for k := range n {
			if !sameResult(got[k], want[k]) {
				t.Errorf("imported %t choice %d: %v, alone %v", imported, k, got[k].ids, want[k].ids)
			}
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		wantPrefill := len(r.Prompt) + n - 1
		if imported {
			wantPrefill = n - 1 // the prompt came by import
		}
		if obs.prefill != wantPrefill {
			t.Errorf("imported %t: %d prompt positions computed, want %d", imported, obs.prefill, wantPrefill)
		}
		checkClean(t, s)
	}
}

// TestChoicesCancel: cancelling the request's context, mid-decode, ends
// every choice (FinishCancelled) and frees every page; one choice aborted
// on its own (its consumer is the same, but the scheduler aborts choices
// one at a time) leaves the others running with their pages.
func TestChoicesCancel(t *testing.T) {
	tm := loadSmall(t, 1)
	s := newSched(t, Config{Model: tm.m, Pool: newPool(t, tm, 4, 64, quant.F16), Tokenizer: tm.tok})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	p := sample.Defaults()
	p.Seed = 7
	st, err := s.Submit(ctx, Request{Prompt: []int32{5, 6, 7, 8, 9, 10, 11}, MaxTokens: 60, Params: p, IgnoreEOS: true, N: 4})
	if err != nil {
		t.Fatal(err)
	}
	tokens := make([]int, 4)
	done := 0
	for ev := range st.Events() {
		switch ev.Kind {
		case EventToken:
			if tokens[ev.Choice]++; tokens[ev.Choice] == 2 {
				cancel()
			}
		case EventDone:
			done++
			if ev.Finish != FinishCancelled || !errors.Is(ev.Err, context.Canceled) {
				t.Errorf("choice %d: %s %v", ev.Choice, ev.Finish, ev.Err)
			}
		}
	}
	if done != 4 {
		t.Fatalf("%d EventDones for 4 choices", done)
	}
	checkClean(t, s)
}

// TestChoicesImported: on decode, the first choice imports the prompt
// prefill computed and the others fork from it once activated; every
// choice equals the colocated one.
func TestChoicesImported(t *testing.T) {
	tm := loadSmall(t, 1)
	cfg := tm.cfg()
	const n = 3
	reqs := choiceRequests(rand.New(rand.NewPCG(43, 44)), cfg.Vocab)
	colo := newSched(t, Config{Model: tm.m, Pool: newPool(t, tm, 4, 128, quant.F32), Tokenizer: tm.tok})
	ppool, dpool := newPool(t, tm, 4, 64, quant.F32), newPool(t, tm, 4, 128, quant.F32)
	pre := newSched(t, Config{Model: tm.m, Pool: ppool, Tokenizer: tm.tok})
	dec := newSched(t, Config{Model: tm.m, Pool: dpool, Tokenizer: tm.tok})
	for i, r := range reqs {
		want := runAll(t, colo, independent(r, n))
		dr := r
		dr.Mode, dr.N = ModeDecodeImported, n
		dst, err := dec.Submit(t.Context(), dr)
		if err != nil {
			t.Fatal(err)
		}
		ev := <-dst.Events()
		if ev.Kind != EventReserved || ev.Choice != 0 {
			t.Fatalf("request %d: first decode event %+v", i, ev)
		}
		pr := r
		pr.Mode = ModePrefillOnly
		pst, err := pre.Submit(t.Context(), pr)
		if err != nil {
			t.Fatal(err)
		}
		var first sample.Token
		for pev := range pst.Events() {
			switch pev.Kind {
			case EventToken:
				first = pev.Token
				if err := pst.Handover(); err != nil {
					t.Fatal(err)
				}
			case EventPagesReady:
				if pev.Ready == len(pev.Pages) {
					for j := range pev.Pages {
						for l := range cfg.Layers {
							k, v := ppool.PageBytes(pev.Pages[j], l)
							if err := dpool.Import(ev.Pages[j], l, k, v); err != nil {
								t.Fatal(err)
							}
						}
					}
				}
			}
		}
		if err := dst.Activate(first); err != nil {
			t.Fatal(err)
		}
		got := collectChoices(t, dst, n, time.Minute)
		for k := range n {
			if !sameResult(got[k], want[k]) {
				t.Errorf("request %d choice %d: PD %v (%s), colocated alone %v (%s)", i, k, got[k].ids, got[k].done.Finish, want[k].ids, want[k].done.Finish)
			}
		}
	}
	checkClean(t, pre)
	checkClean(t, dec)
}

// TestChoicesErrors: N below 0, N > 1 for a prefill-only request,
// constraints that do not match the choices, and more choices than
// MaxRequests leaves room for are refused at Submit.
func TestChoicesErrors(t *testing.T) {
	fm := newFakeModel(0)
	pool, err := kvcache.New(fm.cfg.KVLayout(2, quant.F32), 16)
	if err != nil {
		t.Fatal(err)
	}
	s := newSched(t, Config{Model: fm, Pool: pool, Manual: true, MaxRequests: 4})
	base := Request{Prompt: []int32{1, 2}, MaxTokens: 2, Params: greedy()}
	for _, tc := range []struct {
		name string
		mod  func(*Request)
		want error
	}{
		{"negative", func(r *Request) { r.N = -1 }, engine.ErrInvalidInput},
		{"prefill-only", func(r *Request) { r.N, r.Mode = 2, ModePrefillOnly }, engine.ErrInvalidInput},
		{"constraints without constraint", func(r *Request) { r.N, r.Constraints = 2, []sample.Constraint{nil} }, engine.ErrInvalidInput},
		{"too many", func(r *Request) { r.N = 5 }, ErrQueueFull},
	} {
		r := base
		tc.mod(&r)
		if _, err := s.Submit(t.Context(), r); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
	st, err := s.Submit(t.Context(), Request{ID: "x", Prompt: []int32{1, 2}, MaxTokens: 2, Params: greedy(), N: 4})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Submit(t.Context(), Request{ID: "x/1", Prompt: []int32{1}, MaxTokens: 1, Params: greedy()}); !errors.Is(err, ErrQueueFull) {
		t.Errorf("a fifth request: %v", err)
	}
	stepUntilIdle(t, s)
	if res := collectChoices(t, st, 4, time.Second); res[3].done.Finish != FinishLength {
		t.Errorf("choice 3: %+v", res[3].done)
	}
	checkClean(t, s)
}

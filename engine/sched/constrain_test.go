package sched

import (
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/baton-serving/baton/engine"
	"github.com/baton-serving/baton/engine/grammar"
	"github.com/baton-serving/baton/engine/sample"
	"github.com/baton-serving/baton/kernels/quant"
)

// TestConstrainedPreemption: requests under a grammar, more than the pool
// holds at once, are preempted and recomputed; each still generates what
// it generates alone (the matcher only depends on the accepted tokens, so
// it survives the recomputation) and its text is a prefix of a sentence of
// the grammar, or a whole one when it ended with stop.
func TestConstrainedPreemption(t *testing.T) {
	tm := loadSmall(t, 2)
	cfg := tm.cfg()
	pieces := make([][]byte, cfg.Vocab)
	for id := range pieces {
		pieces[id] = tm.tok.TokenBytes(int32(id))
	}
	vocab := grammar.NewVocab(pieces, tm.tok.EOGs())
	// Complete after every item, never finished: EOG may end it where
	// ignore_eos is off.
	g, err := grammar.Parse(`root ::= item+
item ::= [a-z]{1,3} " " | "(" [0-9]{1,4} ") "`)
	if err != nil {
		t.Fatal(err)
	}
	reqs := randomRequests(rand.New(rand.NewPCG(41, 42)), cfg, 16)
	maxPages := 0
	for i := range reqs {
		reqs[i].IgnoreEOS = i%4 != 0
		reqs[i].MaxTokens = max(reqs[i].MaxTokens, 8)
		maxPages = max(maxPages, (len(reqs[i].Prompt)+reqs[i].MaxTokens-1+3)/4)
	}
	withMatchers := func() []Request {
		out := make([]Request, len(reqs))
		for i, r := range reqs {
			r.Constraint = g.NewMatcher(vocab)
			out[i] = r
		}
		return out
	}
	aloneSched := newSched(t, Config{Model: tm.m, Pool: newPool(t, tm, 4, 64, quant.F16), Tokenizer: tm.tok})
	obs := &maxSeqs{}
	s := newSched(t, Config{Model: tm.m, Pool: newPool(t, tm, 4, 2*maxPages+1, quant.F16), Tokenizer: tm.tok, Observer: obs, MaxBatchTokens: 16})
	batch := runAll(t, s, withMatchers())
	alone := withMatchers()
	stops := 0
	for i := range reqs {
		one := runAll(t, aloneSched, alone[i:i+1])[0]
		if !sameResult(batch[i], one) {
			t.Errorf("request %d: under page pressure %v %q (%s), alone %v %q", i, batch[i].ids, batch[i].text, batch[i].done.Finish, one.ids, one.text)
		}
		if batch[i].done.Err != nil {
			t.Fatalf("request %d: %v", i, batch[i].done.Err)
		}
		m := g.NewMatcher(vocab)
		if err := m.AcceptBytes([]byte(batch[i].text)); err != nil {
			t.Errorf("request %d: %q is not a prefix of the grammar: %v", i, batch[i].text, err)
		}
		if batch[i].done.Finish == FinishStop {
			stops++
			if !g.MatchString(batch[i].text) {
				t.Errorf("request %d stopped on %q, not a sentence", i, batch[i].text)
			}
		}
	}
	if _, pre := obs.get(); pre == 0 {
		t.Error("no preemption: the test must exercise it")
	}
	t.Logf("%d requests, %d ended with stop", len(reqs), stops)
	checkClean(t, s)
}

// TestChoicesConstrained: under a grammar, each of n = 3 choices (each
// with its own matcher) generates what a constrained request of its own
// with the choice's seed does, and stays inside the grammar.
func TestChoicesConstrained(t *testing.T) {
	tm := loadSmall(t, 2)
	cfg := tm.cfg()
	pieces := make([][]byte, cfg.Vocab)
	for id := range pieces {
		pieces[id] = tm.tok.TokenBytes(int32(id))
	}
	vocab := grammar.NewVocab(pieces, tm.tok.EOGs())
	g, err := grammar.Parse(`root ::= item+
item ::= [a-z]{1,3} " " | "(" [0-9]{1,4} ") "`)
	if err != nil {
		t.Fatal(err)
	}
	const n = 3
	s := newSched(t, Config{Model: tm.m, Pool: newPool(t, tm, 4, 128, quant.F16), Tokenizer: tm.tok})
	for _, r := range choiceRequests(rand.New(rand.NewPCG(45, 46)), cfg.Vocab) {
		r.IgnoreEOS = true
		alone := independent(r, n)
		for k := range alone {
			alone[k].Constraint = g.NewMatcher(vocab)
		}
		want := runAll(t, s, alone)
		r.N, r.Constraint = n, g.NewMatcher(vocab)
		for range n - 1 {
			r.Constraints = append(r.Constraints, g.NewMatcher(vocab))
		}
		st, err := s.Submit(t.Context(), r)
		if err != nil {
			t.Fatal(err)
		}
		got := collectChoices(t, st, n, time.Minute)
		for k := range n {
			if !sameResult(got[k], want[k]) {
				t.Errorf("%d-token prompt, choice %d: %q, alone %q", len(r.Prompt), k, got[k].text, want[k].text)
			}
			if err := g.NewMatcher(vocab).AcceptBytes([]byte(got[k].text)); err != nil {
				t.Errorf("choice %d: %q is outside the grammar: %v", k, got[k].text, err)
			}
		}
	}
	// The constraints must match the choices.
	bad := Request{Prompt: []int32{5, 6}, MaxTokens: 2, Params: greedy(), N: 3, Constraint: g.NewMatcher(vocab), Constraints: []sample.Constraint{g.NewMatcher(vocab)}}
	if _, err := s.Submit(t.Context(), bad); !errors.Is(err, engine.ErrInvalidInput) {
		t.Errorf("2 choices after the first with 1 constraint: %v", err)
	}
	bad.N, bad.Constraints = 1, []sample.Constraint{g.NewMatcher(vocab)}
	if _, err := s.Submit(t.Context(), bad); !errors.Is(err, engine.ErrInvalidInput) {
		t.Errorf("constraints for N = 1: %v", err)
	}
	checkClean(t, s)
}

package sched

import (
	"testing"
	"time"

	"github.com/baton-serving/baton/engine/kvcache"
	"github.com/baton-serving/baton/engine/model"
)

// gatedModel holds every forward pass until the test lets it go.
type gatedModel struct {
	*fakeModel
	entered chan struct{}
	gate    chan struct{}
}

func (g gatedModel) ForwardBatch(kv *kvcache.Pool, batch []model.Chunk) error {
	g.entered <- struct{}{}
	<-g.gate
	return g.fakeModel.ForwardBatch(kv, batch)
}

// TestSnapshotStepInProgress: while a forward pass runs, Snapshot says for
// how long and over how many tokens (the watchdog's bound for the step
// grows with them); between steps it reports none.
func TestSnapshotStepInProgress(t *testing.T) {
	fm := newFakeModel(0)
	g := gatedModel{fm, make(chan struct{}), make(chan struct{})}
	pool := newFakeSched(t, fm, 0).cfg.Pool
	s := newSched(t, Config{Model: g, Pool: pool, MaxBatchTokens: 4})
	st, err := s.Submit(t.Context(), Request{Prompt: []int32{1, 2, 3, 4, 5, 6}, MaxTokens: 2, Params: greedy()})
	if err != nil {
		t.Fatal(err)
	}
	<-g.entered // first chunk: 4 of the 6 prompt tokens
	time.Sleep(10 * time.Millisecond)
	if snap := s.Snapshot(); snap.StepTokens != 4 || snap.StepRunning < 10*time.Millisecond || snap.Steps != 0 {
		t.Errorf("during the first step: %d tokens, running %v, %d steps; want 4 tokens, ≥ 10ms, 0 steps", snap.StepTokens, snap.StepRunning, snap.Steps)
	}
	g.gate <- struct{}{}
	<-g.entered // the rest of the prompt
	if snap := s.Snapshot(); snap.StepTokens != 2 || snap.Steps != 1 {
		t.Errorf("during the second step: %d tokens, %d steps; want 2, 1", snap.StepTokens, snap.Steps)
	}
	g.gate <- struct{}{}
	<-g.entered // one decode token
	if snap := s.Snapshot(); snap.StepTokens != 1 {
		t.Errorf("during the decode step: %d tokens, want 1", snap.StepTokens)
	}
	g.gate <- struct{}{}
	collect(t, st, 5*time.Second)
	if snap := s.Snapshot(); snap.StepTokens != 0 || snap.StepRunning != 0 {
		t.Errorf("idle: %d tokens, running %v; want none", snap.StepTokens, snap.StepRunning)
	}
}

// TestSnapshotStarved: a request the last step left out for want of
// capacity others hold is marked starved; one that computes is not.
func TestSnapshotStarved(t *testing.T) {
	fm := newFakeModel(0)
	s := newFakeSched(t, fm, 1) // one request computes at a time
	submitAll(t, s, []Request{
		{ID: "a", Prompt: []int32{1, 2}, MaxTokens: 8, Params: greedy()},
		{ID: "b", Prompt: []int32{1, 2}, MaxTokens: 8, Params: greedy()},
	})
	if _, _, err := s.Step(); err != nil {
		t.Fatal(err)
	}
	starved := map[string]bool{}
	for _, r := range s.Snapshot().Requests {
		starved[r.ID] = r.Starved
	}
	if starved["a"] || !starved["b"] {
		t.Errorf("starved = %v; want b (waiting for the MaxSeqs slot a holds) only", starved)
	}
	stepUntilIdle(t, s)
}

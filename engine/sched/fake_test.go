package sched

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/baton-serving/baton/engine/kvcache"
	"github.com/baton-serving/baton/engine/model"
	"github.com/baton-serving/baton/kernels/quant"
)

var errFakeForward = errors.New("fake model: forward pass failed")

// fakeModel is a [Model] that records every batch it is given and answers
// each chunk that asks for logits with a one-hot vector on its last token
// plus one, so greedy decoding continues the prompt's count. It fails the
// forward pass of step failAt (counting from 1; 0 never), once.
type fakeModel struct {
	cfg    model.Config
	failAt int

	mu      sync.Mutex
	batches [][]fakeChunk
}

// fakeChunk is what a model.Chunk asked for, copied out of the
// scheduler's reused buffers.
type fakeChunk struct {
	Tokens []int32
	Pos    int
	Pages  []kvcache.PageID
	Logits bool
}

func (c fakeChunk) String() string {
	return fmt.Sprintf("{%v at %d pages %v logits %t}", c.Tokens, c.Pos, c.Pages, c.Logits)
}

func newFakeModel(failAt int) *fakeModel {
	return &fakeModel{
		cfg:    model.Config{Architecture: "fake", Layers: 1, Heads: 1, KVHeads: 1, HeadDim: 2, Dim: 2, Vocab: 64, ContextLength: 32},
		failAt: failAt,
	}
}

func (f *fakeModel) Config() model.Config { return f.cfg }

func (f *fakeModel) ForwardBatch(_ *kvcache.Pool, batch []model.Chunk) error {
	rec := make([]fakeChunk, len(batch))
	for i, ch := range batch {
		rec[i] = fakeChunk{Tokens: slices.Clone(ch.Tokens), Pos: ch.Pos, Pages: slices.Clone(ch.Pages), Logits: ch.Logits != nil}
	}
	f.mu.Lock()
	f.batches = append(f.batches, rec)
	step := len(f.batches)
	f.mu.Unlock()
	if step == f.failAt {
		return errFakeForward
	}
	for _, ch := range batch {
		if ch.Logits != nil {
			clear(ch.Logits)
			ch.Logits[(int(ch.Tokens[len(ch.Tokens)-1])+1)%len(ch.Logits)] = 1
		}
	}
	return nil
}

func (f *fakeModel) recorded() [][]fakeChunk {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.batches)
}

// newFakeSched is a manual scheduler on fm with pages of 2 positions and
// a step budget of 4 tokens.
func newFakeSched(t *testing.T, fm *fakeModel, maxSeqs int) *Scheduler {
	t.Helper()
	pool, err := kvcache.New(fm.cfg.KVLayout(2, quant.F32), 16)
	if err != nil {
		t.Fatal(err)
	}
	return newSched(t, Config{Model: fm, Pool: pool, Manual: true, MaxBatchTokens: 4, MaxSeqs: maxSeqs})
}

// stepUntilIdle runs manual steps until the scheduler has nothing to do.
func stepUntilIdle(t *testing.T, s *Scheduler) {
	t.Helper()
	for range 100 {
		_, busy, err := s.Step()
		if err != nil {
			t.Fatal(err)
		}
		if !busy {
			return
		}
	}
	t.Fatal("scheduler still busy after 100 steps")
}

func submitAll(t *testing.T, s *Scheduler, reqs []Request) []*Stream {
	t.Helper()
	streams := make([]*Stream, len(reqs))
	for i, r := range reqs {
		st, err := s.Submit(t.Context(), r)
		if err != nil {
			t.Fatal(err)
		}
		streams[i] = st
	}
	return streams
}

// TestFakeBatchComposition pins down exactly what each step sends to the
// model: running sequences first, then prompt chunks cut at the token
// budget, logits only for a prompt's last chunk and for decode tokens, and
// the pages a fresh pool hands out in order. A real model cannot show this:
// only its outputs are visible.
func TestFakeBatchComposition(t *testing.T) {
	fm := newFakeModel(0)
	s := newFakeSched(t, fm, 0)
	streams := submitAll(t, s, []Request{
		{ID: "a", Prompt: []int32{10, 11, 12, 13, 14}, MaxTokens: 2, Params: greedy()},
		{ID: "b", Prompt: []int32{20, 21}, MaxTokens: 2, Params: greedy()},
	})
	stepUntilIdle(t, s)

	want := [][]fakeChunk{
		// a's prompt fills the budget; b is admitted but waits.
		{{Tokens: []int32{10, 11, 12, 13}, Pos: 0, Pages: []kvcache.PageID{0, 1, 2}}},
		// a's last prompt token and b's whole prompt, both sampling.
		{
			{Tokens: []int32{14}, Pos: 4, Pages: []kvcache.PageID{0, 1, 2}, Logits: true},
			{Tokens: []int32{20, 21}, Pos: 0, Pages: []kvcache.PageID{3}, Logits: true},
		},
		// Both decode; b grows into a second page.
		{
			{Tokens: []int32{15}, Pos: 5, Pages: []kvcache.PageID{0, 1, 2}, Logits: true},
			{Tokens: []int32{22}, Pos: 2, Pages: []kvcache.PageID{3, 4}, Logits: true},
		},
	}
	got := fm.recorded()
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("batches:\n got %v\nwant %v", got, want)
	}

	for i, wantIDs := range [][]int32{{15, 16}, {22, 23}} {
		res := collect(t, streams[i], time.Minute)
		if !slices.Equal(res.ids, wantIDs) || res.done.Finish != FinishLength {
			t.Errorf("request %s: %v (%s), want %v (length)", streams[i].ID(), res.ids, res.done.Finish, wantIDs)
		}
	}
	checkClean(t, s)
}

// TestFakeForwardFailure: a failed forward pass ends every request of its
// batch with the model's error and their pages back in the pool, while a
// request that was not in the batch runs on as if nothing happened.
func TestFakeForwardFailure(t *testing.T) {
	fm := newFakeModel(2)
	s := newFakeSched(t, fm, 2) // c waits for a free sequence slot
	streams := submitAll(t, s, []Request{
		{ID: "a", Prompt: []int32{10, 11, 12, 13, 14}, MaxTokens: 2, Params: greedy()},
		{ID: "b", Prompt: []int32{20, 21}, MaxTokens: 2, Params: greedy()},
		{ID: "c", Prompt: []int32{30}, MaxTokens: 1, Params: greedy()},
	})
	stepUntilIdle(t, s)

	for _, st := range streams[:2] {
		res := collect(t, st, time.Minute)
		if res.done.Finish != FinishError || !errors.Is(res.done.Err, errFakeForward) || len(res.ids) != 0 {
			t.Errorf("request %s: %v, %s, %v; want no tokens, error wrapping %v", st.ID(), res.ids, res.done.Finish, res.done.Err, errFakeForward)
		}
	}
	res := collect(t, streams[2], time.Minute)
	if !slices.Equal(res.ids, []int32{31}) || res.done.Finish != FinishLength {
		t.Errorf("request c: %v (%s), want [31] (length)", res.ids, res.done.Finish)
	}
	if got := fm.recorded(); len(got) != 3 || len(got[1]) != 2 || len(got[2]) != 1 || got[2][0].Tokens[0] != 30 {
		t.Errorf("batches %v: want a and b failing together in step 2, then c alone", got)
	}
	checkClean(t, s)
}

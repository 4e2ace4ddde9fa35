package sched

import (
	"context"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/baton-serving/baton/engine/gguf"
	"github.com/baton-serving/baton/engine/kvcache"
	"github.com/baton-serving/baton/engine/model"
	"github.com/baton-serving/baton/engine/sample"
	"github.com/baton-serving/baton/engine/testmodel"
	"github.com/baton-serving/baton/engine/tokenizer"
	"github.com/baton-serving/baton/kernels/quant"
)

// TestMain fails the package if any test leaves a goroutine behind: the
// scheduler's loop, context watches and the models' workers must all exit.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// testModel is a loaded model with its tokenizer.
type testModel struct {
	m   model.Model
	tok *tokenizer.Tokenizer
}

func (tm testModel) cfg() model.Config { return tm.m.Config() }

// loadGGUF opens path and loads its model and tokenizer for the test.
func loadGGUF(t testing.TB, path string, threads int) testModel {
	t.Helper()
	f, err := gguf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := tokenizer.FromGGUF(f)
	if err != nil {
		t.Fatal(err)
	}
	m, err := model.Load(f, model.Options{Threads: threads})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		m.Close()
		f.Close()
	})
	return testModel{m: m, tok: tok}
}

// smallSpec is a random-weight model with grouped-query attention, small
// enough for property tests under the race detector.
func smallSpec() testmodel.Spec {
	return testmodel.Spec{Dim: 32, Hidden: 64, Layers: 2, Heads: 4, KVHeads: 2, Vocab: 300, Context: 96, Type: quant.F32, Seed: 3}
}

func writeSpec(t testing.TB, s testmodel.Spec) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "model.gguf")
	if err := testmodel.Write(path, s); err != nil {
		t.Fatal(err)
	}
	return path
}

func loadSmall(t testing.TB, threads int) testModel {
	return loadGGUF(t, writeSpec(t, smallSpec()), threads)
}

func newPool(t testing.TB, tm testModel, pageSize, pages int, dtype quant.Type) *kvcache.Pool {
	t.Helper()
	p, err := kvcache.New(tm.cfg().KVLayout(pageSize, dtype), pages)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func newSched(t testing.TB, cfg Config) *Scheduler {
	t.Helper()
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// result is everything a stream delivered.
type result struct {
	ids    []int32
	text   string
	events []Event
	done   Event
}

// collect reads a stream to its end, failing the test after timeout.
func collect(t testing.TB, st *Stream, timeout time.Duration) result {
	t.Helper()
	return collectEach(t, st, timeout, nil)
}

// collectEach is collect calling onToken (when not nil) after each token
// event is recorded, so a test can act on the stream mid-flight.
func collectEach(t testing.TB, st *Stream, timeout time.Duration, onToken func(Event)) result {
	t.Helper()
	var res result
	deadline := time.After(timeout)
	for {
		select {
		case ev, ok := <-st.Events():
			if !ok {
				if res.done.Kind != EventDone {
					t.Fatalf("request %s: channel closed without EventDone", st.ID())
				}
				return res
			}
			if res.done.Kind == EventDone {
				t.Fatalf("request %s: event %v after EventDone", st.ID(), ev.Kind)
			}
			res.events = append(res.events, ev)
			switch ev.Kind {
			case EventToken:
				res.ids = append(res.ids, ev.Token.ID)
				res.text += ev.Text
				if onToken != nil {
					onToken(ev)
				}
			case EventDone:
				res.text += ev.Text
				res.done = ev
			}
		case <-deadline:
			t.Fatalf("request %s: no end after %v", st.ID(), timeout)
		}
	}
}

// greedy returns sampling parameters for greedy decoding.
func greedy() sample.Params {
	p := sample.Defaults()
	p.Temperature = 0
	return p
}

// runAll submits reqs together to a running scheduler and collects them.
func runAll(t testing.TB, s *Scheduler, reqs []Request) []result {
	t.Helper()
	streams := make([]*Stream, len(reqs))
	for i, r := range reqs {
		st, err := s.Submit(context.Background(), r)
		if err != nil {
			t.Fatal(err)
		}
		streams[i] = st
	}
	out := make([]result, len(reqs))
	var wg sync.WaitGroup
	for i, st := range streams {
		wg.Go(func() { out[i] = collect(t, st, 2*time.Minute) })
	}
	wg.Wait()
	return out
}

// maxSeqs records the largest batch the scheduler ran.
type maxSeqs struct {
	NopObserver
	mu   sync.Mutex
	max  int
	pre  int
	done []Summary
	// prefill counts the prompt positions computed.
	prefill int
}

func (o *maxSeqs) Step(st StepStats) {
	o.mu.Lock()
	o.max = max(o.max, st.Seqs)
	o.pre += st.Preempted
	o.prefill += st.PrefillTokens
	o.mu.Unlock()
}

func (o *maxSeqs) RequestDone(s Summary) {
	o.mu.Lock()
	o.done = append(o.done, s)
	o.mu.Unlock()
}

func (o *maxSeqs) get() (maxBatch, preempted int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.max, o.pre
}

package sched

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/baton-serving/baton/engine"
	"github.com/baton-serving/baton/engine/sample"
	"github.com/baton-serving/baton/kernels/quant"
)

func TestNewErrors(t *testing.T) {
	tm := loadSmall(t, 1)
	pool := newPool(t, tm, 4, 4, quant.F32)
	other := smallSpec()
	other.Layers++
	wrong := newPool(t, loadGGUF(t, writeSpec(t, other), 1), 4, 4, quant.F32)
	tests := []struct {
		name string
		cfg  Config
	}{
		{"no model", Config{Pool: pool}},
		{"no pool", Config{Model: tm.m}},
		{"pool of another shape", Config{Model: tm.m, Pool: wrong}},
		{"bad event buffer", Config{Model: tm.m, Pool: pool, EventBuffer: 1}},
		{"bad batch", Config{Model: tm.m, Pool: pool, MaxBatchTokens: -1}},
		{"bad max seqs", Config{Model: tm.m, Pool: pool, MaxSeqs: -3}},
	}
	for _, tc := range tests {
		if _, err := New(tc.cfg); !errors.Is(err, engine.ErrInvalidInput) {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
}

func TestSubmitErrors(t *testing.T) {
	tm := loadSmall(t, 1)
	cfg := tm.cfg() // context 96
	s := newSched(t, Config{Model: tm.m, Pool: newPool(t, tm, 4, 10, quant.F32), Manual: true, MaxRequests: 3})
	ctx := context.Background()
	badParams := greedy()
	badParams.TopP = 0
	tests := []struct {
		name string
		req  Request
		want error
		text string
	}{
		{"empty prompt", Request{MaxTokens: 1, Params: greedy()}, engine.ErrInvalidInput, "empty prompt"},
		{"token", Request{Prompt: []int32{int32(cfg.Vocab)}, MaxTokens: 1, Params: greedy()}, engine.ErrInvalidInput, "vocabulary"},
		{"max tokens", Request{Prompt: []int32{1}, Params: greedy()}, engine.ErrInvalidInput, "MaxTokens"},
		{"mode", Request{Prompt: []int32{1}, MaxTokens: 1, Params: greedy(), Mode: 9}, engine.ErrInvalidInput, "mode"},
		{"context", Request{Prompt: make([]int32, cfg.ContextLength), MaxTokens: 1, Params: greedy()}, engine.ErrContextOverflow, "context window of 96"},
		// 30 prompt + 20 new = 49 positions = 13 pages of 4 > 10.
		{"pool", Request{Prompt: make([]int32, 30), MaxTokens: 20, Params: greedy()}, engine.ErrKVCacheFull, "needs 13 pages (30 prompt + 20 new tokens = 49 positions, 4 per page) but the KV cache has 10 pages"},
		{"params", Request{Prompt: []int32{1}, MaxTokens: 1, Params: badParams}, engine.ErrInvalidInput, "top_p"},
		{"stop", Request{Prompt: []int32{1}, MaxTokens: 1, Params: greedy(), Stop: []string{""}}, engine.ErrInvalidInput, "stop"},
	}
	for _, tc := range tests {
		_, err := s.Submit(ctx, tc.req)
		if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.text) {
			t.Errorf("%s: %v, want %v mentioning %q", tc.name, err, tc.want, tc.text)
		}
	}
	// The context window caps MaxTokens for the page check: 40 prompt
	// tokens and 2⁴⁰ new ones need 95 positions (the last token is never
	// fed back) = 24 pages.
	if _, err := s.Submit(ctx, Request{Prompt: make([]int32, 40), MaxTokens: 1 << 40, Params: greedy()}); !errors.Is(err, engine.ErrKVCacheFull) || !strings.Contains(err.Error(), "95 positions") {
		t.Errorf("huge MaxTokens: %v", err)
	}
	//lint:ignore SA1012 a nil context is the case under test
	if _, err := s.Submit(nil, Request{Prompt: []int32{1}, MaxTokens: 1, Params: greedy()}); !errors.Is(err, engine.ErrInvalidInput) { //nolint:staticcheck
		t.Errorf("nil context: %v", err)
	}
	ok := Request{ID: "a", Prompt: []int32{1}, MaxTokens: 1, Params: greedy()}
	if _, err := s.Submit(ctx, ok); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Submit(ctx, ok); !errors.Is(err, ErrDuplicateID) {
		t.Errorf("duplicate id: %v", err)
	}
	ok.ID = ""
	for range 2 {
		if _, err := s.Submit(ctx, ok); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Submit(ctx, ok); !errors.Is(err, ErrQueueFull) {
		t.Errorf("fourth request: %v", err)
	}
	if rep := s.Audit(); !rep.OK() || rep.Live != 0 {
		t.Errorf("audit before the scheduler took the requests: %+v", rep)
	}
	if _, _, err := s.Step(); err != nil {
		t.Fatal(err)
	}
	// One step admits, prefills and finishes all three (one token each).
	if rep := s.Audit(); !rep.OK() || rep.Live != 0 || rep.PagesUsed != 0 {
		t.Errorf("audit after one step: %+v", rep)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Submit(ctx, ok); !errors.Is(err, ErrClosed) {
		t.Errorf("after Close: %v", err)
	}
	if _, _, err := s.Step(); !errors.Is(err, ErrClosed) {
		t.Errorf("Step after Close: %v", err)
	}
	auto := newSched(t, Config{Model: tm.m, Pool: newPool(t, tm, 4, 10, quant.F32)})
	if _, _, err := auto.Step(); !errors.Is(err, engine.ErrInvalidInput) {
		t.Errorf("Step without Manual: %v", err)
	}
}

// drive steps a manual scheduler until it has nothing to do.
func drive(t *testing.T, s *Scheduler) {
	t.Helper()
	for range 10000 {
		_, busy, err := s.Step()
		if err != nil {
			t.Fatal(err)
		}
		if !busy {
			return
		}
	}
	t.Fatal("the scheduler is still busy after 10000 steps")
}

// drain reads the events queued on a stream without blocking.
func drain(st *Stream) (evs []Event, closed bool) {
	for {
		select {
		case ev, ok := <-st.Events():
			if !ok {
				return evs, true
			}
			evs = append(evs, ev)
		default:
			return evs, false
		}
	}
}

func TestStopsAndLimits(t *testing.T) {
	tm := loadSmall(t, 1)
	cfg := tm.cfg()
	s := newSched(t, Config{Model: tm.m, Pool: newPool(t, tm, 4, 64, quant.F32), Tokenizer: tm.tok})
	prompt := []int32{1, 40, 41, 42, 43}
	base := runAll(t, s, []Request{{Prompt: prompt, MaxTokens: 12, Params: greedy(), IgnoreEOS: true}})[0]
	if base.done.Finish != FinishLength || len(base.ids) != 12 {
		t.Fatalf("baseline %+v", base.done)
	}

	// A stop id ends generation after that token.
	stopID := base.ids[5]
	k := slices.Index(base.ids, stopID)
	got := runAll(t, s, []Request{{Prompt: prompt, MaxTokens: 12, Params: greedy(), IgnoreEOS: true, StopIDs: []int32{stopID}}})[0]
	if got.done.Finish != FinishStop || !slices.Equal(got.ids, base.ids[:k+1]) {
		t.Errorf("stop id: %v (%s), want %v", got.ids, got.done.Finish, base.ids[:k+1])
	}

	// A stop string cuts the text before it.
	if len(base.text) > 6 {
		stop := base.text[3:6]
		got = runAll(t, s, []Request{{Prompt: prompt, MaxTokens: 12, Params: greedy(), IgnoreEOS: true, Stop: []string{stop}}})[0]
		if got.done.Finish != FinishStop || got.text != base.text[:strings.Index(base.text, stop)] {
			t.Errorf("stop string %q: text %q (%s), want %q", stop, got.text, got.done.Finish, base.text[:strings.Index(base.text, stop)])
		}
	}

	// The context window ends generation.
	long := make([]int32, cfg.ContextLength-3)
	for i := range long {
		long[i] = int32(10 + i%200)
	}
	got = runAll(t, s, []Request{{Prompt: long, MaxTokens: 50, Params: greedy(), IgnoreEOS: true}})[0]
	if got.done.Finish != FinishContext || len(got.ids) != 3 {
		t.Errorf("context: %d tokens, %s", len(got.ids), got.done.Finish)
	}

	// The tokenizer's end-of-generation token ends generation unemitted,
	// unless IgnoreEOS: whether the random model draws it here or not,
	// the output without IgnoreEOS is the IgnoreEOS output cut before it.
	withEOS := runAll(t, s, []Request{{Prompt: prompt, MaxTokens: 12, Params: greedy()}})[0]
	want, wantFinish := base.ids, FinishLength
	if i := slices.IndexFunc(base.ids, tm.tok.IsEOG); i >= 0 {
		want, wantFinish = base.ids[:i], FinishStop
	}
	if !slices.Equal(withEOS.ids, want) || withEOS.done.Finish != wantFinish {
		t.Errorf("EOG: %v (%s), want %v (%s)", withEOS.ids, withEOS.done.Finish, want, wantFinish)
	}
	// Deterministically: an imported request whose first token (sampled
	// by prefill) is EOS stops at once, with nothing emitted.
	st, err := s.Submit(context.Background(), Request{Mode: ModeDecodeImported, Prompt: prompt, MaxTokens: 5, Params: greedy()})
	if err != nil {
		t.Fatal(err)
	}
	if ev := <-st.Events(); ev.Kind != EventReserved {
		t.Fatalf("first event %+v", ev)
	}
	if err := st.Activate(sample.Token{ID: tm.tok.EOS()}); err != nil {
		t.Fatal(err)
	}
	if res := collect(t, st, time.Minute); len(res.ids) != 0 || res.done.Finish != FinishStop || res.done.Usage.CompletionTokens != 0 {
		t.Errorf("EOS first: %v, %+v", res.ids, res.done)
	}
	checkClean(t, s)
}

// TestSlowConsumer: a consumer that stops reading gets its request aborted
// once its buffer fills, while a neighbour in the same batch is unaffected.
func TestSlowConsumer(t *testing.T) {
	tm := loadSmall(t, 1)
	s := newSched(t, Config{Model: tm.m, Pool: newPool(t, tm, 4, 64, quant.F32), Manual: true, EventBuffer: 4})
	ctx := context.Background()
	req := Request{Prompt: []int32{1, 2, 3}, MaxTokens: 20, Params: greedy(), IgnoreEOS: true}
	lazy, err := s.Submit(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	eager, err := s.Submit(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	var eagerIDs []int32
	for range 100 {
		if _, _, err := s.Step(); err != nil {
			t.Fatal(err)
		}
		evs, _ := drain(eager)
		for _, ev := range evs {
			if ev.Kind == EventToken {
				eagerIDs = append(eagerIDs, ev.Token.ID)
			}
		}
		if len(s.Snapshot().Requests) == 0 {
			break
		}
	}
	evs, closed := drain(lazy)
	if !closed || len(evs) != 4 {
		t.Fatalf("lazy consumer: %d events, closed %v", len(evs), closed)
	}
	done := evs[len(evs)-1]
	if done.Kind != EventDone || done.Finish != FinishAborted || !errors.Is(done.Err, ErrSlowConsumer) || done.Usage.CompletionTokens != 3 {
		t.Errorf("lazy consumer's end: %+v", done)
	}
	if len(eagerIDs) != 20 || !slices.Equal(eagerIDs[:3], []int32{evs[0].Token.ID, evs[1].Token.ID, evs[2].Token.ID}) {
		t.Errorf("eager consumer got %v", eagerIDs)
	}
	checkClean(t, s)
}

// TestMisuse covers Handover and Activate called wrongly.
func TestMisuse(t *testing.T) {
	tm := loadSmall(t, 1)
	s := newSched(t, Config{Model: tm.m, Pool: newPool(t, tm, 4, 16, quant.F32), Manual: true})
	ctx := context.Background()
	gen, _ := s.Submit(ctx, Request{Prompt: []int32{1, 2}, MaxTokens: 2, Params: greedy()})
	if err := gen.Handover(); !errors.Is(err, engine.ErrInvalidInput) {
		t.Errorf("Handover on generate: %v", err)
	}
	if err := gen.Activate(sample.Token{}); !errors.Is(err, engine.ErrInvalidInput) {
		t.Errorf("Activate on generate: %v", err)
	}

	// Activate before the pages are reserved: the pool is full.
	hog, _ := s.Submit(ctx, Request{Mode: ModeDecodeImported, Prompt: make([]int32, 64), MaxTokens: 1, Params: greedy()})
	early, _ := s.Submit(ctx, Request{Mode: ModeDecodeImported, Prompt: []int32{1, 2, 3}, MaxTokens: 1, Params: greedy()})
	drive(t, s)
	if st := stateOf(s, early.ID()); st != StateWaiting {
		t.Fatalf("early request is %s", st)
	}
	if err := early.Activate(sample.Token{ID: 5}); err != nil {
		t.Fatal(err)
	}
	if err := early.Activate(sample.Token{ID: 5}); !errors.Is(err, engine.ErrInvalidInput) {
		t.Errorf("second Activate: %v", err)
	}
	drive(t, s)
	evs, closed := drain(early)
	if !closed || evs[len(evs)-1].Finish != FinishError || !strings.Contains(evs[len(evs)-1].Err.Error(), "before its pages were reserved") {
		t.Errorf("early Activate: %+v", evs)
	}
	// Activate with a token outside the vocabulary.
	if err := hog.Activate(sample.Token{ID: -1}); err != nil {
		t.Fatal(err)
	}
	drive(t, s)
	evs, _ = drain(hog)
	if last := evs[len(evs)-1]; last.Kind != EventDone || last.Finish != FinishError {
		t.Errorf("bad first token: %+v", last)
	}

	// Handover before the prompt is done.
	s2 := newSched(t, Config{Model: tm.m, Pool: newPool(t, tm, 4, 16, quant.F32), Manual: true, MaxBatchTokens: 2})
	pf, _ := s2.Submit(ctx, Request{Mode: ModePrefillOnly, Prompt: make([]int32, 10), Params: greedy()})
	if _, _, err := s2.Step(); err != nil {
		t.Fatal(err)
	}
	if err := pf.Handover(); err != nil {
		t.Fatal(err)
	}
	if err := pf.Handover(); !errors.Is(err, engine.ErrInvalidInput) {
		t.Errorf("second Handover: %v", err)
	}
	drive(t, s2)
	evs, _ = drain(pf)
	if last := evs[len(evs)-1]; last.Finish != FinishError || !strings.Contains(last.Err.Error(), "before its prompt was done") {
		t.Errorf("early Handover: %+v", last)
	}
	drive(t, s)
	drain(gen)
	checkClean(t, s)
	checkClean(t, s2)
}

func stateOf(s *Scheduler, id string) State {
	for _, r := range s.Snapshot().Requests {
		if r.ID == id {
			return r.State
		}
	}
	return StateFinished
}

// TestCancelEveryState cancels requests in each state on a running
// scheduler, checks that each is released with FinishCancelled and its
// pages returned, and logs the time from cancel to EventDone. The state a
// request was released from is read from the observer's summary, since a
// request may move on between the trigger and the cancel.
func TestCancelEveryState(t *testing.T) {
	tm := loadSmall(t, 1)
	pool := newPool(t, tm, 4, 24, quant.F32)
	obs := &maxSeqs{}
	s := newSched(t, Config{Model: tm.m, Pool: pool, MaxBatchTokens: 1, Observer: obs})
	rounds := 30
	if testing.Short() {
		rounds = 5
	}
	prompt := func(n int) []int32 {
		p := make([]int32, n)
		for i := range p {
			p[i] = int32(5 + i)
		}
		return p
	}
	submit := func(ctx context.Context, r Request) *Stream {
		st, err := s.Submit(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	next := func(st *Stream, kind EventKind) {
		for ev := range st.Events() {
			if ev.Kind == kind {
				return
			}
			if ev.Kind == EventDone {
				t.Fatalf("%s ended (%s, %v) before a %s event", st.ID(), ev.Finish, ev.Err, kind)
			}
		}
	}
	stage := func(id string) State {
		obs.mu.Lock()
		defer obs.mu.Unlock()
		for _, d := range slices.Backward(obs.done) {
			if d.ID == id {
				return d.Stage
			}
		}
		return stateNew
	}
	// Each case submits a request and waits for an event that puts it in
	// the state; extra requests are finished afterwards.
	cases := []struct {
		state State
		setup func(ctx context.Context) (st *Stream, extra []*Stream)
	}{
		{StateWaiting, func(ctx context.Context) (*Stream, []*Stream) {
			// An imported request reserving every page keeps it waiting.
			hog := submit(context.Background(), Request{Mode: ModeDecodeImported, Prompt: prompt(94), MaxTokens: 1, Params: greedy()})
			next(hog, EventReserved)
			return submit(ctx, Request{Prompt: prompt(3), MaxTokens: 5, Params: greedy()}), []*Stream{hog}
		}},
		{StatePrefilling, func(ctx context.Context) (*Stream, []*Stream) {
			// One prompt token per step: the first page is ready long
			// before the prompt is done.
			st := submit(ctx, Request{Mode: ModePrefillOnly, Prompt: prompt(90), Params: greedy()})
			next(st, EventPagesReady)
			return st, nil
		}},
		{StateRunning, func(ctx context.Context) (*Stream, []*Stream) {
			st := submit(ctx, Request{Prompt: prompt(3), MaxTokens: 90, Params: greedy(), IgnoreEOS: true})
			next(st, EventToken)
			return st, nil
		}},
		{StateTransferring, func(ctx context.Context) (*Stream, []*Stream) {
			st := submit(ctx, Request{Mode: ModeDecodeImported, Prompt: prompt(20), MaxTokens: 5, Params: greedy()})
			next(st, EventReserved)
			return st, nil
		}},
		{StateHandingOver, func(ctx context.Context) (*Stream, []*Stream) {
			st := submit(ctx, Request{Mode: ModePrefillOnly, Prompt: prompt(6), Params: greedy()})
			next(st, EventToken)
			return st, nil
		}},
	}
	for _, c := range cases {
		var lat []time.Duration
		for range rounds {
			ctx, cancel := context.WithCancel(context.Background())
			st, extra := c.setup(ctx)
			start := time.Now()
			cancel()
			var done Event
			for ev := range st.Events() {
				done = ev
			}
			elapsed := time.Since(start)
			// On a loaded machine the running request can finish all its
			// tokens before the cancel lands; such a round measures nothing
			// (the count check below keeps enough rounds honest).
			finishedFirst := c.state == StateRunning && done.Kind == EventDone && done.Finish == FinishLength
			if !finishedFirst && (done.Kind != EventDone || done.Finish != FinishCancelled || !errors.Is(done.Err, context.Canceled)) {
				t.Fatalf("%s: ended with %+v", c.state, done)
			}
			if stage(st.ID()) == c.state {
				lat = append(lat, elapsed)
			}
			for _, x := range extra {
				if err := x.Activate(sample.Token{ID: 7}); err != nil {
					t.Fatal(err)
				}
				collect(t, x, time.Minute)
			}
			checkClean(t, s)
		}
		if len(lat) < rounds/2 {
			t.Fatalf("only %d of %d cancels hit a %s request", len(lat), rounds, c.state)
		}
		slices.Sort(lat)
		t.Logf("cancel → EventDone while %-12s p50 %8v  p99 %8v  max %8v  (%d runs)",
			c.state, lat[len(lat)/2], lat[(len(lat)*99)/100], lat[len(lat)-1], len(lat))
	}
}

// TestSnapshotAndObserver checks the introspection: states, pages held,
// progress times, and the observer's gauges and summaries.
func TestSnapshotAndObserver(t *testing.T) {
	tm := loadSmall(t, 1)
	obs := &recorder{}
	s := newSched(t, Config{Model: tm.m, Pool: newPool(t, tm, 4, 32, quant.F16), Manual: true, Observer: obs, MaxBatchTokens: 4})
	ctx := context.Background()
	gen, _ := s.Submit(ctx, Request{ID: "gen", Prompt: make([]int32, 6), MaxTokens: 3, Params: greedy(), IgnoreEOS: true})
	imp, _ := s.Submit(ctx, Request{ID: "imp", Mode: ModeDecodeImported, Prompt: make([]int32, 9), MaxTokens: 2, Params: greedy()})
	snap := s.Snapshot()
	if len(snap.Requests) != 0 {
		t.Errorf("requests visible before the scheduler took them: %+v", snap.Requests)
	}
	if _, _, err := s.Step(); err != nil {
		t.Fatal(err)
	}
	snap = s.Snapshot()
	want := map[string]struct {
		state           State
		pages, computed int
	}{"gen": {StatePrefilling, 2, 4}, "imp": {StateTransferring, 3, 0}}
	if len(snap.Requests) != 2 {
		t.Fatalf("snapshot %+v", snap)
	}
	for _, r := range snap.Requests {
		w := want[r.ID]
		if r.State != w.state || r.Pages != w.pages || r.Computed != w.computed || r.Age <= 0 {
			t.Errorf("%s: %+v, want %+v", r.ID, r, w)
		}
	}
	if snap.Requests[0].ID != "gen" || snap.Pages.Used != 5 || snap.Steps != 1 || snap.StepRunning != 0 {
		t.Errorf("snapshot %+v", snap)
	}
	if g := obs.lastGauges(); g.Prefilling != 1 || g.Transferring != 1 || g.PagesUsed != 5 || g.TokenUsage != 5.0/32 {
		t.Errorf("gauges %+v", g)
	}
	if err := imp.Activate(sample.Token{ID: 9}); err != nil {
		t.Fatal(err)
	}
	drive(t, s)
	drain(gen)
	drain(imp)
	if g := obs.lastGauges(); g.Running+g.Prefilling+g.Waiting+g.Transferring != 0 || g.PagesUsed != 0 || g.GenThroughput <= 0 {
		t.Errorf("final gauges %+v", g)
	}
	obs.mu.Lock()
	defer obs.mu.Unlock()
	if len(obs.done) != 2 {
		t.Fatalf("summaries %+v", obs.done)
	}
	for _, d := range obs.done {
		if d.TTFT <= 0 || d.E2E < d.TTFT || d.Finish != FinishLength {
			t.Errorf("summary %+v", d)
		}
	}
	if obs.gaps == 0 || obs.steps == 0 {
		t.Errorf("%d steps, %d token gaps observed", obs.steps, obs.gaps)
	}
}

type recorder struct {
	maxSeqs
	gauges []Gauges
	steps  int
	gaps   int
}

func (r *recorder) Gauges(g Gauges) {
	r.mu.Lock()
	r.gauges = append(r.gauges, g)
	r.mu.Unlock()
}

func (r *recorder) Step(st StepStats) {
	r.maxSeqs.Step(st)
	r.mu.Lock()
	r.steps++
	r.gaps += len(st.TokenGaps)
	r.mu.Unlock()
}

func (r *recorder) lastGauges() Gauges {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.gauges[len(r.gauges)-1]
}

// TestCloseAborts: Close ends every request in flight with ErrClosed,
// whatever its state, and stops the goroutine (TestMain checks for leaks).
func TestCloseAborts(t *testing.T) {
	tm := loadSmall(t, 1)
	s, err := New(Config{Model: tm.m, Pool: newPool(t, tm, 4, 8, quant.F32)})
	if err != nil {
		t.Fatal(err)
	}
	var streams []*Stream
	for i, mode := range []Mode{ModeGenerate, ModePrefillOnly, ModeDecodeImported, ModeGenerate} {
		st, err := s.Submit(context.Background(), Request{Mode: mode, Prompt: make([]int32, 10+i), MaxTokens: 20, Params: greedy(), IgnoreEOS: true})
		if err != nil {
			t.Fatal(err)
		}
		streams = append(streams, st)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	for _, st := range streams {
		evs, closed := drain(st)
		if !closed {
			t.Fatalf("%s: channel open after Close", st.ID())
		}
		if last := evs[len(evs)-1]; last.Kind == EventDone && last.Finish == FinishAborted {
			if !errors.Is(last.Err, ErrClosed) {
				t.Errorf("%s: %v", st.ID(), last.Err)
			}
		} else if last.Kind != EventDone || last.Finish != FinishLength {
			t.Errorf("%s: ended with %+v", st.ID(), last)
		}
	}
	if u := s.cfg.Pool.Stats().Used; u != 0 {
		t.Errorf("%d pages used after Close", u)
	}
	if err := streams[1].Handover(); err != nil {
		t.Errorf("Handover after Close: %v (the request is gone; the call is a no-op)", err)
	}
}

// TestCancelBeforeAdmission: a context already done fails Submit with its
// cause; one that ends before the scheduler takes the request still ends
// it cleanly, in order.
func TestCancelBeforeAdmission(t *testing.T) {
	tm := loadSmall(t, 1)
	s := newSched(t, Config{Model: tm.m, Pool: newPool(t, tm, 4, 8, quant.F32), Manual: true})
	req := Request{Prompt: []int32{1, 2}, MaxTokens: 3, Params: greedy()}
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(errors.New("client went away"))
	if _, err := s.Submit(ctx, req); err == nil || !strings.Contains(err.Error(), "client went away") {
		t.Errorf("Submit with a done context: %v", err)
	}

	ctx, cancel = context.WithCancelCause(context.Background())
	st, err := s.Submit(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	cancel(errors.New("gone again"))
	// Wait for the context watch to post its cancel behind the submit.
	for {
		s.inMu.Lock()
		n := len(s.inbox)
		s.inMu.Unlock()
		if n == 2 {
			break
		}
		time.Sleep(10 * time.Microsecond)
	}
	drive(t, s)
	evs, closed := drain(st)
	if !closed || len(evs) != 1 || evs[0].Finish != FinishCancelled || !strings.Contains(evs[0].Err.Error(), "gone again") {
		t.Errorf("events %+v", evs)
	}
	checkClean(t, s)
}

type auditCounter struct {
	NopObserver
	reports chan AuditReport
}

func (a *auditCounter) Audit(r AuditReport) {
	select {
	case a.reports <- r:
	default:
	}
}

// TestPeriodicAudit: the running scheduler audits itself on its interval,
// also while idle, and the reports are clean.
func TestPeriodicAudit(t *testing.T) {
	tm := loadSmall(t, 1)
	obs := &auditCounter{reports: make(chan AuditReport, 16)}
	s := newSched(t, Config{Model: tm.m, Pool: newPool(t, tm, 4, 16, quant.F32), Observer: obs, AuditInterval: 2 * time.Millisecond})
	runAll(t, s, []Request{{Prompt: []int32{1, 2, 3}, MaxTokens: 4, Params: greedy()}})
	for i := range 3 {
		select {
		case rep := <-obs.reports:
			if !rep.OK() || rep.Audits == 0 {
				t.Errorf("audit %d: %+v", i, rep)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("no periodic audit")
		}
	}
}

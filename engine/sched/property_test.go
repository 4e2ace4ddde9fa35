package sched

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"go.uber.org/goleak"
	"pgregory.net/rapid"

	"github.com/baton-serving/baton/engine"
	"github.com/baton-serving/baton/engine/kvcache"
	"github.com/baton-serving/baton/engine/sample"
	"github.com/baton-serving/baton/kernels/quant"
)

// tracked is the test's view of one submitted request.
type tracked struct {
	st         *Stream
	req        Request
	cancel     context.CancelFunc
	reads      bool // the consumer keeps up (otherwise it never reads until the end)
	cancelled  bool
	n          int       // Request.N, at least 1
	events     [][]Event // by choice
	closed     bool
	reserved   []kvcache.PageID
	first      *sample.Token
	handedOver bool
	activated  bool
}

func (tr *tracked) done() bool { return tr.closed }

// harness drives a manual scheduler through random actions.
type harness struct {
	t     *rapid.T
	tm    testModel
	s     *Scheduler
	pool  *kvcache.Pool
	reqs  []*tracked
	steps int
	cache bool // the pool's prefix cache is on
}

// TestSchedulerProperties generates random interleavings of submissions in
// every mode, cancellations at any moment (before admission, mid-prefill,
// mid-decode, while transferring or handing over, at the finish), steps,
// handovers, activations (also premature ones), consumers that stop
// reading, and pools too small for the load. After every action it checks
// that the auditor finds nothing wrong (used pages == pages held by live
// requests, counters == states), that every request is in exactly one
// place (live in the snapshot in the state it has, or finished with one
// EventDone and a closed channel), and that events come in a legal order.
// Requests ask for 1 to 4 choices (Request.N), so that choices fork from
// the prompt's pages and share them while some finish, are cancelled or
// are preempted. Half the runs turn the prefix cache on (with a random cap), and prompts
// often share prefixes with earlier ones, so that pages are shared,
// cached, and evicted under pressure. At the end, without further cancels,
// every request must finish (no deadlock), leaving only cached pages used
// (none after a flush), no request listed, and no goroutine.
func TestSchedulerProperties(t *testing.T) {
	tm := loadSmall(t, 1)
	// What the generated runs covered, to see that the interesting paths
	// are exercised: releases by (stage, reason), and preemptions.
	cov := &coverage{byEnd: make(map[string]int)}
	defer func() {
		t.Logf("coverage: %d runs, %d steps, %d preemptions, releases by stage/reason: %v", cov.runs, cov.steps, cov.preempted, cov.byEnd)
	}()
	rapid.Check(t, func(rt *rapid.T) {
		cov.runs++
		base := goleak.IgnoreCurrent()
		pageSize := rapid.SampledFrom([]int{1, 2, 4, 16}).Draw(rt, "page_size")
		pages := rapid.IntRange(2, 40/pageSize+3).Draw(rt, "pages")
		dtype := rapid.SampledFrom([]quant.Type{quant.F32, quant.F16}).Draw(rt, "dtype")
		pool, err := kvcache.New(tm.cfg().KVLayout(pageSize, dtype), pages)
		if err != nil {
			rt.Fatal(err)
		}
		cacheOn := rapid.Bool().Draw(rt, "prefix_cache")
		if cacheOn {
			if err := pool.EnableCache(tm.m.Fingerprint(), rapid.IntRange(0, pages).Draw(rt, "cache_max_pages")); err != nil {
				rt.Fatal(err)
			}
		}
		s, err := New(Config{
			Model: tm.m, Pool: pool, Tokenizer: tm.tok, Manual: true,
			Observer:       cov,
			MaxBatchTokens: rapid.IntRange(1, 16).Draw(rt, "max_batch_tokens"),
			MaxSeqs:        rapid.IntRange(1, 6).Draw(rt, "max_seqs"),
			EventBuffer:    rapid.IntRange(2, 8).Draw(rt, "event_buffer"),
		})
		if err != nil {
			rt.Fatal(err)
		}
		h := &harness{t: rt, tm: tm, s: s, pool: pool, cache: cacheOn}
		actions := []string{"submit", "submit", "cancel", "step", "step", "step", "steps", "read", "handover", "activate", "flush"}
		n := rapid.IntRange(1, 120).Draw(rt, "actions")
		for range n {
			switch rapid.SampledFrom(actions).Draw(rt, "action") {
			case "submit":
				h.submit()
			case "cancel":
				h.cancelOne()
			case "step":
				h.step()
			case "steps":
				for range rapid.IntRange(2, 12).Draw(rt, "k") {
					h.step()
				}
			case "read":
				h.readAll(false)
			case "handover":
				h.handover()
			case "activate":
				h.activate()
			case "flush":
				h.s.FlushCache()
			}
			h.check()
		}
		h.finishAll()
		if err := s.Close(); err != nil {
			rt.Fatal(err)
		}
		if err := goleak.Find(base); err != nil {
			rt.Fatal(err)
		}
	})
}

type coverage struct {
	NopObserver
	runs, steps, preempted int
	byEnd                  map[string]int
}

func (c *coverage) Step(st StepStats) { c.steps++; c.preempted += st.Preempted }
func (c *coverage) RequestDone(s Summary) {
	c.byEnd[s.Stage.String()+"/"+s.Finish.String()]++
}

func (h *harness) live() []*tracked {
	var out []*tracked
	for _, tr := range h.reqs {
		if !tr.done() {
			out = append(out, tr)
		}
	}
	return out
}

func (h *harness) pick(label string, f func(*tracked) bool) *tracked {
	var c []*tracked
	for _, tr := range h.reqs {
		if !tr.done() && f(tr) {
			c = append(c, tr)
		}
	}
	if len(c) == 0 {
		return nil
	}
	return c[rapid.IntRange(0, len(c)-1).Draw(h.t, label)]
}

func (h *harness) submit() {
	t := h.t
	cfg := h.tm.cfg()
	mode := rapid.SampledFrom([]Mode{ModeGenerate, ModeGenerate, ModePrefillOnly, ModeDecodeImported}).Draw(t, "mode")
	plen := rapid.IntRange(1, 40).Draw(t, "prompt_len")
	prompt := make([]int32, plen)
	// Often a prompt shares a prefix with an earlier one, so that the
	// prefix cache matches (and pages are shared among live requests).
	shared := 0
	if len(h.reqs) > 0 && rapid.Bool().Draw(t, "share_prefix") {
		from := h.reqs[rapid.IntRange(0, len(h.reqs)-1).Draw(t, "share_from")].req.Prompt
		shared = copy(prompt, from[:rapid.IntRange(0, len(from)).Draw(t, "share_len")])
	}
	for i := shared; i < len(prompt); i++ {
		prompt[i] = int32(rapid.IntRange(3, cfg.Vocab-1).Draw(t, "tok"))
	}
	p := greedy()
	if rapid.Bool().Draw(t, "sampled") {
		p = sample.Defaults()
		p.Temperature, p.TopK = 0.9, 20
		p.Seed = uint64(len(h.reqs))
	}
	n := 1
	if mode != ModePrefillOnly {
		n = rapid.IntRange(1, 4).Draw(t, "n")
	}
	req := Request{Mode: mode, Prompt: prompt, MaxTokens: rapid.IntRange(1, 12).Draw(t, "max_tokens"), Params: p,
		IgnoreEOS: rapid.Bool().Draw(t, "ignore_eos"), N: n}
	positions := plen + req.MaxTokens - 1
	if mode == ModePrefillOnly {
		positions = plen
	}
	fits := h.pool.Layout().PagesFor(positions) <= h.pool.Stats().Total
	ctx, cancel := context.WithCancel(context.Background())
	st, err := h.s.Submit(ctx, req)
	if !fits {
		cancel()
		if !errors.Is(err, engine.ErrKVCacheFull) {
			t.Fatalf("a request of %d positions in %d pages of %d: %v, want ErrKVCacheFull", positions, h.pool.Stats().Total, h.pool.Layout().PageSize, err)
		}
		return
	}
	if err != nil {
		cancel()
		t.Fatalf("submit: %v", err)
	}
	h.reqs = append(h.reqs, &tracked{st: st, req: req, cancel: cancel, reads: rapid.IntRange(0, 3).Draw(t, "reads") > 0,
		n: n, events: make([][]Event, n)})
}

// cancelOne cancels a live request's context and waits until the watch has
// posted the cancel, so that runs are reproducible.
func (h *harness) cancelOne() {
	tr := h.pick("cancel_which", func(tr *tracked) bool { return !tr.cancelled })
	if tr == nil {
		return
	}
	h.s.inMu.Lock()
	before := len(h.s.inbox)
	h.s.inMu.Unlock()
	// Every choice still live watches the context.
	h.s.mu.Lock()
	watching := 0
	for _, r := range members(tr) {
		if r.state != StateFinished {
			watching++
		}
	}
	h.s.mu.Unlock()
	tr.cancel()
	tr.cancelled = true
	if watching == 0 {
		return // their watches were stopped at release
	}
	for deadline := time.Now().Add(10 * time.Second); ; {
		h.s.inMu.Lock()
		n := len(h.s.inbox)
		h.s.inMu.Unlock()
		if n >= before+watching {
			return
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("the cancel of %s was never posted", tr.st.ID())
		}
		time.Sleep(10 * time.Microsecond)
	}
}

// members are the scheduler's requests of tr's choices.
func members(tr *tracked) []*request {
	if tr.st.r.grp != nil {
		return tr.st.r.grp.members
	}
	return []*request{tr.st.r}
}

// ended reports whether every choice of tr has its EventDone.
func (tr *tracked) ended() bool {
	for _, evs := range tr.events {
		if len(evs) == 0 || evs[len(evs)-1].Kind != EventDone {
			return false
		}
	}
	return true
}

func (h *harness) step() {
	if _, _, err := h.s.Step(); err != nil {
		h.t.Fatal(err)
	}
	h.steps++
}

// readAll drains the streams of consumers that keep up (all of them when
// everyone is true) and checks the order of their events.
func (h *harness) readAll(everyone bool) {
	for _, tr := range h.reqs {
		if tr.done() || !tr.reads && !everyone {
			continue
		}
		evs, closed := drain(tr.st)
		for _, ev := range evs {
			h.accept(tr, ev)
		}
		if closed {
			tr.closed = true
			if !tr.ended() {
				h.t.Fatalf("%s: channel closed without every choice's EventDone: %+v", tr.st.ID(), tr.events)
			}
		}
	}
}

// accept records an event, checking that it may come now.
func (h *harness) accept(tr *tracked, ev Event) {
	t := h.t
	if ev.Choice < 0 || ev.Choice >= tr.n {
		t.Fatalf("%s: event of choice %d of %d", tr.st.ID(), ev.Choice, tr.n)
	}
	id := fmt.Sprintf("%s choice %d", tr.st.ID(), ev.Choice)
	events := tr.events[ev.Choice]
	if n := len(events); n > 0 && events[n-1].Kind == EventDone {
		t.Fatalf("%s: %s after EventDone", id, ev.Kind)
	}
	// Only the first choice imports or hands over; the others generate.
	mode := tr.req.Mode
	if ev.Choice > 0 {
		mode = ModeGenerate
	}
	tokens := 0
	for _, e := range events {
		if e.Kind == EventToken {
			tokens++
		}
	}
	switch ev.Kind {
	case EventReserved:
		if mode != ModeDecodeImported || tr.reserved != nil || len(events) != 0 {
			t.Fatalf("%s (%s): unexpected EventReserved after %+v", id, mode, events)
		}
		if len(ev.Pages) != h.pool.Layout().PagesFor(len(tr.req.Prompt)) {
			t.Fatalf("%s: reserved %d pages for %d prompt tokens", id, len(ev.Pages), len(tr.req.Prompt))
		}
		tr.reserved = ev.Pages
	case EventPagesReady:
		prev := 0
		for _, e := range events {
			if e.Kind == EventPagesReady {
				prev = e.Ready
			}
		}
		if mode != ModePrefillOnly || ev.Ready <= prev || ev.Ready > len(ev.Pages) || tokens > 0 {
			t.Fatalf("%s (%s): EventPagesReady %d/%d after %d", id, tr.req.Mode, ev.Ready, len(ev.Pages), prev)
		}
	case EventToken:
		limit := tr.req.MaxTokens
		if mode == ModePrefillOnly {
			limit = 1
			tok := ev.Token
			tr.first = &tok
		}
		if tokens+1 > limit {
			t.Fatalf("%s: token %d beyond the limit of %d", id, tokens+1, limit)
		}
		if mode == ModeDecodeImported && !tr.activated {
			t.Fatalf("%s: token before Activate", id)
		}
	case EventDone:
		if ev.Usage.CompletionTokens != tokens || ev.Usage.PromptTokens != len(tr.req.Prompt) {
			t.Fatalf("%s: usage %+v after %d tokens", id, ev.Usage, tokens)
		}
		switch ev.Finish {
		case FinishStop, FinishLength, FinishContext, FinishHandedOver:
			if ev.Err != nil {
				t.Fatalf("%s: %s with error %v", id, ev.Finish, ev.Err)
			}
		default:
			if ev.Err == nil {
				t.Fatalf("%s: %s without an error", id, ev.Finish)
			}
		}
		if ev.Finish == FinishHandedOver && !tr.handedOver {
			t.Fatalf("%s: handed over without Handover", id)
		}
	default:
		t.Fatalf("%s: event kind %d", id, ev.Kind)
	}
	tr.events[ev.Choice] = append(events, ev)
}

func (h *harness) handover() {
	tr := h.pick("handover_which", func(tr *tracked) bool { return tr.req.Mode == ModePrefillOnly })
	if tr == nil {
		return
	}
	err := tr.st.Handover()
	if tr.handedOver != (err != nil) {
		h.t.Fatalf("%s: second Handover gave %v", tr.st.ID(), err)
	}
	tr.handedOver = true
}

// activate imports (zero) keys and values into a reserved request and
// activates it; sometimes it activates before the reservation, which must
// end the request with an error.
func (h *harness) activate() {
	tr := h.pick("activate_which", func(tr *tracked) bool { return tr.req.Mode == ModeDecodeImported })
	if tr == nil {
		return
	}
	for _, p := range tr.reserved {
		for l := range h.tm.cfg().Layers {
			k, v := h.pool.PageBytes(p, l)
			clear(k)
			clear(v)
		}
	}
	err := tr.st.Activate(sample.Token{ID: int32(rapid.IntRange(3, h.tm.cfg().Vocab-1).Draw(h.t, "first"))})
	if tr.activated != (err != nil) {
		h.t.Fatalf("%s: second Activate gave %v", tr.st.ID(), err)
	}
	tr.activated = true
}

// check asserts the invariants between actions.
func (h *harness) check() {
	t := h.t
	rep := h.s.Audit()
	if !rep.OK() {
		t.Fatalf("audit: %+v", rep)
	}
	snap := h.s.Snapshot()
	listed := make(map[string]RequestInfo)
	pages := 0
	for _, ri := range snap.Requests {
		if _, dup := listed[ri.ID]; dup {
			t.Fatalf("%s listed twice", ri.ID)
		}
		listed[ri.ID] = ri
		pages += ri.Pages
	}
	// Requests may share cached pages, and the choices of one request the
	// prompt's: the auditor checks the exact union, here only that
	// nothing is used beyond what is held.
	forks := false
	for _, tr := range h.reqs {
		forks = forks || tr.n > 1
	}
	if !h.cache && !forks && pages != snap.Pages.Used || pages+snap.Pages.Cached < snap.Pages.Used {
		t.Fatalf("snapshot: %d pages held, %d cached, pool says %d used", pages, snap.Pages.Cached, snap.Pages.Used)
	}
	h.s.mu.Lock()
	states := make(map[*request]State)
	for _, tr := range h.reqs {
		for _, r := range members(tr) {
			states[r] = r.state
		}
	}
	h.s.mu.Unlock()
	for _, tr := range h.reqs {
		if tr.done() {
			for _, r := range members(tr) {
				if ri, isListed := listed[r.id]; isListed {
					t.Fatalf("%s has ended but is listed as %s", r.id, ri.State)
				}
			}
			continue
		}
		finished := 0
		for _, r := range members(tr) {
			st := states[r]
			ri, isListed := listed[r.id]
			switch {
			case st == StateFinished:
				finished++
				if isListed {
					t.Fatalf("%s is finished but listed as %s", r.id, ri.State)
				}
			case st == stateNew:
				if isListed {
					t.Fatalf("%s listed before the scheduler took it", r.id)
				}
			default:
				if !isListed || ri.State != st {
					t.Fatalf("%s is %s but listed: %v (%s)", r.id, st, isListed, ri.State)
				}
			}
		}
		if finished < tr.n {
			continue
		}
		// Every choice finished: the channel holds the rest, ending with
		// each choice's EventDone.
		evs, closed := drain(tr.st)
		if !closed {
			t.Fatalf("%s is finished but its channel is open", tr.st.ID())
		}
		for _, ev := range evs {
			h.accept(tr, ev)
		}
		tr.closed = true
		if !tr.ended() {
			t.Fatalf("%s: finished without every choice's EventDone", tr.st.ID())
		}
	}
}

// finishAll drives every request to its end without cancelling any: the
// consumers all read, prefill-only requests are handed over, imported ones
// activated. A request still live after many steps is a deadlock.
func (h *harness) finishAll() {
	for i := 0; len(h.live()) > 0; i++ {
		if i > 5000 {
			h.t.Fatalf("requests still live after %d steps: %+v", i, h.s.Snapshot())
		}
		h.readAll(true)
		for _, tr := range h.live() {
			switch {
			case tr.req.Mode == ModePrefillOnly && tr.first != nil && !tr.handedOver:
				if err := tr.st.Handover(); err != nil {
					h.t.Fatal(err)
				}
				tr.handedOver = true
			case tr.req.Mode == ModeDecodeImported && tr.reserved != nil && !tr.activated:
				if err := tr.st.Activate(sample.Token{ID: 5}); err != nil {
					h.t.Fatal(err)
				}
				tr.activated = true
			}
		}
		h.step()
		h.check()
	}
	if st := h.pool.Stats(); st.Used != st.Cached {
		h.t.Fatalf("%d pages used, %d cached after every request ended", st.Used, st.Cached)
	}
	cached := h.pool.Stats().Cached
	if n := h.s.FlushCache(); n != cached {
		h.t.Fatalf("flush freed %d of %d cached pages", n, cached)
	}
	h.check()
	if st := h.pool.Stats(); st.Used != 0 || st.Shared != 0 {
		h.t.Fatalf("after a flush: %+v", st)
	}
	if snap := h.s.Snapshot(); len(snap.Requests) != 0 {
		h.t.Fatalf("requests listed after all ended: %+v", snap.Requests)
	}
	for _, tr := range h.reqs {
		tr.cancel()
	}
}

package sched

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/baton-serving/baton/engine"
	"github.com/baton-serving/baton/engine/model"
	"github.com/baton-serving/baton/engine/sample"
)

// plan is one step's batch: chunks[i] belongs to reqs[i].
type plan struct {
	chunks    []model.Chunk
	reqs      []*request
	decode    int // decode tokens
	prefill   int // prompt tokens
	preempted int
	stalled   int // running sequences that waited for a page
	admitted  int
	gaps      []time.Duration
	gapIDs    []string // the request of each gap
	generated int
}

// step is one iteration of the owner: commands, plan, forward, results.
func (s *Scheduler) step() (StepStats, bool) {
	s.mu.Lock()
	released := s.drainInbox()
	start := time.Now()
	p := &s.plan
	s.makePlan(p)
	var done []Summary
	var g Gauges
	if len(p.chunks) > 0 {
		s.stepStart, s.stepTokens = start, p.decode+p.prefill
		// The commands and the plan changed the counts; publish them
		// before the forward pass, which may hang: until it returns the
		// gauges must count the requests Snapshot lists, not the last
		// step's.
		done, g = s.takeDone(), s.gauges(start)
	}
	s.mu.Unlock()

	var err error
	if len(p.chunks) > 0 {
		s.report(nil, done, g)
		// Unlocked: the forward pass only reads what the plan references,
		// which nothing else writes until it returns.
		err = s.cfg.Model.ForwardBatch(s.cfg.Pool, p.chunks)
	}

	s.mu.Lock()
	end := time.Now()
	stats := StepStats{
		Start: start, Duration: end.Sub(start), Seqs: len(p.chunks),
		DecodeTokens: p.decode, PrefillTokens: p.prefill,
		Preempted: p.preempted, Stalled: p.stalled, Admitted: p.admitted, Err: err,
	}
	if len(p.chunks) > 0 {
		s.apply(p, err, end)
		s.steps++
		s.lastStep = end
		s.stepStart, s.stepTokens = time.Time{}, 0
		if p.generated > 0 {
			s.window = append(s.window, throughputSample{at: end, tokens: p.generated})
		}
	}
	stats.Generated, stats.TokenGaps, stats.GapRequests = p.generated, p.gaps, p.gapIDs
	// Without a batch or any change, the next step would plan the same
	// nothing (waiting requests that do not fit, running ones stalled for
	// a page): sleep until a command changes something.
	busy := len(p.chunks) > 0 || released > 0 || p.admitted > 0 || p.preempted > 0
	done = s.takeDone()
	g = s.gauges(end)
	s.mu.Unlock()

	s.report(&stats, done, g)
	return stats, busy
}

// report hands the step's numbers to the observer, outside the locks.
func (s *Scheduler) report(st *StepStats, done []Summary, g Gauges) {
	if st != nil && (st.Seqs > 0 || st.Stalled > 0 || st.Preempted > 0) {
		s.obs.Step(*st)
	}
	for _, d := range done {
		s.obs.RequestDone(d)
	}
	s.obs.Gauges(g)
}

func (s *Scheduler) takeDone() []Summary {
	d := s.pendingDone
	s.pendingDone = nil
	return d
}

// drainInbox applies the commands callers sent, in order, and returns how
// many requests they released.
func (s *Scheduler) drainInbox() int {
	s.inMu.Lock()
	cmds := s.inbox
	s.inbox = s.spare[:0]
	s.inMu.Unlock()
	released := 0
	for _, c := range cmds {
		if s.handle(c) {
			released++
		}
	}
	clear(cmds)
	s.spare = cmds[:0]
	return released
}

// handle applies one command and reports whether it released its request.
func (s *Scheduler) handle(c command) bool {
	r := c.r
	if c.kind == cmdSubmit {
		s.live = append(s.live, r) // arrival order: seq grows with the inbox
		s.setState(r, StateWaiting)
		return false
	}
	// Every other command comes after its request's submit: Submit queues
	// the submit before any Stream method can be called, and registers the
	// context watch while holding the inbox lock that the watch's post
	// needs.
	if r.state == StateFinished {
		return false
	}
	switch c.kind {
	case cmdCancel:
		s.release(r, FinishCancelled, context.Cause(r.ctx))
	case cmdHandover:
		if r.state != StateHandingOver {
			s.release(r, FinishError, fmt.Errorf("sched: request %q: Handover while %s, before its prompt was done: %w", r.id, r.state, engine.ErrInvalidInput))
		} else {
			s.release(r, FinishHandedOver, nil)
		}
	case cmdActivate:
		if r.state != StateTransferring {
			s.release(r, FinishError, fmt.Errorf("sched: request %q: Activate while %s, before its pages were reserved: %w", r.id, r.state, engine.ErrInvalidInput))
			return true
		}
		s.activate(r, c.tok, time.Now())
	}
	return r.state == StateFinished
}

func (s *Scheduler) setState(r *request, st State) {
	if r.state < numStates {
		s.counts[r.state]--
	}
	s.counts[st]++
	r.state = st
}

// makePlan admits, preempts and picks the step's chunks.
func (s *Scheduler) makePlan(p *plan) {
	clear(p.reqs)
	clear(p.chunks)
	*p = plan{chunks: p.chunks[:0], reqs: p.reqs[:0], gaps: p.gaps[:0], gapIDs: p.gapIDs[:0]}
	budget := s.cfg.MaxBatchTokens

	// 1. Running sequences, oldest first, each get the page for the token
	// they feed. When none is free, the youngest preemptable request gives
	// its pages up, if it is younger than the sequence; otherwise the
	// sequence sits this step out, keeping its pages: the pages it waits
	// for are held by older requests, which progress and will either free
	// them or preempt it, or by requests that cannot be preempted (a
	// transfer in or out), whose owners release them. Preempting itself
	// instead would only recompute the same pages over and over while
	// starving those requests.
	for i := 0; i < len(s.live) && budget > 0; i++ {
		r := s.live[i]
		if r.state != StateRunning {
			continue
		}
		stalled := false
		for r.table.Cap() <= r.computed {
			if err := r.table.Grow(r.computed + 1); err == nil {
				break
			}
			v := s.victim()
			if v == nil || v.seq <= r.seq {
				stalled = true
				break
			}
			s.preempt(v)
			p.preempted++
		}
		r.starved = stalled
		if stalled {
			p.stalled++
			continue
		}
		s.addChunk(p, r, r.computed, 1, true)
		p.decode++
		budget--
	}

	// 2. Admission, first come first served: a request waits for the pages
	// of its whole prompt (decode's prealloc queue for imported ones).
	active := s.counts[StatePrefilling] + s.counts[StateRunning] + s.counts[StateTransferring]
	full := false // once one waits, every later one does
	for _, r := range s.live {
		if r.state != StateWaiting {
			continue
		}
		if s.awaitsFork(r) {
			// Not admitted, but nothing it would hold is taken either:
			// later requests may go first.
			r.starved = true
			continue
		}
		if full = full || active >= s.cfg.MaxSeqs || !s.reserve(r); full {
			r.starved = true
			continue
		}
		r.starved = false
		active++
		p.admitted++
		if r.mode == ModeDecodeImported && !r.activated {
			s.setState(r, StateTransferring)
			s.emit(r, Event{Kind: EventReserved, Pages: r.table.Clone(), Held: r.computed / s.layout.PageSize})
			continue
		}
		s.setState(r, StatePrefilling)
	}

	// 3. Prompt chunks fill the rest of the budget.
	for i := 0; i < len(s.live) && budget > 0; i++ {
		r := s.live[i]
		if r.state != StatePrefilling {
			continue
		}
		target := r.prefillTarget()
		n := min(target-r.computed, budget)
		s.addChunk(p, r, r.computed, n, r.computed+n == target && r.generated() == 0)
		p.prefill += n
		budget -= n
	}
}

// reserve gives an admitted request its pages: the prefix cache's pages
// for the leading full pages of what it must compute, then fresh ones for
// the rest, or nothing at all when they do not fit. At least one position
// is always computed (the prompt's last one gives the first token's
// logits), so the partial page and the page being written are never
// shared; requests that want prompt log-probabilities compute every
// position, and imported ones receive the rest from prefill (the same rule
// keeps the page that prefill writes the last token into its own, never a
// shared one).
func (s *Scheduler) reserve(r *request) bool {
	target := r.prefillTarget()
	if src := s.forkSource(r); src != nil {
		return s.fork(r, src)
	}
	if s.cache && r.plp == nil {
		n, err := r.table.AttachPrefix(r.tokens[:target], (target-1)/s.layout.PageSize)
		if err != nil {
			s.violations++
		}
		r.computed = n * s.layout.PageSize
	}
	if r.table.Grow(target) != nil {
		if err := r.table.Release(); err != nil {
			s.violations++
		}
		r.computed = 0
		return false
	}
	if r.generated() == 0 {
		r.cached = r.computed
	}
	return true
}

// forkSource returns the choice of r's group that r can fork from: one
// whose pages hold at least r's fork point, or nil. Only a choice that has
// generated nothing forks (after a preemption one recomputes as any
// request does), an imported choice receives its pages from prefill, and
// a one-token prompt has nothing to share.
func (s *Scheduler) forkSource(r *request) *request {
	if r.grp == nil || r.mode == ModeDecodeImported || r.generated() > 0 || r.forkPoint() == 0 {
		return nil
	}
	for _, m := range r.grp.members {
		if m != r && (m.state == StatePrefilling || m.state == StateRunning) && m.computed >= r.forkPoint() {
			return m
		}
	}
	return nil
}

// awaitsFork reports whether r should wait for a choice of its group to
// reach the fork point rather than compute the prompt itself: while the
// first choice, which computes (or imports) the prompt, is live. Once it
// is gone — finished at its first token, say, or aborted — r computes its
// prompt as a request of its own would (reusing the prefix cache's pages
// where the cache is on): slower, never stuck.
func (s *Scheduler) awaitsFork(r *request) bool {
	if r.grp == nil || r.choice == 0 || r.generated() > 0 || r.forkPoint() == 0 || s.forkSource(r) != nil {
		return false
	}
	return r.grp.members[0].state != StateFinished
}

// fork gives r, a choice that has generated nothing, src's pages up to
// r's fork point: a reference to each full page, a copy of the partial one
// (both go on writing it: src its later positions, r its last prompt
// position), and a fresh page when the last position starts one. r then
// computes only the last prompt position, whose logits give it its own
// first token. It reports false, holding nothing, when the pages do not
// fit.
func (s *Scheduler) fork(r, src *request) bool {
	at := r.forkPoint()
	full := at / s.layout.PageSize
	if err := r.table.Share(src.table.Pages()[:full]...); err != nil {
		s.violations++
		return false
	}
	if r.table.Grow(r.nPrompt) != nil {
		if err := r.table.Release(); err != nil {
			s.violations++
		}
		return false
	}
	if at%s.layout.PageSize != 0 {
		if err := s.cfg.Pool.CopyPage(r.table.Pages()[full], src.table.Pages()[full]); err != nil {
			s.violations++
		}
	}
	r.computed = at
	// The forked positions were reused, not computed.
	r.cached = at
	return true
}

// offer gives r's computed full pages to the prefix cache before r lets
// them go.
func (s *Scheduler) offer(r *request) {
	if s.cache && r.computed > 0 {
		r.table.Cache(r.tokens[:r.computed])
	}
}

func (s *Scheduler) addChunk(p *plan, r *request, pos, n int, logits bool) {
	ch := model.Chunk{Tokens: r.tokens[pos : pos+n], Pos: pos, Pages: r.table.Pages()}
	if logits {
		if r.logits == nil {
			r.logits = make([]float32, s.mcfg.Vocab)
		}
		ch.Logits = r.logits
	}
	if r.plp != nil && r.state == StatePrefilling && r.generated() == 0 {
		ch.RowLogits = r.plp.chunk(pos)
	}
	p.chunks = append(p.chunks, ch)
	p.reqs = append(p.reqs, r)
}

// victim returns the youngest request whose pages may be taken, or nil.
func (s *Scheduler) victim() *request {
	for _, r := range slices.Backward(s.live) {
		if r.preemptable() && r.table.Len() > 0 {
			return r
		}
	}
	return nil
}

// preempt frees r's pages and puts it back in the queue, at its place in
// arrival order, to be recomputed: its tokens so far, sampler and stopper
// are kept, so it continues exactly where it stopped.
func (s *Scheduler) preempt(r *request) {
	s.offer(r)
	if err := r.table.Release(); err != nil {
		s.violations++
	}
	r.computed = 0
	r.preemptions++
	s.setState(r, StateWaiting)
}

// apply takes the forward pass's results: progress, pages completed,
// sampled tokens, finishes.
func (s *Scheduler) apply(p *plan, err error, now time.Time) {
	if err != nil {
		for _, r := range p.reqs {
			s.release(r, FinishError, fmt.Errorf("sched: forward pass: %w", err))
		}
		return
	}
	for i, r := range p.reqs {
		ch := p.chunks[i]
		if r.state == StateFinished {
			continue
		}
		r.computed += len(ch.Tokens)
		r.lastProgress = now
		switch r.state {
		case StatePrefilling:
			if r.mode == ModePrefillOnly && !s.announcePages(r) {
				continue
			}
			if r.computed < r.prefillTarget() {
				continue
			}
			if r.generated() > 0 { // recomputed after a preemption
				s.setState(r, StateRunning)
				continue
			}
			s.forkNow(r)
			tok, ok := s.sample(r, ch.Logits)
			if !ok {
				continue
			}
			if r.mode == ModePrefillOnly {
				r.firstToken, r.lastToken = now, now
				p.generated++
				if s.emit(r, Event{Kind: EventToken, Token: tok, PromptLogprobs: r.takePromptLogprobs(), Usage: r.usage()}) {
					r.tokens = append(r.tokens, tok.ID)
					s.setState(r, StateHandingOver)
				}
				continue
			}
			s.setState(r, StateRunning)
			s.accept(p, r, tok, now)
		case StateRunning:
			if tok, ok := s.sample(r, ch.Logits); ok {
				s.accept(p, r, tok, now)
			}
		}
	}
}

// announcePages sends EventPagesReady when more of a prefill-only request's
// pages are complete. It reports false if the request was released.
func (s *Scheduler) announcePages(r *request) bool {
	ready := r.computed / s.layout.PageSize
	if r.computed == r.nPrompt {
		ready = r.table.Len()
	}
	if ready <= r.readyPages {
		return true
	}
	r.readyPages = ready
	return s.emit(r, Event{Kind: EventPagesReady, Pages: r.table.Clone(), Ready: ready})
}

func (s *Scheduler) sample(r *request, logits []float32) (sample.Token, bool) {
	tok, err := r.sampler.Sample(logits)
	if err != nil {
		s.release(r, FinishError, fmt.Errorf("sched: request %q: %w", r.id, err))
		return sample.Token{}, false
	}
	return tok, true
}

// accept takes a generated token of a generating request: it streams it
// and finishes the request on a stop, at MaxTokens or at the end of the
// context window.
func (s *Scheduler) accept(p *plan, r *request, tok sample.Token, now time.Time) {
	if r.sampler.Ends(tok.ID) || !r.req.IgnoreEOS && s.cfg.Tokenizer != nil && s.cfg.Tokenizer.IsEOG(tok.ID) {
		s.finish(r, FinishStop)
		return
	}
	var text string
	if r.dec != nil {
		text = r.dec.Next(tok.ID)
	}
	text, stop := r.stopper.Push(tok.ID, text)
	if r.firstToken.IsZero() {
		r.firstToken = now
	} else if p != nil {
		p.gaps = append(p.gaps, now.Sub(r.lastToken))
		p.gapIDs = append(p.gapIDs, r.id)
	}
	r.lastToken = now
	if p != nil {
		p.generated++
	}
	if !s.emit(r, Event{Kind: EventToken, Token: tok, Text: text, PromptLogprobs: r.takePromptLogprobs()}) {
		return
	}
	r.tokens = append(r.tokens, tok.ID)
	r.sampler.Accept(tok.ID)
	switch {
	case stop:
		s.finish(r, FinishStop)
	case r.generated() >= r.req.MaxTokens:
		s.finish(r, FinishLength)
	case len(r.tokens) >= s.mcfg.ContextLength:
		s.finish(r, FinishContext)
	}
}

// finish ends a request that completed normally, releasing the text held
// back for a possible stop string or an incomplete character.
func (s *Scheduler) finish(r *request, reason FinishReason) {
	var tail string
	if !r.stopper.Stopped() {
		var rest string
		if r.dec != nil {
			rest = r.dec.Flush()
		}
		text, stop := r.stopper.Push(-1, rest)
		tail = text
		if stop {
			reason = FinishStop
		} else {
			tail += r.stopper.Flush()
		}
	}
	s.releaseWith(r, reason, nil, tail)
}

// activate starts decoding an imported request whose pages now hold its
// prompt.
func (s *Scheduler) activate(r *request, first sample.Token, now time.Time) {
	if first.ID < 0 || int(first.ID) >= s.mcfg.Vocab {
		s.release(r, FinishError, fmt.Errorf("sched: request %q: first token %d outside the vocabulary [0, %d): %w",
			r.id, first.ID, s.mcfg.Vocab, engine.ErrInvalidInput))
		return
	}
	r.computed = r.nPrompt
	r.activated = true
	r.lastProgress = now
	// Prefill drew the first token: move past its draw, and past it in
	// the grammar, so that this sampler continues exactly as a colocated
	// one would.
	if err := r.sampler.Follow(first.ID); err != nil {
		s.release(r, FinishError, fmt.Errorf("sched: request %q: %w", r.id, err))
		return
	}
	s.setState(r, StateRunning)
	s.forkNow(r)
	s.accept(nil, r, first, now)
}

// forkNow forks the waiting choices of r's group from r, its first choice,
// as soon as r holds its whole prompt and before its first token is taken:
// that token may end r (a stop, MaxTokens 1), and the others would then
// compute the prompt themselves. Only as admission would: within
// Config.MaxSeqs and when no older request waits (those go first); a choice
// left waiting forks at admission or falls back.
func (s *Scheduler) forkNow(r *request) {
	if r.grp == nil || r.choice != 0 {
		return
	}
	for _, w := range s.live {
		if w.state == StateWaiting && w.seq < r.seq {
			return
		}
	}
	active := s.counts[StatePrefilling] + s.counts[StateRunning] + s.counts[StateTransferring]
	for _, m := range r.grp.members[1:] {
		if active >= s.cfg.MaxSeqs {
			return
		}
		if m.state != StateWaiting || m.generated() > 0 || m.forkPoint() == 0 || r.computed < m.forkPoint() {
			continue
		}
		if !s.fork(m, r) {
			return
		}
		m.starved = false
		active++
		s.setState(m, StatePrefilling)
	}
}

// emit sends a non-final event. The last slot of the channel is kept for
// EventDone; a consumer that lets the others fill up gets its request
// aborted, so that the scheduler never blocks. It reports whether the
// request is still live.
func (s *Scheduler) emit(r *request, ev Event) bool {
	if len(r.events) >= cap(r.events)-r.reservedSlots() {
		s.release(r, FinishAborted, ErrSlowConsumer)
		return false
	}
	ev.Choice = r.choice
	r.events <- ev
	return true
}

func (s *Scheduler) release(r *request, reason FinishReason, err error) {
	s.releaseWith(r, reason, err, "")
}

// releaseWith is the one way out: it frees the pages, leaves the lists,
// stops watching the context, sends EventDone and closes the channel. It
// does nothing the second time.
func (s *Scheduler) releaseWith(r *request, reason FinishReason, err error, tail string) {
	if r.state == StateFinished {
		return
	}
	stage := r.state
	r.stop()
	if reason != FinishError {
		// A failed forward pass may have left the pages half written.
		s.offer(r)
	}
	if relErr := r.table.Release(); relErr != nil {
		s.violations++
	}
	if i, ok := slices.BinarySearchFunc(s.live, r.seq, func(x *request, seq uint64) int {
		return cmp.Compare(x.seq, seq)
	}); ok {
		s.live = slices.Delete(s.live, i, i+1)
	}
	s.setState(r, StateFinished)
	r.finished = time.Now()
	ev := Event{Kind: EventDone, Choice: r.choice, Text: tail, Finish: reason, Err: err, Usage: r.usage()}
	if err == nil {
		ev.PromptLogprobs = r.takePromptLogprobs()
	}
	r.events <- ev
	// The channel is the group's: the last choice released closes it.
	if r.grp == nil {
		close(r.events)
	} else if r.grp.live--; r.grp.live == 0 {
		close(r.events)
	}
	s.inMu.Lock()
	delete(s.ids, r.id)
	s.inMu.Unlock()

	sum := Summary{
		ID: r.id, Mode: r.mode, Finish: reason, Err: err, Stage: stage, Choice: r.choice,
		Queued: r.queued, E2E: r.finished.Sub(r.queued), Usage: r.usage(),
	}
	if !r.firstToken.IsZero() {
		sum.TTFT = r.firstToken.Sub(r.queued)
	}
	s.pendingDone = append(s.pendingDone, sum)
	// Keep nothing big alive through the caller's Stream.
	r.logits, r.sampler, r.dec, r.plp = nil, nil, nil, nil
}

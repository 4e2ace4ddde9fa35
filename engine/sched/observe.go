package sched

import (
	"fmt"
	"time"

	"github.com/baton-serving/baton/engine/kvcache"
)

// Observer receives the scheduler's metrics. The services back it with
// Prometheus (the engine does not import a metrics library). Methods are
// called from the scheduler's goroutine, outside its locks; they must
// return quickly and must not call back into the scheduler's blocking
// paths.
type Observer interface {
	// Gauges is called after every step and on state changes, and before
	// each forward pass, so that the counts describe the requests the
	// scheduler holds (its Snapshot) even while a pass hangs.
	Gauges(Gauges)
	// Step is called after every step that ran a batch, preempted or
	// stalled.
	Step(StepStats)
	// RequestDone is called once per request, when it is released.
	RequestDone(Summary)
	// Audit is called with each periodic audit.
	Audit(AuditReport)
}

// NopObserver discards everything; embed it to implement part of Observer.
type NopObserver struct{}

func (NopObserver) Gauges(Gauges)       {}
func (NopObserver) Step(StepStats)      {}
func (NopObserver) RequestDone(Summary) {}
func (NopObserver) Audit(AuditReport)   {}

// Gauges are the scheduler's current counts, named after the metrics the
// services export.
type Gauges struct {
	Waiting      int // num_queue_reqs: ModeGenerate and ModePrefillOnly requests waiting for pages
	Prealloc     int // num_decode_prealloc_queue_reqs: ModeDecodeImported requests waiting for pages
	Prefilling   int
	Running      int // num_running_reqs
	Transferring int // num_decode_transfer_queue_reqs
	HandingOver  int // num_prefill_inflight_queue_reqs
	// PagesUsed counts the pages requests hold: cached pages that no
	// request holds are reclaimable and left out (Snapshot.Pages has the
	// pool's own count, which the auditor checks).
	PagesUsed  int
	PagesTotal int
	// PrefixCachePages counts the pages the prefix cache keeps (held or
	// not), PrefixEvictions the pages it evicted since the start.
	PrefixCachePages int
	PrefixEvictions  uint64
	// TokenUsage is the fraction of KV cache pages in use (token_usage).
	TokenUsage float64
	// GenThroughput is generated tokens per second over the last
	// throughputWindow (gen_throughput).
	GenThroughput float64
}

// StepStats describes one step.
type StepStats struct {
	Start    time.Time
	Duration time.Duration
	// Seqs is the number of sequences in the batch; DecodeTokens and
	// PrefillTokens split its tokens; Generated counts sampled tokens.
	Seqs, DecodeTokens, PrefillTokens, Generated int
	// Preempted counts requests that lost their pages, Stalled running
	// sequences that sat the step out waiting for a page, Admitted
	// requests that got their pages.
	Preempted, Stalled, Admitted int
	// TokenGaps are the inter-token latencies of the tokens this step
	// generated (not the first ones), and GapRequests the id of the
	// request each belongs to (so observers can leave some out). The
	// slices are reused after the call.
	TokenGaps   []time.Duration
	GapRequests []string
	Err         error
}

// Summary describes a released request.
type Summary struct {
	ID     string
	Mode   Mode
	Finish FinishReason
	Err    error
	// Stage is the state the request was released from (aborts by stage).
	Stage  State
	Queued time.Time
	// TTFT is the time from Submit to the first token (0 when none came);
	// E2E from Submit to release.
	TTFT, E2E time.Duration
	Usage     Usage
	// Choice is the request's choice (Request.N > 1; 0 otherwise): the
	// choices after the first reuse the first's prompt, so a count of
	// requests or of prompt tokens takes choice 0 only.
	Choice int
}

type throughputSample struct {
	at     time.Time
	tokens int
}

// throughputWindow is the span GenThroughput averages over.
const throughputWindow = 5 * time.Second

func (s *Scheduler) gauges(now time.Time) Gauges {
	st := s.cfg.Pool.Stats()
	g := Gauges{
		Prefilling:   s.counts[StatePrefilling],
		Running:      s.counts[StateRunning],
		Transferring: s.counts[StateTransferring],
		HandingOver:  s.counts[StateHandingOver],
		PagesUsed:    st.Used,
		PagesTotal:   st.Total,
		TokenUsage:   float64(st.Used) / float64(st.Total),
	}
	if s.cache {
		// Cached pages no request holds are free for the asking (Alloc
		// evicts them), so they count as free, as SGLang's token_usage
		// leaves its evictable tree cache out; the auditor counts them.
		cs := s.cfg.Pool.CacheStats()
		g.PrefixCachePages, g.PrefixEvictions = cs.Pages, cs.Evictions
		g.PagesUsed -= cs.Evictable
		g.TokenUsage = float64(g.PagesUsed) / float64(st.Total)
	}
	for _, r := range s.live {
		if r.state == StateWaiting {
			if r.mode == ModeDecodeImported && !r.activated {
				g.Prealloc++
			} else {
				g.Waiting++
			}
		}
	}
	i := 0
	for i < len(s.window) && now.Sub(s.window[i].at) > throughputWindow {
		i++
	}
	s.window = s.window[i:]
	if len(s.window) > 0 {
		n := 0
		for _, w := range s.window {
			n += w.tokens
		}
		g.GenThroughput = float64(n) / throughputWindow.Seconds()
	}
	return g
}

// RequestInfo describes a live request in a Snapshot.
type RequestInfo struct {
	ID    string
	Mode  Mode
	State State
	// Age is the time since Submit; SinceProgress the time since the
	// request last advanced (a chunk, a token, a state change by a
	// caller), or since Submit if it never did.
	Age, SinceProgress time.Duration
	Pages              int
	PromptTokens       int
	Computed           int // positions in the KV cache
	Generated          int
	Preemptions        int
	Queued             time.Time
	FirstToken         time.Time // zero before the first token
	LastProgress       time.Time // zero before any progress
	// Starved is true when the last step left the request out for want of
	// capacity that others hold: a running request that sat the step out
	// waiting for a page, or a waiting one that was not admitted (no pages
	// or no MaxSeqs slot). Its wait is theirs, not a stall of the engine.
	Starved bool
}

// Snapshot is the scheduler's state at one moment.
type Snapshot struct {
	At    time.Time
	Steps uint64
	// LastStep is when the last batch finished; StepRunning how long the
	// batch in progress has been running (0 when none is) and StepTokens
	// how many tokens it computes (decode tokens plus prompt chunks), from
	// which the watchdog bounds how long it may take.
	LastStep    time.Time
	StepRunning time.Duration
	StepTokens  int
	Pages       kvcache.Stats
	Gauges      Gauges
	// Requests lists the live requests, oldest first.
	Requests []RequestInfo
}

// Snapshot lists the live requests. It never waits for a forward pass.
func (s *Scheduler) Snapshot() Snapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	snap := Snapshot{At: now, Steps: s.steps, LastStep: s.lastStep, Pages: s.cfg.Pool.Stats(), Gauges: s.gauges(now)}
	if !s.stepStart.IsZero() {
		snap.StepRunning, snap.StepTokens = now.Sub(s.stepStart), s.stepTokens
	}
	for _, r := range s.live {
		last := r.lastProgress
		if last.IsZero() {
			last = r.queued
		}
		snap.Requests = append(snap.Requests, RequestInfo{
			ID: r.id, Mode: r.mode, State: r.state,
			Age: now.Sub(r.queued), SinceProgress: now.Sub(last),
			Pages: r.table.Len(), PromptTokens: r.nPrompt, Computed: r.computed,
			Generated: r.generated(), Preemptions: r.preemptions,
			Queued: r.queued, FirstToken: r.firstToken, LastProgress: r.lastProgress,
			Starved: r.starved && (r.state == StateWaiting || r.state == StateRunning),
		})
	}
	return snap
}

// AuditReport is what the auditor found.
type AuditReport struct {
	At time.Time
	// Live is the number of requests the scheduler holds.
	Live int
	// PagesUsed is the pool's count, PagesOwned the distinct pages the
	// live requests or the prefix cache hold; LeakedPages = PagesUsed -
	// PagesOwned must be 0.
	PagesUsed, PagesOwned, LeakedPages int
	// Violations describes every broken invariant; empty when all is well.
	Violations []string
	// Audits and TotalViolations count every audit and every violation
	// since the scheduler started (page release failures included).
	Audits, TotalViolations uint64
}

// OK reports whether the audit found nothing wrong.
func (a AuditReport) OK() bool { return a.LeakedPages == 0 && len(a.Violations) == 0 }

// Audit recomputes the page and state counts from the live requests and
// compares them with the pool's and the scheduler's own counters.
func (s *Scheduler) Audit() AuditReport {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.cfg.Pool.Stats()
	rep := AuditReport{At: time.Now(), Live: len(s.live), PagesUsed: st.Used}
	bad := func(format string, args ...any) {
		rep.Violations = append(rep.Violations, fmt.Sprintf(format, args...))
	}

	var counts [numStates]int
	holders := make(map[kvcache.PageID]int)
	for i, r := range s.live {
		if i > 0 && s.live[i-1].seq >= r.seq {
			bad("live list out of arrival order at %q", r.id)
		}
		if r.state >= StateFinished {
			bad("request %q is listed as live in state %s", r.id, r.state)
			continue
		}
		counts[r.state]++
		pages := r.table.Pages()
		for _, p := range pages {
			holders[p]++
		}
		need := s.layout.PagesFor(r.computed)
		switch r.state {
		case StateWaiting:
			if len(pages) != 0 || r.computed != 0 {
				bad("waiting request %q holds %d pages and %d positions", r.id, len(pages), r.computed)
			}
		case StateTransferring:
			if r.mode != ModeDecodeImported || r.activated || len(pages) != s.layout.PagesFor(r.nPrompt) {
				bad("transferring request %q (%s) holds %d pages for a %d-token prompt", r.id, r.mode, len(pages), r.nPrompt)
			}
		case StateHandingOver:
			if r.mode != ModePrefillOnly || r.computed != r.nPrompt || len(pages) != need {
				bad("handing-over request %q (%s) has %d of %d positions in %d pages", r.id, r.mode, r.computed, r.nPrompt, len(pages))
			}
		case StatePrefilling, StateRunning:
			if len(pages) < need {
				bad("%s request %q has %d positions in %d pages", r.state, r.id, r.computed, len(pages))
			}
		}
	}
	// The prefix cache is one more holder of each page it keeps.
	for _, p := range s.cfg.Pool.CachedPages() {
		holders[p]++
	}
	rep.PagesOwned = len(holders)
	for p, n := range holders {
		if refs := s.cfg.Pool.Refs(p); refs != n {
			bad("page %d has %d references but %d holders", p, refs, n)
		}
	}
	for st := range StateFinished {
		if counts[st] != s.counts[st] {
			bad("%s counter says %d, live requests %d", st, s.counts[st], counts[st])
		}
	}
	s.inMu.Lock()
	pending := 0
	for _, c := range s.inbox {
		if c.kind == cmdSubmit {
			pending++
		}
	}
	if ids := len(s.ids); ids != len(s.live)+pending {
		bad("%d request ids registered for %d live and %d submitted requests", ids, len(s.live), pending)
	}
	s.inMu.Unlock()

	rep.LeakedPages = rep.PagesUsed - rep.PagesOwned
	if rep.LeakedPages != 0 {
		bad("%d pages used but %d held by live requests and the prefix cache", rep.PagesUsed, rep.PagesOwned)
	}
	s.audits++
	s.violations += uint64(len(rep.Violations))
	rep.Audits, rep.TotalViolations = s.audits, s.violations
	return rep
}

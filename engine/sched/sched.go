package sched

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/baton-serving/baton/engine"
	"github.com/baton-serving/baton/engine/kvcache"
	"github.com/baton-serving/baton/engine/model"
	"github.com/baton-serving/baton/engine/sample"
	"github.com/baton-serving/baton/engine/tokenizer"
	"github.com/baton-serving/baton/kernels"
)

// Defaults of Config's tunables.
const (
	DefaultMaxBatchTokens = 512
	DefaultMaxSeqs        = 128
	DefaultEventBuffer    = 128
	DefaultMaxRequests    = 4096
	DefaultAuditInterval  = 10 * time.Second
)

// Model is what the scheduler uses of a model: its shape and the batched
// forward pass over the paged KV cache. A [model.Model] is one; a test can
// give a fake that fails a step or records each batch.
type Model interface {
	Config() model.Config
	ForwardBatch(kv *kvcache.Pool, batch []model.Chunk) error
}

// Config configures a Scheduler. Model and Pool are required; the zero value
// of every other field selects its default.
type Config struct {
	Model Model
	// Pool holds the KV cache pages; it belongs to the scheduler, whose
	// auditor counts every used page as held by one of its requests or by
	// the pool's prefix cache. Its layout must be Model.Config().KVLayout's.
	// When its prefix cache is on (kvcache.Pool.EnableCache, before New),
	// prompts reuse cached pages and finished requests leave theirs.
	Pool *kvcache.Pool
	// Tokenizer, when set, turns tokens into text deltas and supplies the
	// end-of-generation tokens; without it events carry no text and only
	// Request.StopIDs end generation early.
	Tokenizer *tokenizer.Tokenizer
	// MaxBatchTokens is a step's token budget: decode tokens plus prompt
	// chunk tokens.
	MaxBatchTokens int
	// MaxSeqs bounds the requests that compute at once (prefilling,
	// running, transferring).
	MaxSeqs int
	// EventBuffer is each request's event channel capacity (≥ 2); a consumer
	// that lets all but one slot fill gets its request aborted.
	EventBuffer int
	// MaxRequests bounds the requests in flight, queued ones included;
	// Submit beyond it fails with ErrQueueFull.
	MaxRequests int
	// AuditInterval is how often the auditor runs; negative disables the
	// periodic run (Audit can still be called).
	AuditInterval time.Duration
	// Observer receives metrics; nil discards them. It is called from the
	// scheduler's goroutine (Step's caller in manual mode), outside its
	// locks, and must not block.
	Observer Observer
	// Manual starts no goroutine: the caller drives the scheduler with
	// Step, which runs the same code the goroutine runs. For tests.
	Manual bool
}

// Scheduler runs requests in continuous batches. Its methods are safe for
// concurrent use.
type Scheduler struct {
	cfg    Config
	mcfg   model.Config
	layout kernels.KVLayout
	obs    Observer
	cache  bool // the pool's prefix cache is on

	// The inbox: what callers send to the owning goroutine.
	inMu    sync.Mutex
	inbox   []command
	ids     map[string]*request
	closed  bool
	nextSeq uint64
	wake    chan struct{}

	// mu guards the state below. Only the owner — the loop goroutine, or
	// Step's caller in manual mode — writes it; Snapshot and Audit read it.
	// The owner does not hold mu during a forward pass, so they never wait
	// for one.
	mu          sync.Mutex
	live        []*request // in arrival order
	counts      [numStates]int
	steps       uint64
	lastStep    time.Time
	stepStart   time.Time // of the forward pass in progress; zero when none
	stepTokens  int       // tokens of the forward pass in progress
	window      []throughputSample
	audits      uint64
	violations  uint64
	pendingDone []Summary // released since the observer was last called
	spare       []command
	plan        plan

	quit   chan struct{}
	exited chan struct{}
}

type cmdKind uint8

const (
	cmdSubmit cmdKind = iota
	cmdCancel
	cmdHandover
	cmdActivate
)

type command struct {
	kind cmdKind
	r    *request
	tok  sample.Token
}

// New validates cfg and starts the scheduler (unless cfg.Manual).
func New(cfg Config) (*Scheduler, error) {
	if cfg.Model == nil || cfg.Pool == nil {
		return nil, fmt.Errorf("sched: Config needs a Model and a Pool: %w", engine.ErrInvalidInput)
	}
	mcfg := cfg.Model.Config()
	l := cfg.Pool.Layout()
	if l.Layers != mcfg.Layers || l.KVHeads != mcfg.KVHeads || l.HeadDim != mcfg.HeadDim {
		return nil, fmt.Errorf("sched: pool pages (%s) do not fit the model (%d layers × %d KV heads × %d): %w",
			l, mcfg.Layers, mcfg.KVHeads, mcfg.HeadDim, engine.ErrInvalidInput)
	}
	if cfg.Tokenizer != nil && cfg.Tokenizer.VocabSize() > mcfg.Vocab {
		return nil, fmt.Errorf("sched: tokenizer of %d tokens for a model of %d: %w", cfg.Tokenizer.VocabSize(), mcfg.Vocab, engine.ErrInvalidInput)
	}
	for _, f := range []struct {
		name string
		v    *int
		def  int
		min  int
	}{
		{"MaxBatchTokens", &cfg.MaxBatchTokens, DefaultMaxBatchTokens, 1},
		{"MaxSeqs", &cfg.MaxSeqs, DefaultMaxSeqs, 1},
		{"EventBuffer", &cfg.EventBuffer, DefaultEventBuffer, 2},
		{"MaxRequests", &cfg.MaxRequests, DefaultMaxRequests, 1},
	} {
		if *f.v == 0 {
			*f.v = f.def
		}
		if *f.v < f.min {
			return nil, fmt.Errorf("sched: Config.%s = %d, want ≥ %d: %w", f.name, *f.v, f.min, engine.ErrInvalidInput)
		}
	}
	if cfg.AuditInterval == 0 {
		cfg.AuditInterval = DefaultAuditInterval
	}
	s := &Scheduler{
		cfg:    cfg,
		mcfg:   mcfg,
		layout: l,
		obs:    cfg.Observer,
		cache:  cfg.Pool.CacheEnabled(),
		ids:    make(map[string]*request),
		wake:   make(chan struct{}, 1),
		quit:   make(chan struct{}),
		exited: make(chan struct{}),
	}
	if s.obs == nil {
		s.obs = NopObserver{}
	}
	if cfg.Manual {
		close(s.exited)
	} else {
		go s.loop()
	}
	return s, nil
}

// Submit validates req and queues it. The returned Stream's events report
// its progress; cancelling ctx, at any moment, ends it with FinishCancelled
// and releases what it holds (a context already done fails Submit with its
// cause). Errors wrap engine.ErrInvalidInput, engine.ErrContextOverflow or
// engine.ErrKVCacheFull (a request that could never fit the pool), or are
// ErrClosed, ErrQueueFull or ErrDuplicateID.
func (s *Scheduler) Submit(ctx context.Context, req Request) (*Stream, error) {
	if ctx == nil {
		return nil, fmt.Errorf("sched: nil context: %w", engine.ErrInvalidInput)
	}
	if ctx.Err() != nil {
		return nil, fmt.Errorf("sched: submit: %w", context.Cause(ctx))
	}
	rs, err := s.newChoices(ctx, req)
	if err != nil {
		return nil, err
	}
	r := rs[0]
	s.inMu.Lock()
	switch {
	case s.closed:
		s.inMu.Unlock()
		return nil, ErrClosed
	case len(s.ids)+len(rs) > s.cfg.MaxRequests:
		s.inMu.Unlock()
		return nil, fmt.Errorf("%w (%d)", ErrQueueFull, s.cfg.MaxRequests)
	}
	if r.id == "" {
		r.id = fmt.Sprintf("req-%d", s.nextSeq)
	}
	// Choice k > 0 is "ID/k": a client's ids have no '/', so these never
	// collide with another request's.
	for _, c := range rs[1:] {
		c.id = fmt.Sprintf("%s/%d", r.id, c.choice)
	}
	for _, c := range rs {
		if _, dup := s.ids[c.id]; dup {
			s.inMu.Unlock()
			return nil, fmt.Errorf("%w: %q", ErrDuplicateID, c.id)
		}
	}
	for _, c := range rs {
		c.seq = s.nextSeq
		s.nextSeq++
		s.ids[c.id] = c
		// Watch the context before the scheduler can see the request, so
		// that release always finds the watch to stop. The watch posts
		// under inMu, so even a context that ends right now queues its
		// cancel after the submit. Every choice watches the one context:
		// cancelling it ends them all.
		c.stop = context.AfterFunc(ctx, func() { s.post(command{kind: cmdCancel, r: c}) })
		s.inbox = append(s.inbox, command{kind: cmdSubmit, r: c})
	}
	s.inMu.Unlock()
	s.signal()
	return &Stream{s: s, r: r}, nil
}

// newChoices validates req and makes its requests: one per choice, linked
// in a group sharing one event channel when req.N > 1.
func (s *Scheduler) newChoices(ctx context.Context, req Request) ([]*request, error) {
	n := max(req.N, 1)
	switch {
	case req.N < 0:
		return nil, fmt.Errorf("sched: N = %d, want ≥ 1: %w", req.N, engine.ErrInvalidInput)
	case n > 1 && req.Mode == ModePrefillOnly:
		return nil, fmt.Errorf("sched: N = %d for a prefill-only request (decode forks the choices): %w", req.N, engine.ErrInvalidInput)
	case n > 1 && req.Constraint != nil && len(req.Constraints) != n-1:
		return nil, fmt.Errorf("sched: %d constraints for the %d choices after the first, want one each: %w", len(req.Constraints), n-1, engine.ErrInvalidInput)
	case len(req.Constraints) != 0 && (req.Constraint == nil || n == 1):
		return nil, fmt.Errorf("sched: %d Constraints for N = %d, Constraint set: %t (they are for choices 1 … N-1 under a Constraint): %w",
			len(req.Constraints), req.N, req.Constraint != nil, engine.ErrInvalidInput)
	}
	first, err := s.newRequest(ctx, req)
	if err != nil || n == 1 {
		return []*request{first}, err
	}
	g := &group{members: make([]*request, n), live: n}
	// One channel for every choice, each with its own share of the buffer.
	first.events = make(chan Event, s.cfg.EventBuffer*n)
	first.grp, g.members[0] = g, first
	for k := 1; k < n; k++ {
		c := req
		c.Params.Seed = sample.ChoiceSeed(req.Params.Seed, k)
		// The other choices compute their last prompt position here, also
		// on decode, where the first choice imported the prompt; only the
		// first reports the prompt's log-probabilities.
		c.Mode, c.PromptLogprobs = ModeGenerate, false
		if req.Constraint != nil {
			c.Constraint = req.Constraints[k-1]
		}
		r, err := s.newRequest(ctx, c)
		if err != nil {
			return nil, fmt.Errorf("sched: choice %d: %w", k, err)
		}
		r.events, r.grp, r.choice = first.events, g, k
		g.members[k] = r
	}
	return g.members, nil
}

func (s *Scheduler) newRequest(ctx context.Context, req Request) (*request, error) {
	c := s.mcfg
	n := len(req.Prompt)
	switch {
	case n == 0:
		return nil, fmt.Errorf("sched: empty prompt: %w", engine.ErrInvalidInput)
	case req.Mode > ModeDecodeImported:
		return nil, fmt.Errorf("sched: unknown mode %d: %w", req.Mode, engine.ErrInvalidInput)
	case req.Mode != ModePrefillOnly && req.MaxTokens < 1:
		return nil, fmt.Errorf("sched: MaxTokens = %d, want ≥ 1: %w", req.MaxTokens, engine.ErrInvalidInput)
	case n >= c.ContextLength:
		return nil, fmt.Errorf("sched: a prompt of %d tokens leaves no room to generate in the context window of %d: %w",
			n, c.ContextLength, engine.ErrContextOverflow)
	}
	for i, t := range req.Prompt {
		if t < 0 || int(t) >= c.Vocab {
			return nil, fmt.Errorf("sched: prompt token %d (index %d) outside the vocabulary [0, %d): %w", t, i, c.Vocab, engine.ErrInvalidInput)
		}
	}
	maxNew := min(req.MaxTokens, c.ContextLength-n)
	positions := n + maxNew - 1 // the last token generated is never fed back
	if req.Mode == ModePrefillOnly {
		maxNew, positions = 1, n
	}
	if need, total := s.layout.PagesFor(positions), s.cfg.Pool.Stats().Total; need > total {
		return nil, fmt.Errorf("sched: the request needs %d pages (%d prompt + %d new tokens = %d positions, %d per page) but the KV cache has %d pages in all: %w",
			need, n, maxNew, positions, s.layout.PageSize, total, engine.ErrKVCacheFull)
	}
	smp, err := sample.New(req.Params)
	if err != nil {
		return nil, err
	}
	if req.Constraint != nil {
		var eog []int32
		if s.cfg.Tokenizer != nil {
			eog = s.cfg.Tokenizer.EOGs()
		}
		smp.Constrain(req.Constraint, eog, req.IgnoreEOS)
	}
	stopper, err := sample.NewStopper(req.Stop, req.StopIDs)
	if err != nil {
		return nil, err
	}
	tokens := make([]int32, n, n+maxNew)
	copy(tokens, req.Prompt)
	smp.Accept(tokens...)
	r := &request{
		id:      req.ID,
		mode:    req.Mode,
		req:     req,
		ctx:     ctx,
		events:  make(chan Event, s.cfg.EventBuffer),
		state:   stateNew,
		table:   s.cfg.Pool.NewTable(),
		tokens:  tokens,
		nPrompt: n,
		sampler: smp,
		stopper: stopper,
		queued:  time.Now(),
	}
	r.req.Prompt = nil // tokens holds it
	if req.PromptLogprobs && req.Mode != ModeDecodeImported {
		r.plp = newPromptLogprobs(tokens[:n], req.Params.TopLogprobs)
	}
	if s.cfg.Tokenizer != nil {
		r.dec = s.cfg.Tokenizer.NewStreamDecoder()
	}
	return r, nil
}

// post hands a command to the owner; after Close it is dropped (Close has
// released every request).
func (s *Scheduler) post(c command) {
	s.inMu.Lock()
	if s.closed {
		s.inMu.Unlock()
		return
	}
	s.inbox = append(s.inbox, c)
	s.inMu.Unlock()
	s.signal()
}

func (s *Scheduler) signal() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// Close aborts every request in flight (FinishAborted, ErrClosed), stops
// the scheduler's goroutine and waits for it, however long the forward step
// in progress takes. It does not close the model or the pool. A later call
// returns at once once the goroutine has exited — but not after a
// Shutdown that gave up on a hung step (ErrStepHung): Close then waits for
// that step to return, possibly for ever. A stopping service uses
// Shutdown, which does not wait for a hung step, and never calls Close
// after it gave up.
func (s *Scheduler) Close() error { return s.Shutdown(context.Background()) }

// Shutdown is Close bounded by ctx: the scheduler refuses new requests at
// once and its goroutine releases every request at its next step boundary,
// but when ctx ends first — a forward step hangs, as a stuck kernel would —
// Shutdown returns an error wrapping ErrStepHung and ctx's cause instead of
// waiting. The requests stay in the Snapshot until the step returns; then
// the goroutine releases them and their pages (their one owner) and exits.
// It may be called again, to wait once more.
func (s *Scheduler) Shutdown(ctx context.Context) error {
	s.inMu.Lock()
	already := s.closed
	s.closed = true
	s.inMu.Unlock()
	if s.cfg.Manual {
		if !already {
			s.releaseAll()
		}
		return nil
	}
	if !already {
		close(s.quit)
	}
	select {
	case <-s.exited: // preferred when both are ready
		return nil
	default:
	}
	select {
	case <-s.exited:
		return nil
	case <-ctx.Done():
		s.mu.Lock()
		var running time.Duration
		if !s.stepStart.IsZero() {
			running = time.Since(s.stepStart)
		}
		held := len(s.live)
		s.mu.Unlock()
		return fmt.Errorf("%w (running for %v; %d requests released when it returns): %w",
			ErrStepHung, running.Round(time.Millisecond), held, context.Cause(ctx))
	}
}

// releaseAll releases everything, on the owner's goroutine.
func (s *Scheduler) releaseAll() {
	s.mu.Lock()
	s.drainInbox()
	for _, r := range slices.Clone(s.live) {
		s.release(r, FinishAborted, ErrClosed)
	}
	done := s.takeDone()
	g := s.gauges(time.Now())
	s.mu.Unlock()
	s.report(nil, done, g)
}

// loop is the owning goroutine: it steps while there is work and otherwise
// sleeps until a command arrives, the auditor is due, or Close.
func (s *Scheduler) loop() {
	defer close(s.exited)
	var tick <-chan time.Time
	if s.cfg.AuditInterval > 0 {
		t := time.NewTicker(s.cfg.AuditInterval)
		defer t.Stop()
		tick = t.C
	}
	for {
		_, busy := s.step()
		select {
		case <-s.quit:
			s.releaseAll()
			return
		case <-tick:
			s.runAudit()
		default:
		}
		if busy {
			continue
		}
		select {
		case <-s.quit:
			s.releaseAll()
			return
		case <-tick:
			s.runAudit()
		case <-s.wake:
		}
	}
}

// Step runs one step in manual mode (Config.Manual): it applies the
// commands callers sent, plans a batch, runs it and streams the results.
// busy reports whether another step would have work without new commands.
func (s *Scheduler) Step() (stats StepStats, busy bool, err error) {
	if !s.cfg.Manual {
		return StepStats{}, false, fmt.Errorf("sched: Step needs Config.Manual: %w", engine.ErrInvalidInput)
	}
	s.inMu.Lock()
	closed := s.closed
	s.inMu.Unlock()
	if closed {
		return StepStats{}, false, ErrClosed
	}
	stats, busy = s.step()
	stats.TokenGaps = slices.Clone(stats.TokenGaps)
	return stats, busy, nil
}

// FlushCache evicts every prefix cache page that no request holds and
// returns how many pages it freed.
func (s *Scheduler) FlushCache() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cfg.Pool.Flush()
}

func (s *Scheduler) runAudit() {
	rep := s.Audit()
	s.obs.Audit(rep)
}

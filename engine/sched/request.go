package sched

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/baton-serving/baton/engine"
	"github.com/baton-serving/baton/engine/kvcache"
	"github.com/baton-serving/baton/engine/sample"
	"github.com/baton-serving/baton/engine/tokenizer"
)

// Errors of the scheduler itself; the engine's sentinels (ErrInvalidInput,
// ErrContextOverflow, ErrKVCacheFull) cover the rest.
var (
	// ErrClosed: the scheduler was closed (Submit after Close, or requests
	// aborted by Close).
	ErrClosed = errors.New("sched: scheduler closed")
	// ErrSlowConsumer: the request's consumer let its event buffer fill up.
	ErrSlowConsumer = errors.New("sched: event consumer fell behind; request aborted")
	// ErrDuplicateID: a live request already has the id.
	ErrDuplicateID = errors.New("sched: a request with this id is in flight")
	// ErrQueueFull: Config.MaxRequests requests are in flight.
	ErrQueueFull = errors.New("sched: too many requests in flight")
	// ErrStepHung: Shutdown's context ended while a forward step was still
	// running; the scheduler releases its requests when the step returns.
	ErrStepHung = errors.New("sched: shut down while a forward step is still running")
)

// Mode says what a request computes; see the package documentation.
type Mode uint8

const (
	// ModeGenerate prefills the prompt and decodes here (colocated).
	ModeGenerate Mode = iota
	// ModePrefillOnly prefills, samples the first token, exposes the pages
	// and waits for Stream.Handover.
	ModePrefillOnly
	// ModeDecodeImported reserves the prompt's pages, waits for their
	// contents to be imported and Stream.Activate, then decodes.
	ModeDecodeImported
)

func (m Mode) String() string {
	switch m {
	case ModeGenerate:
		return "generate"
	case ModePrefillOnly:
		return "prefill-only"
	case ModeDecodeImported:
		return "decode-imported"
	}
	return fmt.Sprintf("mode(%d)", m)
}

// State is where a request is; see the package documentation.
type State uint8

const (
	StateWaiting      State = iota // queued for pages (ModeDecodeImported: the prealloc queue)
	StatePrefilling                // computing the prompt in chunks
	StateRunning                   // decoding one token per step
	StateTransferring              // ModeDecodeImported: pages reserved, awaiting Activate
	StateHandingOver               // ModePrefillOnly: prompt done, awaiting Handover
	StateFinished                  // released
	numStates
)

// stateNew marks a request submitted but not yet seen by the scheduler.
const stateNew State = 255

func (s State) String() string {
	switch s {
	case StateWaiting:
		return "waiting"
	case StatePrefilling:
		return "prefilling"
	case StateRunning:
		return "running"
	case StateTransferring:
		return "transferring"
	case StateHandingOver:
		return "handing-over"
	case StateFinished:
		return "finished"
	case stateNew:
		return "submitted"
	}
	return fmt.Sprintf("state(%d)", s)
}

// FinishReason says why a request ended.
type FinishReason uint8

const (
	FinishNone       FinishReason = iota
	FinishStop                    // an end-of-generation token, a stop id or a stop string
	FinishLength                  // MaxTokens tokens generated
	FinishContext                 // the context window is full
	FinishHandedOver              // ModePrefillOnly: Stream.Handover was called
	FinishCancelled               // the request's context ended (Err is its cause)
	FinishAborted                 // ErrSlowConsumer or ErrClosed
	FinishError                   // anything else (Err says what)
)

func (f FinishReason) String() string {
	switch f {
	case FinishNone:
		return "none"
	case FinishStop:
		return "stop"
	case FinishLength:
		return "length"
	case FinishContext:
		return "context"
	case FinishHandedOver:
		return "handed_over"
	case FinishCancelled:
		return "cancelled"
	case FinishAborted:
		return "aborted"
	case FinishError:
		return "error"
	}
	return fmt.Sprintf("finish(%d)", f)
}

// Request is what Submit takes.
type Request struct {
	// ID must be unique among requests in flight; "" makes the scheduler
	// pick one ("req-N").
	ID     string
	Mode   Mode
	Prompt []int32
	// MaxTokens is the most tokens to generate (≥ 1); generation also stops
	// when the context window is full. ModePrefillOnly ignores it.
	MaxTokens int
	Params    sample.Params
	// Stop strings end generation (and are not emitted); StopIDs are tokens
	// that do, besides the tokenizer's end-of-generation tokens.
	Stop    []string
	StopIDs []int32
	// IgnoreEOS keeps generating through end-of-generation tokens
	// (benchmarks); under a Constraint it only forbids them until the
	// grammar is finished, which still ends the request.
	IgnoreEOS bool
	// PromptLogprobs asks for the log-probability of every prompt token
	// after the first under the logits after the token before it (natural
	// log, the raw distribution at temperature 1), with Params.TopLogprobs
	// alternatives: Event.PromptLogprobs. ModeDecodeImported ignores it
	// (the prefill worker computed the prompt and reports them).
	PromptLogprobs bool
	// Constraint, when set, restricts every generated token (a grammar's
	// matcher, fresh for this request): see sample.Sampler.Constrain. Its
	// end-of-generation ids are the tokenizer's. It survives preemption,
	// since it only depends on the accepted tokens.
	Constraint sample.Constraint
	// N is the number of continuations (choices) to sample from the
	// prompt; 0 means 1. Choice 0 is the request as it would run alone;
	// choice k > 0 draws with Params.Seed = sample.ChoiceSeed(Seed, k),
	// shares the prompt's full pages with the choice it forks from, copies
	// the partial last page and computes the last prompt position itself
	// (see the package documentation). Every choice's events come on the
	// one Stream, Event.Choice telling them apart. ModeDecodeImported
	// imports the prompt for choice 0 only; the other choices fork from it
	// once it is activated. ModePrefillOnly takes only 1.
	N int
	// Constraints are the fresh matchers of choices 1 … N-1 when
	// Constraint is set (a matcher has state, so each choice needs its
	// own); len(Constraints) must then be N-1.
	Constraints []sample.Constraint
}

// EventKind tells the events of a Stream apart.
type EventKind uint8

const (
	// EventToken carries a generated token and the text it completes.
	EventToken EventKind = iota + 1
	// EventPagesReady (ModePrefillOnly) says that Pages[:Ready] hold the
	// finished keys and values of every layer.
	EventPagesReady
	// EventReserved (ModeDecodeImported) carries the reserved block table
	// that the prompt's keys and values must be imported into.
	EventReserved
	// EventDone is the last event; the channel closes after it.
	EventDone
)

func (k EventKind) String() string {
	switch k {
	case EventToken:
		return "token"
	case EventPagesReady:
		return "pages-ready"
	case EventReserved:
		return "reserved"
	case EventDone:
		return "done"
	}
	return fmt.Sprintf("event(%d)", k)
}

// Event is one message of a Stream.
type Event struct {
	Kind EventKind
	// Choice is the choice (0 … Request.N-1) the event belongs to. Each
	// choice ends with its own EventDone; the channel closes after the
	// last choice's.
	Choice int
	// Token is the sampled token (EventToken).
	Token sample.Token
	// PromptLogprobs (Request.PromptLogprobs): entry i is prompt token
	// i+1, with its log-probability and top alternatives, len(prompt)-1
	// entries. It comes once, on the request's first EventToken, or on its
	// EventDone when it ends without a token (an end-of-generation token
	// first).
	PromptLogprobs []sample.Token
	// Text is the text that became safe to emit: EventToken's delta (""
	// while bytes of a character or a possible stop string are held back,
	// and always "" in ModePrefillOnly), or on EventDone the held-back text
	// released at the end.
	Text string
	// Pages is the request's block table (EventPagesReady, EventReserved);
	// Ready counts its leading pages that are complete (EventPagesReady).
	Pages []kvcache.PageID
	Ready int
	// Held counts, on EventReserved, the leading pages of Pages that
	// already hold the prompt's keys and values because the prefix cache
	// had them: only the pages after them are to be imported, and the held
	// ones, shared with other holders, must not be written.
	Held int
	// Finish, Err and Usage describe the end (EventDone). Err is nil for
	// FinishStop, FinishLength, FinishContext and FinishHandedOver.
	// ModePrefillOnly's EventToken carries Usage too, so that the prompt's
	// cached tokens are known before the handover.
	Finish FinishReason
	Err    error
	Usage  Usage
}

// Usage counts a request's tokens.
type Usage struct {
	PromptTokens     int
	CompletionTokens int // tokens emitted as EventToken
	// Preemptions counts how often the request lost its pages and was
	// recomputed.
	Preemptions int
	// CachedTokens counts the prompt tokens whose keys and values came
	// from the prefix cache instead of being computed (on admission, not
	// counting recomputations after a preemption).
	CachedTokens int
}

// Stream is the caller's end of a submitted request.
type Stream struct {
	s         *Scheduler
	r         *request
	handedOff atomic.Bool
	activated atomic.Bool
}

// ID returns the request's id.
func (st *Stream) ID() string { return st.r.id }

// Events returns the request's events, every choice's; it is closed after
// the last choice's EventDone.
func (st *Stream) Events() <-chan Event { return st.r.events }

// Handover tells a ModePrefillOnly request that its pages have been handed
// over: it is released with FinishHandedOver. Called before the prompt is
// done, it ends the request with an error instead. The caller must have
// stopped reading the pages. The effect is asynchronous; the EventDone
// confirms it.
func (st *Stream) Handover() error {
	if st.r.mode != ModePrefillOnly {
		return fmt.Errorf("sched: Handover on a %s request: %w", st.r.mode, engine.ErrInvalidInput)
	}
	if !st.handedOff.CompareAndSwap(false, true) {
		return fmt.Errorf("sched: Handover called twice for %q: %w", st.r.id, engine.ErrInvalidInput)
	}
	st.s.post(command{kind: cmdHandover, r: st.r})
	return nil
}

// Activate tells a ModeDecodeImported request that its reserved pages hold
// the prompt's keys and values and that prefill sampled first: the request
// emits first as its first token and joins the running batch. Called before
// EventReserved, it ends the request with an error. The effect is
// asynchronous; events follow.
func (st *Stream) Activate(first sample.Token) error {
	if st.r.mode != ModeDecodeImported {
		return fmt.Errorf("sched: Activate on a %s request: %w", st.r.mode, engine.ErrInvalidInput)
	}
	if !st.activated.CompareAndSwap(false, true) {
		return fmt.Errorf("sched: Activate called twice for %q: %w", st.r.id, engine.ErrInvalidInput)
	}
	st.s.post(command{kind: cmdActivate, r: st.r, tok: first})
	return nil
}

// request is the scheduler's record of one request. After Submit hands it
// to the scheduler, only the owning goroutine writes it (under Scheduler.mu,
// so that Snapshot and Audit can read it).
type request struct {
	id     string
	seq    uint64 // arrival order: smaller is older
	mode   Mode
	req    Request
	ctx    context.Context
	stop   func() bool // unregisters the context watch
	events chan Event

	state       State
	table       *kvcache.BlockTable
	tokens      []int32 // prompt, then generated tokens
	nPrompt     int
	computed    int  // positions whose keys and values are in the pages
	activated   bool // ModeDecodeImported: Activate applied
	readyPages  int  // ModePrefillOnly: pages announced complete
	preemptions int
	cached      int // prompt positions attached from the prefix cache

	// starved is set when the last plan left the request out for want of
	// capacity others hold: a running sequence that sat the step out for
	// a page, or a waiting one not admitted (pages or the MaxSeqs slots
	// are taken). The progress watchdog does not count it as stuck.
	starved bool

	// grp links the choices of a Request with N > 1 (nil for N = 1);
	// choice is this one's index in it.
	grp    *group
	choice int

	logits []float32
	plp    *promptLogprobs // Request.PromptLogprobs until they are sent; else nil

	sampler *sample.Sampler
	stopper *sample.Stopper
	dec     *tokenizer.StreamDecoder

	queued, firstToken, lastToken, lastProgress, finished time.Time
}

// group is the choices of one Request with N > 1. They share the events
// channel, which the last one to be released closes, and the prompt's
// pages.
type group struct {
	members []*request // by choice
	live    int        // members not yet released
}

// reservedSlots is the number of event slots kept for EventDones: one per
// choice still live, since each ends with its own.
func (r *request) reservedSlots() int {
	if r.grp == nil {
		return 1
	}
	return r.grp.live
}

// forkPoint is the number of prompt positions a choice > 0 takes from the
// choice it forks from: all but the last, whose logits give the choice its
// own first token.
func (r *request) forkPoint() int { return r.nPrompt - 1 }

// generated is the number of tokens generated so far.
func (r *request) generated() int { return len(r.tokens) - r.nPrompt }

// prefillTarget is the number of positions to compute before decoding: the
// prompt, or after a preemption everything but the last generated token
// (which the next decode step feeds).
func (r *request) prefillTarget() int {
	if r.generated() == 0 {
		return r.nPrompt
	}
	return len(r.tokens) - 1
}

func (r *request) usage() Usage {
	return Usage{PromptTokens: r.nPrompt, CompletionTokens: r.generated(), Preemptions: r.preemptions, CachedTokens: r.cached}
}

// preemptable: only requests whose pages nobody outside reads or writes.
func (r *request) preemptable() bool {
	return r.mode != ModePrefillOnly && (r.state == StateRunning || r.state == StatePrefilling)
}

// Package sched is the continuous-batching scheduler: it admits requests by
// free KV cache pages, runs chunked prefill and decoding of many sequences
// together through model.ForwardBatch one step at a time, preempts when
// pages run out, and releases everything a request holds on every path.
//
// # States
//
// Each request is in exactly one state, and only the scheduler's goroutine
// changes it:
//
//	                   admit (pages)          prompt done
//	Submit ─▶ waiting ─────────────▶ prefilling ──────────▶ running ─▶ finished
//	             ▲  ▲                  │ (chunks under the      │
//	             │  └─── preempt ──────┘  step's token budget)  │
//	             └────────────── preempt (recompute) ───────────┘
//
//	ModePrefillOnly:    waiting ─▶ prefilling ─▶ handing-over ─(Handover)─▶ finished
//	ModeDecodeImported: waiting ─▶ transferring ─(Activate)─▶ running ─▶ finished
//	                    (the prealloc queue)
//
// and from every state a cancelled context, an error, a consumer that stops
// reading, or Close lead to finished. Every resource a request holds — its
// pages, its place in the scheduler's lists, its event channel, the watch
// on its context — is released by one idempotent release(reason), the only
// way into finished.
//
// # Steps
//
// A step (1) applies what callers sent (submissions, cancellations,
// handovers, activations); (2) gives each running sequence, oldest first,
// the page its next token needs, preempting the youngest preemptable
// request (freeing its pages and requeueing it to be recomputed) when none
// is free — or, if that request is not younger than the sequence, letting
// the sequence wait a step with its pages; (3) admits waiting requests first come, first served, while
// their prompt's pages are free and fewer than Config.MaxSeqs requests
// compute; (4) fills the rest of Config.MaxBatchTokens with prompt chunks;
// (5) runs the batch through the model; (6) samples each sequence's next
// token with its own sampler and seeded random source and streams it.
// Recomputation after a preemption reproduces the same tokens: a token's
// arithmetic does not depend on how its sequence was chunked or batched.
//
// A request that could never fit — its prompt plus MaxTokens needs more
// pages than the whole pool — fails at Submit with engine.ErrKVCacheFull;
// every other request eventually runs: a request is only ever preempted in
// favour of an older one, so the oldest always progresses, and requests
// that cannot be preempted (prefilling for a transfer, or holding pages a
// transfer reads or writes) need no pages beyond their reservation.
//
// # Events and slow consumers
//
// Submit returns a Stream whose Events channel carries the request's tokens
// (with text deltas from the tokenizer's StreamDecoder, stop strings held
// back by a sample.Stopper) and ends with one EventDone (finish reason,
// error, usage), after which it is closed. The scheduler never blocks on
// it: the channel has Config.EventBuffer slots, the last one kept for
// EventDone, and a request whose consumer lets the other slots fill up is
// aborted (FinishAborted, ErrSlowConsumer) instead of stalling the batch.
//
// # Prefill/decode handover
//
// The prefill and decode services use two more modes.
//
// ModePrefillOnly computes the prompt and samples the first token. Its pages
// are reserved at admission; as prefill chunks complete pages (every layer's
// keys and values of all their positions), EventPagesReady lists them, so a
// transfer can stream them while later chunks compute. The first token comes
// as an EventToken. The request then waits in handing-over, holding its
// pages for the transfer to read, until the caller calls Stream.Handover
// (finished, FinishHandedOver) or cancels. The caller must stop reading the
// pages before either: release frees them for reuse.
//
// ModeDecodeImported waits in the queue until the pages for its prompt are
// free (decode's prealloc queue), reserves them and sends EventReserved with
// the block table. With the prefix cache on, the leading pages it already
// holds are attached (Event.Held counts them; they are shared and never
// written). The caller writes the prompt's keys and values into the other
// pages (kvcache.Pool.Import or PageBytes) while the request stays in
// transferring, out of every batch, then calls Stream.Activate with the
// first token that prefill sampled; the request joins the running batch and
// streams that token first. Cancelling before Activate frees the pages: the
// caller must stop writing them first (abort the transfer and await its
// acknowledgement, as the TransferKV protocol does).
//
// # Several choices of one prompt
//
// A Request with N > 1 samples N continuations. Each choice is a request of
// its own in every list above (its own id "ID/k", sampler, block table and
// release), linked in a group that shares the Stream's event channel
// (Event.Choice says whose an event is; each choice ends with its own
// EventDone, and the channel closes after the last). Choice 0 runs as the
// request would alone; choice k > 0 draws with sample.ChoiceSeed(Seed, k).
// A choice k > 0 waits, holding nothing and blocking no later request,
// until a choice of its group has computed all but the last prompt
// position; it then forks: a reference to each full page before that
// position, its own copy of the partial page, and a one-token prefill step
// for the last position, whose logits give its own first token. Its output
// is therefore exactly that of a request of its own with its seed. The
// waiting choices fork as soon as choice 0 holds its whole prompt, before
// its first token (which may end it) is taken; when choice 0 ends before
// they could, they compute the prompt themselves (with the prefix cache's
// help where it is on). After a preemption a choice recomputes as any
// request does.
//
// # Observability
//
// Snapshot lists every live request with its state, age, time since last
// progress and pages held. Audit recomputes the used pages and per-state
// counts from the live requests and reports any difference (there must be
// none); it also runs every Config.AuditInterval. An Observer receives the
// gauges the services export (running, queued, prealloc, transfer and
// inflight queues, token usage, generation throughput), per-step and
// per-request statistics (time to first token, inter-token gaps, end-to-end
// latency, aborts by stage and reason) and audit reports; the engine itself
// does not depend on any metrics library.
package sched

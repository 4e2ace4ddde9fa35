package prefill

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/baton-serving/baton/engine/sched"
	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"github.com/baton-serving/baton/kvtransfer"
	"github.com/baton-serving/baton/svckit"
	"github.com/baton-serving/baton/svckit/apiconv"
)

// The two sides a transfer follows while the sender runs: the scheduler's
// events for the request, and decode's messages.

// follow feeds the scheduler's events to the sender until the request ends:
// pages as they complete, then PrefillDone once the first token is drawn
// and the block table known (closing promptDone), or Error when the
// request fails first. The prompt's log-probabilities, when the request
// asked, come with the first token and go in PrefillDone.
func follow(st *sched.Stream, promptTokens int, src *kvtransfer.PoolSource, snd *kvtransfer.Sender, start time.Time, promptDone chan<- struct{}, pt *prefillTrace) {
	var first *batonv1.TokenLogprob
	var cached int
	var promptLogprobs []*batonv1.TokenLogprob
	done := false
	for ev := range st.Events() {
		pt.note(ev)
		switch ev.Kind {
		case sched.EventPagesReady:
			src.SetPages(ev.Pages)
			snd.PagesReady(ev.Ready)
		case sched.EventToken:
			first = apiconv.WireLogprob(ev.Token)
			cached = ev.Usage.CachedTokens
			pt.cachedTokens(cached)
			promptLogprobs = apiconv.WirePromptLogprobs(ev.PromptLogprobs)
		case sched.EventDone:
			if ev.Finish != sched.FinishHandedOver && !done {
				snd.Fail(int32(svckit.Code(ev.Err)), fmt.Sprintf("prefill failed: %v", ev.Err))
			}
		}
		if !done && first != nil && src.Ready() {
			done = true
			close(promptDone)
			snd.Finish(&batonv1.PrefillDone{
				FirstTokenId: first.GetTokenId(), FirstTokenLogprob: first,
				PromptTokens: uint32(promptTokens), CachedTokens: uint32(cached), PrefillSeconds: time.Since(start).Seconds(),
				PromptLogprobs: promptLogprobs,
			})
		}
	}
}

// followDecode hands decode's credits and aborts to the sender until the
// stream ends (msgs closes). An abort makes the sender answer AbortAck and
// stop; the trace keeps decode's reason.
func followDecode(ctx context.Context, log *slog.Logger, msgs <-chan *batonv1.TransferKVRequest, snd *kvtransfer.Sender, pt *prefillTrace) {
	for m := range msgs {
		switch {
		case m.GetCredit() != nil:
			snd.AddCredits(int(m.GetCredit().GetChunks()))
		case m.GetAbort() != nil:
			log.InfoContext(ctx, "transfer aborted by decode", "reason", m.GetAbort().GetReason())
			pt.abortedBy(m.GetAbort().GetReason())
			snd.Abort(m.GetAbort().GetReason())
		}
	}
}

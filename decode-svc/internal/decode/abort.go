package decode

import (
	"time"

	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
)

// abort asks prefill to stop and waits, up to --abort-ack-timeout, for its
// AbortAck or the end of the stream. Chunks still arriving are dropped: the
// caller writes no page after abort returns.
func (s *Service) abort(t *transfer, reason string) {
	_ = t.stream.Send(&batonv1.TransferKVRequest{Msg: &batonv1.TransferKVRequest_Abort{Abort: &batonv1.Abort{Reason: reason}}})
	_ = t.stream.CloseSend()
	deadline := time.NewTimer(s.abortTimeout)
	defer deadline.Stop()
	for {
		select {
		case rm, ok := <-t.msgs:
			if !ok || rm.err != nil || rm.m.GetAbortAck() != nil {
				return
			}
		case <-deadline.C:
			t.log.WarnContext(t.stream.Context(), "prefill did not acknowledge an abort in time; closing the stream", "timeout", s.abortTimeout.String())
			return
		}
	}
}

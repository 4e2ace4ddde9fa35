package prefill

import (
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// TestTransferDeadlineDuringHungStep: a transfer whose prompt is in a
// forward pass that never returns (prefill is frozen) ends at the deadline
// decode's handshake carries, with DEADLINE_EXCEEDED, while the step still
// hangs — not when it returns. The request stays in the load report until
// then; the scheduler releases it and its pages after the step.
func TestTransferDeadlineDuringHungStep(t *testing.T) {
	s, w := startPrefill(t, "--debug-hooks")
	w.Freeze(t)
	stream, _ := transfer(t, w)
	hs := handshake(s, "hung-transfer", 40, 32)
	hs.GetHandshake().Deadline = timestamppb.New(time.Now().Add(500 * time.Millisecond))
	if err := stream.Send(hs); err != nil {
		t.Fatal(err)
	}
	ended := make(chan error, 1)
	go func() { _, err := recvEnd(stream); ended <- err }()
	select {
	case err := <-ended:
		if status.Code(err) != codes.DeadlineExceeded {
			t.Errorf("err = %v, want DEADLINE_EXCEEDED", err)
		}
	case <-time.After(15 * time.Second):
		w.Thaw(t)
		<-ended
		t.Fatal("TransferKV did not return at the handshake's deadline while the step hung")
	}
	if l := w.Load(t); l.GetRunningRequests() != 1 {
		t.Errorf("load while the step still hangs: %v; want the request still held", l)
	}
	w.Thaw(t)
	w.WaitCounter(t, idleBound, 1, "baton_requests_finished_total", "finish", "cancelled")
	w.WaitIdle(t, idleBound)
}

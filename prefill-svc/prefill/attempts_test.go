package prefill

import (
	"sync"
	"testing"
	"time"

	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"github.com/baton-serving/baton/svckit/workerapi/workertest"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// attemptOf marks a handshake as attempt n of the request from origin.
func attemptOf(m *batonv1.TransferKVRequest, origin string, n uint32) *batonv1.TransferKVRequest {
	m.GetHandshake().Origin, m.GetHandshake().Attempt = origin, n
	return m
}

// finishTransfer grants the credit a transfer waits for and receives until
// PrefillDone, then ends the stream: the request is handed over.
func finishTransfer(t *testing.T, stream batonv1.PrefillService_TransferKVClient) {
	t.Helper()
	if err := stream.Send(&batonv1.TransferKVRequest{Msg: &batonv1.TransferKVRequest_Credit{Credit: &batonv1.Credit{Chunks: 64}}}); err != nil {
		t.Fatal(err)
	}
	recvUntil(t, stream, "PrefillDone of the first transfer", func(m *batonv1.TransferKVResponse) bool { return m.GetPrefillDone() != nil })
	_ = stream.CloseSend()
}

// TestOtherRequestKeepsTransfer: a handshake for an id that a live transfer
// holds replaces it only when it is a later attempt of the same request.
// Another request with the same id (another router's client chose it, or a
// tenant copied it from a response), a stale attempt arriving late, the same
// attempt twice, or handshakes naming no origin are refused ALREADY_EXISTS
// as before, and the live transfer goes on untouched.
func TestOtherRequestKeepsTransfer(t *testing.T) {
	s, w := startPrefill(t)
	for i, c := range []struct {
		name         string
		liveOrigin   string
		liveAttempt  uint32
		otherOrigin  string
		otherAttempt uint32
	}{
		{"another router", "router-a/7", 1, "router-b/7", 2},
		{"an older attempt", "router-a/7", 2, "router-a/7", 1},
		{"the same attempt", "router-a/7", 1, "router-a/7", 1},
		{"no origin", "", 1, "", 2},
	} {
		live, _ := transfer(t, w)
		if err := live.Send(attemptOf(handshake(s, "shared", 80, 1), c.liveOrigin, c.liveAttempt)); err != nil {
			t.Fatal(err)
		}
		recvUntil(t, live, "the first chunk", isChunk)
		other, _ := transfer(t, w)
		if err := other.Send(attemptOf(handshake(s, "shared", 80, 32), c.otherOrigin, c.otherAttempt)); err != nil {
			t.Fatal(err)
		}
		if _, err := recvEnd(other); status.Code(err) != codes.AlreadyExists {
			t.Errorf("%s: the second handshake got %v, want ALREADY_EXISTS", c.name, err)
		}
		finishTransfer(t, live)
		w.WaitCounter(t, idleBound, float64(i+1), "baton_requests_finished_total", "finish", "handed_over")
		w.WaitIdle(t, idleBound)
	}
}

// holdInStep starts a transfer of id (origin, attempt 1) on a frozen
// worker, whose request stays in the step the freeze holds.
func holdInStep(t *testing.T, s *Service, w *workertest.Worker, id, origin string) batonv1.PrefillService_TransferKVClient {
	t.Helper()
	w.Freeze(t)
	stream, _ := transfer(t, w)
	if err := stream.Send(attemptOf(handshake(s, id, 80, 1), origin, 1)); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(idleBound); w.Load(t).GetRunningRequests() == 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the request did not reach the frozen step within %v", idleBound)
		}
	}
	return stream
}

// TestRetryWhileStaleHeldByStep: the stale attempt's request is in a
// forward step that outlives the replacement's grace (a long step, a stuck
// kernel), so the scheduler still holds its id. The retry is refused
// UNAVAILABLE — the router may try another pair, and the client gets 503 at
// worst — never ALREADY_EXISTS, which reaches the client as 409.
func TestRetryWhileStaleHeldByStep(t *testing.T) {
	s, w := startPrefill(t, "--debug-hooks")
	old := holdInStep(t, s, w, "held", "router-a/3")
	retry, _ := transfer(t, w)
	if err := retry.Send(attemptOf(handshake(s, "held", 80, 32), "router-a/3", 2)); err != nil {
		t.Fatal(err)
	}
	_, err := recvEnd(retry)
	if status.Code(err) != codes.Unavailable {
		t.Errorf("the retry got %v, want UNAVAILABLE (the id is still held by the previous attempt's step)", err)
	}
	if _, err := recvEnd(old); status.Code(err) != codes.Aborted {
		t.Errorf("the stale transfer ended with %v, want ABORTED (replaced by a newer attempt)", err)
	}
	w.Thaw(t)
	w.WaitCounter(t, idleBound, 1, "baton_requests_finished_total", "finish", "cancelled")
	w.WaitIdle(t, idleBound)
}

// TestSchedulerFailureStatus: a request the scheduler ends with an error
// mid-transfer (here: it shuts down) is reported to decode as an Error
// message with the failure's code, and the stream's status has the same
// code — not CANCELED, which the handler's own cancel used to turn every
// such end into.
func TestSchedulerFailureStatus(t *testing.T) {
	s, w := startPrefill(t, "--debug-hooks")
	stream := holdInStep(t, s, w, "closed-under", "")
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = s.Host.Sched.Close() }()
	defer wg.Wait()
	time.Sleep(50 * time.Millisecond) // the close is posted while the step is held
	w.Thaw(t)
	last, err := recvEnd(stream)
	if last.GetError() == nil || codes.Code(last.GetError().GetCode()) != codes.Unavailable {
		t.Errorf("the last message: %v, want an Error with code UNAVAILABLE", last)
	}
	if status.Code(err) != codes.Unavailable {
		t.Errorf("the stream ended with %v, want UNAVAILABLE (the scheduler closed)", err)
	}
	wg.Wait()
	w.WaitIdle(t, idleBound)
}

package prefill

import (
	"context"
	"errors"
	"io"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/baton-serving/baton/engine/kvcache"
	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"github.com/baton-serving/baton/kvtransfer"
	"github.com/baton-serving/baton/svckit/workerapi/workertest"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The tests here run a real prefill worker in this process and play the
// decode worker's side of TransferKV by hand, so that they can stop at any
// message: a handshake that never comes or is wrong, credits withheld, an
// abort or a vanished decode in the middle of the chunks or around
// PrefillDone. After each, the worker must hold no KV page and no request
// within idleBound (goroutines are checked by TestMain). The transfers that
// go well, and decode's side of each stage, are tested with a real decode
// worker beside decode-svc's package.

const idleBound = 5 * time.Second

// startPrefill runs a prefill worker on the test model with flags added.
func startPrefill(t *testing.T, flags ...string) (*Service, *workertest.Worker) {
	t.Helper()
	svc := New()
	w := workertest.Start(t, "prefill-svc", svc, append([]string{"--model", workertest.Model(t), "--threads", "1",
		"--kv-cache-bytes", strconv.Itoa(1 << 20), "--max-batch-tokens", "16"}, flags...)...)
	return svc, w
}

// transfer opens a TransferKV stream that ends with the test.
func transfer(t *testing.T, w *workertest.Worker) (batonv1.PrefillService_TransferKVClient, context.CancelFunc) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	stream, err := batonv1.NewPrefillServiceClient(w.Conn).TransferKV(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return stream, cancel
}

// handshake is what decode would send for a prompt of n tokens.
func handshake(s *Service, id string, n, credits int) *batonv1.TransferKVRequest {
	ids := make([]uint32, n)
	for i := range ids {
		ids[i] = uint32(3 + i%250)
	}
	temp := float32(0)
	return &batonv1.TransferKVRequest{Msg: &batonv1.TransferKVRequest_Handshake{Handshake: &batonv1.Handshake{
		RequestId: id, PromptTokenIds: ids, Sampling: &batonv1.SamplingParams{Temperature: &temp},
		ModelFingerprint: s.Host.Fingerprint, KvLayout: kvtransfer.LayoutProto(s.Host.Layout),
		PagesReserved: uint32(s.Host.Layout.PagesFor(n)), InitialCredits: uint32(credits), HeartbeatMs: 50,
	}}}
}

// recvUntil receives until a message of the kind want reports true.
func recvUntil(t *testing.T, stream batonv1.PrefillService_TransferKVClient, what string, want func(*batonv1.TransferKVResponse) bool) {
	t.Helper()
	for {
		m, err := stream.Recv()
		if err != nil {
			t.Fatalf("waiting for %s: %v", what, err)
		}
		if want(m) {
			return
		}
	}
}

// recvEnd receives until the stream ends and returns how.
func recvEnd(stream batonv1.PrefillService_TransferKVClient) (*batonv1.TransferKVResponse, error) {
	var last *batonv1.TransferKVResponse
	for {
		m, err := stream.Recv()
		if err != nil {
			return last, err
		}
		last = m
	}
}

func isChunk(m *batonv1.TransferKVResponse) bool { return m.GetKvChunk() != nil }

// midTransfer starts a prefill worker with flags and a transfer of an
// 80-token prompt with one credit, and returns once the first chunk came:
// the other chunks wait for credit.
func midTransfer(t *testing.T, id string, flags ...string) (*workertest.Worker, batonv1.PrefillService_TransferKVClient, context.CancelFunc) {
	t.Helper()
	s, w := startPrefill(t, flags...)
	stream, cancel := transfer(t, w)
	if err := stream.Send(handshake(s, id, 80, 1)); err != nil {
		t.Fatal(err)
	}
	recvUntil(t, stream, "the first chunk", isChunk)
	return w, stream, cancel
}

// TestNoHandshake: a stream that sends nothing is ended after prefill's
// --handshake-timeout.
func TestNoHandshake(t *testing.T) {
	_, w := startPrefill(t, "--handshake-timeout", "200ms")
	stream, _ := transfer(t, w)
	_, err := recvEnd(stream)
	if st := status.Convert(err); st.Code() != codes.DeadlineExceeded || st.Message() != "no handshake within 200ms" {
		t.Fatalf("err = %v, want DEADLINE_EXCEEDED no handshake within 200ms", err)
	}
	w.WaitIdle(t, idleBound)
}

// TestBadHandshake: a first message that is no handshake, or a handshake
// for another model, is refused before anything is reserved.
func TestBadHandshake(t *testing.T) {
	s, w := startPrefill(t)
	other := handshake(s, "other-model", 20, 4)
	other.GetHandshake().ModelFingerprint = "sha256:other"
	// Pages decode claims to hold: not the prompt's own, or the page of
	// its last token, which prefill must send.
	notOwn := handshake(s, "not-own-page", 40, 4)
	notOwn.GetHandshake().CachedPageHashes = append(heldHashes(s, notOwn.GetHandshake(), 1), 12345)
	lastPage := handshake(s, "last-page", 32, 4)
	lastPage.GetHandshake().CachedPageHashes = heldHashes(s, lastPage.GetHandshake(), 2)
	for _, c := range []struct {
		name string
		msg  *batonv1.TransferKVRequest
		code codes.Code
		want string
	}{
		{"credit first", &batonv1.TransferKVRequest{Msg: &batonv1.TransferKVRequest_Credit{Credit: &batonv1.Credit{Chunks: 1}}}, codes.InvalidArgument, "handshake"},
		{"other model", other, codes.FailedPrecondition, "model_fingerprint"},
		{"hash of another page", notOwn, codes.InvalidArgument, "cached_page_hashes[1]: 0000000000003039 is not the key of the prompt's page 1"},
		{"the last token's page held", lastPage, codes.InvalidArgument, "cached_page_hashes: 2 pages of a 32-token prompt, at most 1"},
	} {
		stream, _ := transfer(t, w)
		if err := stream.Send(c.msg); err != nil {
			t.Fatal(err)
		}
		if _, err := recvEnd(stream); status.Code(err) != c.code || !strings.Contains(status.Convert(err).Message(), c.want) {
			t.Errorf("%s: %v, want %v naming %q", c.name, err, c.code, c.want)
		}
	}
	w.WaitIdle(t, idleBound)
}

// TestAbortMidTransfer: decode aborts after the first chunk while the rest
// wait for credit (window 1); prefill acknowledges and releases the pages.
func TestAbortMidTransfer(t *testing.T) {
	w, stream, _ := midTransfer(t, "abort")
	if err := stream.Send(&batonv1.TransferKVRequest{Msg: &batonv1.TransferKVRequest_Abort{Abort: &batonv1.Abort{Reason: "test"}}}); err != nil {
		t.Fatal(err)
	}
	recvUntil(t, stream, "AbortAck", func(m *batonv1.TransferKVResponse) bool { return m.GetAbortAck().GetReason() == "test" })
	if _, err := recvEnd(stream); !errors.Is(err, io.EOF) {
		t.Errorf("after AbortAck: %v, want the stream's end", err)
	}
	w.WaitCounter(t, idleBound, 1, "baton_requests_finished_total", "finish", "cancelled")
	w.WaitIdle(t, idleBound)
}

// TestCreditStall: decode grants no credit after the first chunk; prefill
// gives up after its --transfer-idle-timeout and releases the pages.
func TestCreditStall(t *testing.T) {
	w, stream, _ := midTransfer(t, "stall", "--transfer-idle-timeout", "300ms")
	if _, err := recvEnd(stream); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("err = %v, want DEADLINE_EXCEEDED", err)
	}
	w.WaitIdle(t, idleBound)
}

// TestDecodeGoneMidTransfer: decode's stream goes away after the first
// chunk, without an abort; prefill releases the pages.
func TestDecodeGoneMidTransfer(t *testing.T) {
	w, _, cancel := midTransfer(t, "gone")
	cancel()
	w.WaitCounter(t, idleBound, 1, "baton_requests_finished_total", "finish", "cancelled")
	w.WaitIdle(t, idleBound)
}

// TestHandover: the handover ends the request at prefill however decode
// behaves around PrefillDone: gone at once after it, or aborting too late
// (after PrefillDone the abort changes nothing).
func TestHandover(t *testing.T) {
	s, w := startPrefill(t)
	for i, after := range []func(batonv1.PrefillService_TransferKVClient, context.CancelFunc){
		func(_ batonv1.PrefillService_TransferKVClient, cancel context.CancelFunc) { cancel() },
		func(stream batonv1.PrefillService_TransferKVClient, _ context.CancelFunc) {
			_ = stream.Send(&batonv1.TransferKVRequest{Msg: &batonv1.TransferKVRequest_Abort{Abort: &batonv1.Abort{Reason: "late"}}})
			_ = stream.CloseSend()
		},
	} {
		stream, cancel := transfer(t, w)
		if err := stream.Send(handshake(s, "handover-"+strconv.Itoa(i), 40, 32)); err != nil {
			t.Fatal(err)
		}
		recvUntil(t, stream, "PrefillDone", func(m *batonv1.TransferKVResponse) bool { return m.GetPrefillDone() != nil })
		after(stream, cancel)
		w.WaitCounter(t, idleBound, float64(i+1), "baton_requests_finished_total", "finish", "handed_over")
		w.WaitIdle(t, idleBound)
	}
}

// TestRetryReplacesStaleTransfer: the router's retry of a request can reach
// this prefill worker again (through another decode worker) while the failed
// attempt's transfer still holds the id here, its decode silent (gone
// without a close, or partitioned). The newer handshake replaces the stale
// transfer, which is released, instead of being refused ALREADY_EXISTS
// (which reached the client as 409).
func TestRetryReplacesStaleTransfer(t *testing.T) {
	s, w := startPrefill(t)
	old, _ := transfer(t, w)
	if err := old.Send(attemptOf(handshake(s, "retried", 80, 1), "router-a/1", 1)); err != nil {
		t.Fatal(err)
	}
	recvUntil(t, old, "the first chunk", isChunk)
	// The old attempt's decode says nothing more; the retry arrives.
	retry, _ := transfer(t, w)
	if err := retry.Send(attemptOf(handshake(s, "retried", 80, 32), "router-a/1", 2)); err != nil {
		t.Fatal(err)
	}
	for {
		m, err := retry.Recv()
		if err != nil {
			t.Fatalf("the retry's transfer: %v, want PrefillDone", err)
		}
		if m.GetPrefillDone() != nil {
			break
		}
	}
	if _, err := recvEnd(old); status.Code(err) != codes.Aborted {
		t.Errorf("the stale transfer ended with %v, want ABORTED (replaced by a newer attempt)", err)
	}
	_ = retry.CloseSend()
	w.WaitCounter(t, idleBound, 1, "baton_requests_finished_total", "finish", "handed_over")
	w.WaitIdle(t, idleBound)
}

// heldHashes are the keys of the first n pages of hs's prompt, as a decode
// worker holding them names them.
func heldHashes(s *Service, hs *batonv1.Handshake, n int) []uint64 {
	tokens := make([]int32, len(hs.GetPromptTokenIds()))
	for i, id := range hs.GetPromptTokenIds() {
		tokens[i] = int32(id)
	}
	var out []uint64
	for _, h := range kvcache.PageHashes(kvcache.PrefixSeed(s.Host.Fingerprint, s.Host.Layout.String()), tokens, s.Host.Layout.PageSize, n) {
		out = append(out, uint64(h))
	}
	return out
}

// TestHeldPagesNotSent: prefill accepts a handshake naming the prompt's
// first pages, says it skips them, sends from the next page on, and its
// PrefillDone counts only what it sent.
func TestHeldPagesNotSent(t *testing.T) {
	s, w := startPrefill(t)
	ps := s.Host.Layout.PageSize
	n := 3*ps + 5
	msg := handshake(s, "held", n, 64)
	msg.GetHandshake().CachedPageHashes = heldHashes(s, msg.GetHandshake(), 2)
	stream, _ := transfer(t, w)
	if err := stream.Send(msg); err != nil {
		t.Fatal(err)
	}
	var first *batonv1.KVChunk
	var skipped uint32 = 99
	var bytes uint64
	for {
		m, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if a := m.GetAccepted(); a != nil {
			skipped = a.GetSkippedPages()
		}
		if c := m.GetKvChunk(); c != nil {
			if first == nil {
				first = c
			}
			bytes += uint64(len(c.GetK()) + len(c.GetV()))
		}
		if d := m.GetPrefillDone(); d != nil {
			if d.GetBytesSent() != bytes {
				t.Errorf("PrefillDone reports %d bytes, %d came", d.GetBytesSent(), bytes)
			}
			break
		}
	}
	_ = stream.CloseSend()
	if skipped != 2 || first.GetPageIndex() != 2 {
		t.Fatalf("skipped_pages %d, first chunk for page %d; want 2 and 2", skipped, first.GetPageIndex())
	}
	if want := uint64(2 * (n - 2*ps) * s.Host.Layout.Layers * s.Host.Layout.RowBytes()); bytes != want {
		t.Errorf("%d bytes sent, want %d (pages 2 and 3 only)", bytes, want)
	}
	w.WaitIdle(t, idleBound)
}

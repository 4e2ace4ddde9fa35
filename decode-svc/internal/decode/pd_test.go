package decode

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"github.com/baton-serving/baton/prefill-svc/prefill"
	"github.com/baton-serving/baton/svckit/workerapi/workertest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
)

// The tests here run a real prefill worker and a real decode worker in this
// process, connected over memory, on a tiny generated model. Each cancels a
// request at one stage of its life and then checks that both workers hold no
// KV page and no request within idleBound (goroutines are checked by
// TestMain).

// idleBound is how long a worker may take to release everything after a
// request ended: a step boundary, an abort acknowledgement.
const idleBound = 5 * time.Second

// pageBytes is the size of one KV page of workertest.ModelSpec with the
// default --page-size 16 and --kv-dtype f16: 16 tokens × 2 layers × (K and
// V) × 2 KV heads × 8 dimensions × 2 bytes.
const pageBytes = 16 * 2 * 2 * 2 * 8 * 2

// pd is one prefill worker and one decode worker that pulls from it.
type pd struct {
	prefill, decode *workertest.Worker
	client          batonv1.DecodeServiceClient
}

// common are the flags both workers get: one thread (the machine is
// shared) and a small page pool.
func common(model string) []string {
	return []string{"--model", model, "--threads", "1", "--kv-cache-bytes", strconv.Itoa(512 * pageBytes)}
}

// startPD starts the pair; the flags are added to common's (a later flag
// wins). extra names in-memory listeners decode may dial besides prefill.
func startPD(t *testing.T, prefillFlags, decodeFlags []string, extra map[string]*bufconn.Listener) *pd {
	t.Helper()
	model := workertest.Model(t)
	p := workertest.Start(t, "prefill-svc", prefill.New(), append(common(model), prefillFlags...)...)
	dec := New()
	dec.dialOpts = []grpc.DialOption{workertest.Dialer([]*workertest.Worker{p}, extra)}
	d := workertest.Start(t, "decode-svc", dec, append(common(model), decodeFlags...)...)
	return &pd{prefill: p, decode: d, client: batonv1.NewDecodeServiceClient(d.Conn)}
}

// waitIdle checks that neither worker holds anything any more.
func (p *pd) waitIdle(t *testing.T) {
	t.Helper()
	p.decode.WaitIdle(t, idleBound)
	p.prefill.WaitIdle(t, idleBound)
}

// prompt is n token ids of the test model's vocabulary.
func prompt(n int) []uint32 {
	ids := make([]uint32, n)
	for i := range ids {
		ids[i] = uint32(3 + (i*37)%250)
	}
	return ids
}

func request(id string, promptTokens, maxNew int, endpoint string) *batonv1.DecodeServiceGenerateRequest {
	temp, seed := float32(0.8), uint64(42)
	return &batonv1.DecodeServiceGenerateRequest{
		Request: &batonv1.GenerateRequest{RequestId: id, PromptTokenIds: prompt(promptTokens), Sampling: &batonv1.SamplingParams{
			Temperature: &temp, Seed: &seed, MaxNewTokens: uint32(maxNew), IgnoreEos: true, Logprobs: true, TopLogprobs: 2,
		}},
		PrefillEndpoint: endpoint,
	}
}

// output is what a Generate stream delivered.
type output struct {
	tokens   []uint32
	logprobs []*batonv1.TokenLogprob
	finish   batonv1.FinishReason
}

// call is a Generate in progress.
type call struct {
	stream batonv1.DecodeService_GenerateClient
	cancel context.CancelFunc
}

func (p *pd) start(t *testing.T, in *batonv1.DecodeServiceGenerateRequest) *call {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	stream, err := p.client.Generate(ctx, in)
	if err != nil {
		t.Fatal(err)
	}
	// The first event echoes the prompt: the request is submitted.
	if ev, err := stream.Recv(); err != nil || len(ev.GetEvent().GetPromptTokenIds()) == 0 {
		t.Fatalf("first event = %v, %v; want the prompt", ev, err)
	}
	return &call{stream: stream, cancel: cancel}
}

// rest reads the stream to its end.
func (c *call) rest() (output, error) {
	var out output
	for {
		resp, err := c.stream.Recv()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		ev := resp.GetEvent()
		out.tokens = append(out.tokens, ev.GetTokenIds()...)
		out.logprobs = append(out.logprobs, ev.GetLogprobs()...)
		if ev.GetFinishReason() != batonv1.FinishReason_FINISH_REASON_UNSPECIFIED {
			out.finish = ev.GetFinishReason()
		}
	}
}

// waitLoad polls w's load report until ok holds.
func waitLoad(t *testing.T, w *workertest.Worker, what string, ok func(*batonv1.LoadReport) bool) {
	t.Helper()
	deadline := time.Now().Add(idleBound)
	for {
		l := w.Load(t)
		if ok(l) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: never %s; load %v", w.Server.Name, what, l)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

const aborts = "baton_request_aborts_total"

// TestPDMatchesColocated: a request pulled from prefill generates exactly
// what the decode worker generates computing the prompt itself, logprobs
// included, and both workers end idle.
func TestPDMatchesColocated(t *testing.T) {
	p := startPD(t, []string{"--max-batch-tokens", "16"}, []string{"--credit-window", "1"}, nil)
	local, err := p.start(t, request("local-1", 50, 40, localPrefill)).rest()
	if err != nil {
		t.Fatal(err)
	}
	remote, err := p.start(t, request("pd-1", 50, 40, p.prefill.Addr())).rest()
	if err != nil {
		t.Fatal(err)
	}
	if len(local.tokens) != 40 || local.finish != batonv1.FinishReason_FINISH_REASON_LENGTH {
		t.Fatalf("colocated: %d tokens, finish %v; want 40, LENGTH", len(local.tokens), local.finish)
	}
	if fmt.Sprint(remote.tokens) != fmt.Sprint(local.tokens) || remote.finish != local.finish {
		t.Fatalf("PD output differs from colocated:\n pd:    %v %v\n local: %v %v", remote.tokens, remote.finish, local.tokens, local.finish)
	}
	for i := range local.logprobs {
		l, r := local.logprobs[i], remote.logprobs[i]
		if l.GetTokenId() != r.GetTokenId() || len(l.GetTopLogprobs()) != 2 || len(r.GetTopLogprobs()) != 2 ||
			l.GetTopLogprobs()[1].GetTokenId() != r.GetTopLogprobs()[1].GetTokenId() || diff(l.GetLogprob(), r.GetLogprob()) > 1e-4 {
			t.Fatalf("logprob %d: pd %v, colocated %v", i, r, l)
		}
	}
	if got := p.prefill.Counter(t, "baton_requests_finished_total", "finish", "handed_over"); got != 1 {
		t.Errorf("prefill handed over %v requests, want 1", got)
	}
	p.waitIdle(t)
}

func diff(a, b float32) float32 {
	if a > b {
		return a - b
	}
	return b - a
}

// TestCancelInPreallocWait: a request waiting for decode's pages (the pool
// is held by a request whose prefill is frozen) is cancelled by its client;
// it leaves the prealloc queue without pages, and the request ahead of it
// still completes once prefill thaws.
func TestCancelInPreallocWait(t *testing.T) {
	p := startPD(t, []string{"--debug-hooks"}, []string{"--kv-cache-bytes", strconv.Itoa(8 * pageBytes)}, nil)
	if n := p.decode.Load(t).GetPagesTotal(); n != 8 {
		t.Fatalf("decode has %d pages, want 8", n)
	}
	p.prefill.Freeze(t)
	ahead := p.start(t, request("ahead", 100, 20, p.prefill.Addr())) // 7 of the 8 pages
	waitLoad(t, p.decode, "transferring", func(l *batonv1.LoadReport) bool { return l.GetTransferringRequests() == 1 })
	waiting := p.start(t, request("waiting", 40, 10, p.prefill.Addr())) // needs 3
	waitLoad(t, p.decode, "queueing the second request", func(l *batonv1.LoadReport) bool { return l.GetQueuedRequests() == 1 })
	waiting.cancel()
	if _, err := waiting.rest(); status.Code(err) != codes.Canceled {
		t.Fatalf("cancelled request: %v, want CANCELED", err)
	}
	p.decode.WaitCounter(t, idleBound, 1, aborts, "stage", "waiting", "reason", "cancelled")
	waitLoad(t, p.decode, "back to the first request alone", func(l *batonv1.LoadReport) bool {
		return l.GetQueuedRequests() == 0 && l.GetPagesUsed() == 7
	})
	p.prefill.Thaw(t)
	out, err := ahead.rest()
	if err != nil || len(out.tokens) != 20 {
		t.Fatalf("request ahead: %d tokens, %v; want 20", len(out.tokens), err)
	}
	p.waitIdle(t)
}

// silentPeer accepts connections and never answers: a prefill worker that
// is up at the transport level and hung above it.
func silentPeer(t *testing.T) *bufconn.Listener {
	lis := bufconn.Listen(1 << 16)
	var mu sync.Mutex
	var conns []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		lis.Close()
		<-done
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return lis
}

// TestHandshakeTimeout: a prefill worker that never answers holds a request
// for decode's --handshake-timeout, no longer; the reserved pages return.
func TestHandshakeTimeout(t *testing.T) {
	const hung = "127.0.0.1:1"
	p := startPD(t, nil, []string{"--handshake-timeout", "300ms"}, map[string]*bufconn.Listener{hung: silentPeer(t)})
	start := time.Now()
	_, err := p.start(t, request("hung", 20, 5, hung)).rest()
	want := "prefill 127.0.0.1:1 did not accept the transfer within 300ms"
	if st := status.Convert(err); st.Code() != codes.DeadlineExceeded || st.Message() != want {
		t.Fatalf("err = %v, want DEADLINE_EXCEEDED %q", err, want)
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("the handshake timeout took %v", took)
	}
	p.decode.WaitCounter(t, idleBound, 1, aborts, "stage", "transferring", "reason", "cancelled")
	p.waitIdle(t)
}

// TestCancelDuringTransfer: the client cancels while decode has reserved
// the pages and prefill accepted the transfer but has not finished the
// prompt (it is frozen); decode aborts the transfer, prefill acknowledges,
// (or sees the stream end), and each side releases its pages (prefill at
// its next step boundary).
func TestCancelDuringTransfer(t *testing.T) {
	p := startPD(t, []string{"--debug-hooks"}, []string{"--credit-window", "1"}, nil)
	p.prefill.Freeze(t)
	c := p.start(t, request("transfer", 60, 20, p.prefill.Addr()))
	waitLoad(t, p.decode, "transferring", func(l *batonv1.LoadReport) bool { return l.GetTransferringRequests() == 1 })
	waitLoad(t, p.prefill, "computing", func(l *batonv1.LoadReport) bool { return l.GetRunningRequests() == 1 })
	c.cancel()
	if _, err := c.rest(); status.Code(err) != codes.Canceled {
		t.Fatalf("err = %v, want CANCELED", err)
	}
	p.decode.WaitCounter(t, idleBound, 1, aborts, "stage", "transferring", "reason", "cancelled")
	p.decode.WaitIdle(t, idleBound)
	p.prefill.Thaw(t)
	// The frozen step completes the prompt: prefill releases the request,
	// cancelled, from whichever stage that step left it in.
	p.prefill.WaitCounter(t, idleBound, 1, "baton_requests_finished_total", "finish", "cancelled")
	p.waitIdle(t)
}

// TestCancelWhileRunning: the client cancels after the first token while
// the request decodes (decode's forward pass is frozen, so it cannot finish
// first); decode releases it as cancelled, not as finished.
func TestCancelWhileRunning(t *testing.T) {
	p := startPD(t, nil, []string{"--debug-hooks"}, nil)
	p.decode.Freeze(t) // the first token comes from prefill; the second needs a forward pass
	c := p.start(t, request("running", 20, 50, p.prefill.Addr()))
	resp, err := c.stream.Recv()
	if err != nil || len(resp.GetEvent().GetTokenIds()) != 1 {
		t.Fatalf("first token event = %v, %v", resp, err)
	}
	c.cancel()
	if _, err := c.rest(); status.Code(err) != codes.Canceled {
		t.Fatalf("err = %v, want CANCELED", err)
	}
	p.decode.Thaw(t)
	p.decode.WaitCounter(t, idleBound, 1, aborts, "stage", "running", "reason", "cancelled")
	if n := p.decode.Counter(t, "baton_requests_finished_total", "finish", "length"); n != 0 {
		t.Errorf("%v requests finished by length; the cancelled one must not", n)
	}
	p.waitIdle(t)
}

// TestFirstTokenTimeout: a request whose prompt never finishes at prefill
// (frozen) ends at decode's --first-token-timeout with DEADLINE_EXCEEDED,
// and both workers release it. The handshake passes the same deadline to
// prefill, so either side may be first to say so.
func TestFirstTokenTimeout(t *testing.T) {
	p := startPD(t, []string{"--debug-hooks"}, []string{"--first-token-timeout", "300ms"}, nil)
	p.prefill.Freeze(t)
	_, err := p.start(t, request("slow", 20, 5, p.prefill.Addr())).rest()
	st := status.Convert(err)
	decodeSays, prefillSays := "no first token within --first-token-timeout 300ms", "prefill "+p.prefill.Addr()+": context deadline exceeded"
	if st.Code() != codes.DeadlineExceeded || (st.Message() != decodeSays && st.Message() != prefillSays) {
		t.Fatalf("err = %v, want DEADLINE_EXCEEDED %q or %q", err, decodeSays, prefillSays)
	}
	p.decode.WaitIdle(t, idleBound)
	p.prefill.Thaw(t)
	p.waitIdle(t)
}

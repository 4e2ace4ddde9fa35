package kvtransfer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"github.com/baton-serving/baton/kernels"
	"github.com/baton-serving/baton/kernels/quant"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var testLayout = kernels.KVLayout{DType: quant.F16, PageSize: 16, Layers: 5, KVHeads: 4, HeadDim: 8}

// patternPages is a PageSource whose byte at each position is a function of
// (kind, page, layer, token, offset), so a receiver can verify every byte.
type patternPages struct{ layout kernels.KVLayout }

func patternByte(kind, p, layer, tok, off int) byte {
	return byte(kind*131 + p*31 + layer*17 + tok*7 + off)
}

func (s patternPages) CopyPage(p, lo, hi, tokens int, k, v []byte) error {
	tb := s.layout.RowBytes()
	i := 0
	for l := lo; l < hi; l++ {
		for t := range tokens {
			for o := range tb {
				k[i] = patternByte(0, p, l, t, o)
				v[i] = patternByte(1, p, l, t, o)
				i++
			}
		}
	}
	return nil
}

// checkSink verifies what it receives against the pattern and counts it.
type checkSink struct {
	layout kernels.KVLayout
	mu     sync.Mutex
	seen   map[[2]int]bool // (page, layer) received
	err    error
}

func (s *checkSink) WritePage(p, lo, hi, tokens int, k, v []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	tb := s.layout.RowBytes()
	i := 0
	for l := lo; l < hi; l++ {
		if s.seen[[2]int{p, l}] {
			return fmt.Errorf("page %d layer %d twice", p, l)
		}
		s.seen[[2]int{p, l}] = true
		for t := range tokens {
			for o := range tb {
				if k[i] != patternByte(0, p, l, t, o) || v[i] != patternByte(1, p, l, t, o) {
					return fmt.Errorf("page %d layer %d token %d byte %d corrupted", p, l, t, o)
				}
				i++
			}
		}
	}
	return nil
}

// server is a PrefillService whose TransferKV streams pattern pages, making
// pages ready progressively as a prefill scheduler would.
type server struct {
	batonv1.UnimplementedPrefillServiceServer
	maxChunk  int
	stepDelay time.Duration
	// skipHeld: skip the pages the handshake says decode holds, as a
	// prefill that knows cached_page_hashes does (else send every page).
	skipHeld bool
	runErr   chan error
}

func (s *server) TransferKV(stream batonv1.PrefillService_TransferKVServer) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	hs := first.GetHandshake()
	layout, err := LayoutFromProto(hs.GetKvLayout())
	if err != nil {
		return err
	}
	prompt := len(hs.GetPromptTokenIds())
	skip := 0
	if s.skipHeld {
		skip = len(hs.GetCachedPageHashes())
		if err := stream.Send(&batonv1.TransferKVResponse{Msg: &batonv1.TransferKVResponse_Accepted{Accepted: &batonv1.Accepted{SkippedPages: uint32(skip)}}}); err != nil {
			return err
		}
	}
	snd := NewSender(SenderConfig{Layout: layout, PromptTokens: prompt, InitialCredits: int(hs.GetInitialCredits()), MaxChunkBytes: s.maxChunk, FirstPage: skip},
		patternPages{layout}, stream)
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { // the stream's receive loop: credits and aborts
		defer wg.Done()
		for {
			m, err := stream.Recv()
			if err != nil {
				cancel()
				return
			}
			switch {
			case m.GetCredit() != nil:
				snd.AddCredits(int(m.GetCredit().GetChunks()))
			case m.GetAbort() != nil:
				snd.Abort(m.GetAbort().GetReason())
			}
		}
	}()
	go func() { // the "scheduler": pages complete one by one
		defer wg.Done()
		pages := layout.PagesFor(prompt)
		for p := 1; p < pages; p++ {
			select {
			case <-ctx.Done():
				return
			case <-time.After(s.stepDelay):
			}
			snd.PagesReady(p)
		}
		snd.Finish(&batonv1.PrefillDone{FirstTokenId: 42, PromptTokens: uint32(prompt)})
	}()
	err = snd.Run(ctx)
	cancel()
	s.runErr <- err
	if errors.Is(err, ErrAborted) {
		err = nil
	}
	// The handler returning ends the stream, which ends the receive loop.
	go wg.Wait()
	return err
}

func startServer(t *testing.T, s *server) batonv1.PrefillServiceClient {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	batonv1.RegisterPrefillServiceServer(gs, s)
	go gs.Serve(lis)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(); gs.Stop() })
	return batonv1.NewPrefillServiceClient(conn)
}

// receive runs the decode end: handshake, chunks into the sink, credits,
// until PrefillDone. abortAfter > 0 aborts after that many chunks.
func receive(ctx context.Context, c batonv1.PrefillServiceClient, layout kernels.KVLayout, prompt, window, abortAfter int, sink PageSink) (*Receiver, *batonv1.TransferKVResponse, error) {
	return receiveHolding(ctx, c, layout, prompt, window, abortAfter, 0, sink)
}

// receiveHolding is receive when decode holds the first held pages.
func receiveHolding(ctx context.Context, c batonv1.PrefillServiceClient, layout kernels.KVLayout, prompt, window, abortAfter, held int, sink PageSink) (*Receiver, *batonv1.TransferKVResponse, error) {
	stream, err := c.TransferKV(ctx)
	if err != nil {
		return nil, nil, err
	}
	ids := make([]uint32, prompt)
	rcv := NewReceiver(layout, prompt, window, sink)
	if err := rcv.Hold(held); err != nil {
		return nil, nil, err
	}
	if err := stream.Send(&batonv1.TransferKVRequest{Msg: &batonv1.TransferKVRequest_Handshake{Handshake: &batonv1.Handshake{
		RequestId: "r1", PromptTokenIds: ids, KvLayout: LayoutProto(layout), InitialCredits: uint32(rcv.Window()),
		CachedPageHashes: make([]uint64, held)}}}); err != nil {
		return nil, nil, err
	}
	for {
		m, err := stream.Recv()
		if err != nil {
			return rcv, nil, err
		}
		switch {
		case m.GetAccepted() != nil:
			if err := rcv.Skip(int(m.GetAccepted().GetSkippedPages())); err != nil {
				return rcv, nil, err
			}
		case m.GetKvChunk() != nil:
			grant, err := rcv.Chunk(m.GetKvChunk())
			if err != nil {
				return rcv, nil, err
			}
			if abortAfter > 0 && int(rcv.Chunks()) == abortAfter {
				if err := stream.Send(&batonv1.TransferKVRequest{Msg: &batonv1.TransferKVRequest_Abort{Abort: &batonv1.Abort{Reason: "client cancelled"}}}); err != nil {
					return rcv, nil, err
				}
				continue
			}
			if grant > 0 {
				// io.EOF from Send means prefill already ended the stream;
				// its final message and status come from Recv.
				if err := stream.Send(&batonv1.TransferKVRequest{Msg: &batonv1.TransferKVRequest_Credit{Credit: &batonv1.Credit{Chunks: uint32(grant)}}}); err != nil && !errors.Is(err, io.EOF) {
					return rcv, nil, err
				}
			}
		case m.GetPrefillDone() != nil:
			stream.CloseSend()
			return rcv, m, rcv.Complete(m.GetPrefillDone())
		default:
			stream.CloseSend()
			return rcv, m, nil
		}
	}
}

func TestTransferOverGRPC(t *testing.T) {
	cases := []struct {
		name     string
		layout   kernels.KVLayout
		prompt   int
		window   int
		maxChunk int
	}{
		{"one partial page", testLayout, 5, 8, 0},
		{"exact pages", testLayout, 64, 8, 0},
		{"partial last page, window 1", testLayout, 37, 1, 0},
		{"layer per chunk", testLayout, 50, 4, 1},
		{"f32 big heads", kernels.KVLayout{DType: quant.F32, PageSize: 16, Layers: 12, KVHeads: 12, HeadDim: 64}, 130, 16, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			srv := &server{maxChunk: c.maxChunk, runErr: make(chan error, 1)}
			client := startServer(t, srv)
			sink := &checkSink{layout: c.layout, seen: map[[2]int]bool{}}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			rcv, last, err := receive(ctx, client, c.layout, c.prompt, c.window, 0, sink)
			if err != nil {
				t.Fatalf("%v (sender: %v)", err, <-srv.runErr)
			}
			if last.GetPrefillDone().GetFirstTokenId() != 42 {
				t.Fatalf("last message %v, want PrefillDone", last)
			}
			if want := c.layout.PagesFor(c.prompt) * c.layout.Layers; len(sink.seen) != want {
				t.Errorf("received %d page-layers, want %d", len(sink.seen), want)
			}
			wantBytes := uint64(2 * c.prompt * c.layout.Layers * c.layout.RowBytes())
			if rcv.Bytes() != wantBytes || last.GetPrefillDone().GetBytesSent() != wantBytes {
				t.Errorf("bytes received %d, reported sent %d, want %d", rcv.Bytes(), last.GetPrefillDone().GetBytesSent(), wantBytes)
			}
			if err := <-srv.runErr; err != nil {
				t.Errorf("sender: %v", err)
			}
		})
	}
}

func TestAbortIsAcknowledged(t *testing.T) {
	srv := &server{runErr: make(chan error, 1), stepDelay: time.Millisecond}
	client := startServer(t, srv)
	sink := &checkSink{layout: testLayout, seen: map[[2]int]bool{}}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, last, err := receive(ctx, client, testLayout, 200, 2, 3, sink)
	if err != nil {
		t.Fatal(err)
	}
	if last.GetAbortAck().GetReason() != "client cancelled" {
		t.Fatalf("last message %v, want AbortAck", last)
	}
	if err := <-srv.runErr; !errors.Is(err, ErrAborted) {
		t.Errorf("sender returned %v, want ErrAborted", err)
	}
}

func TestSenderStopsWhenStreamGoes(t *testing.T) {
	srv := &server{runErr: make(chan error, 1), stepDelay: 5 * time.Millisecond}
	client := startServer(t, srv)
	ctx, cancel := context.WithCancel(context.Background())
	stream, err := client.TransferKV(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// No credits: the sender has pages but may not send; then decode vanishes.
	if err := stream.Send(&batonv1.TransferKVRequest{Msg: &batonv1.TransferKVRequest_Handshake{Handshake: &batonv1.Handshake{
		PromptTokenIds: make([]uint32, 100), KvLayout: LayoutProto(testLayout)}}}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond)
	cancel()
	select {
	case err := <-srv.runErr:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("sender returned %v, want context.Canceled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("sender still running after the stream ended")
	}
}

func TestReceiverRejects(t *testing.T) {
	good := func() *batonv1.KVChunk {
		k := make([]byte, 16*testLayout.Layers*testLayout.RowBytes())
		v := make([]byte, len(k))
		patternPages{testLayout}.CopyPage(0, 0, testLayout.Layers, 16, k, v)
		return &batonv1.KVChunk{Seq: 0, PageIndex: 0, LayerStart: 0, LayerEnd: uint32(testLayout.Layers), Tokens: 16, K: k, V: v, Checksum: Checksum(k, v)}
	}
	cases := []struct {
		name   string
		mutate func(c *batonv1.KVChunk)
		want   string
	}{
		{"seq gap", func(c *batonv1.KVChunk) { c.Seq = 1 }, "seq 1, want 0"},
		{"page beyond prompt", func(c *batonv1.KVChunk) { c.PageIndex = 9 }, "page 9, the prompt has 2 pages"},
		{"out of order", func(c *batonv1.KVChunk) { c.PageIndex = 1 }, "want page 0 layer 0"},
		{"empty layer range", func(c *batonv1.KVChunk) { c.LayerEnd = 0 }, "layers [0, 0)"},
		{"too many layers", func(c *batonv1.KVChunk) { c.LayerEnd = 6 }, "outside [0, 5)"},
		{"wrong tokens", func(c *batonv1.KVChunk) { c.Tokens = 15 }, "15 tokens in page 0, want 16"},
		{"short v", func(c *batonv1.KVChunk) { c.V = c.V[:10] }, "want 5120 each"},
		{"flipped bit", func(c *batonv1.KVChunk) { c.K[100] ^= 1 }, "checksum"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := NewReceiver(testLayout, 20, 4, &checkSink{layout: testLayout, seen: map[[2]int]bool{}})
			ch := good()
			c.mutate(ch)
			if _, err := r.Chunk(ch); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want %q", err, c.want)
			}
		})
	}
	r := NewReceiver(testLayout, 20, 4, &checkSink{layout: testLayout, seen: map[[2]int]bool{}})
	if _, err := r.Chunk(good()); err != nil {
		t.Fatal(err)
	}
	if err := r.Complete(&batonv1.PrefillDone{}); err == nil || !strings.Contains(err.Error(), "after page 1 layer 0 of 2 pages") {
		t.Fatalf("Complete on a missing page: %v", err)
	}
}

func TestLayout(t *testing.T) {
	for _, c := range []struct {
		wire *batonv1.KVLayout
		want string
	}{
		{&batonv1.KVLayout{}, "kv_layout.dtype: KV_DATA_TYPE_UNSPECIFIED is not a KV element type"},
		{&batonv1.KVLayout{Dtype: batonv1.KVDataType_KV_DATA_TYPE_F16}, "kv_layout.page_size_tokens: 0, want 1-4096"},
		{&batonv1.KVLayout{Dtype: batonv1.KVDataType_KV_DATA_TYPE_F16, PageSizeTokens: 16, NumLayers: 2000}, "kv_layout.num_layers: 2000, want 1-1024"},
		{&batonv1.KVLayout{Dtype: batonv1.KVDataType_KV_DATA_TYPE_F32, PageSizeTokens: 16, NumLayers: 2, NumKvHeads: 2}, "kv_layout.head_dim: 0, want 1-1024"},
	} {
		if _, err := LayoutFromProto(c.wire); err == nil || err.Error() != c.want {
			t.Errorf("LayoutFromProto(%v) = %v, want %q", c.wire, err, c.want)
		}
	}
	l := testLayout
	with := func(f func(*kernels.KVLayout)) kernels.KVLayout { o := l; f(&o); return o }
	for _, c := range []struct {
		other kernels.KVLayout
		want  string
	}{
		{l, ""},
		{with(func(o *kernels.KVLayout) { o.DType = quant.F32 }), "kv_layout.dtype: this worker stores KV_DATA_TYPE_F16, the peer KV_DATA_TYPE_F32"},
		{with(func(o *kernels.KVLayout) { o.PageSize = 32 }), "kv_layout.page_size_tokens: this worker uses 16, the peer 32"},
		{with(func(o *kernels.KVLayout) { o.Layers = 6 }), "kv_layout.num_layers"},
		{with(func(o *kernels.KVLayout) { o.KVHeads = 2 }), "kv_layout.num_kv_heads"},
		{with(func(o *kernels.KVLayout) { o.HeadDim = 16 }), "kv_layout.head_dim"},
	} {
		if got := Mismatch(l, c.other); !strings.HasPrefix(got, c.want) || (c.want == "") != (got == "") {
			t.Errorf("Mismatch(%+v) = %q, want prefix %q", c.other, got, c.want)
		}
	}
	back, err := LayoutFromProto(LayoutProto(l))
	if err != nil || back != l {
		t.Errorf("proto round trip: %+v, %v", back, err)
	}
	if got := LayersPerChunk(l, 1); got != 1 {
		t.Errorf("LayersPerChunk(1) = %d", got)
	}
	if got := LayersPerChunk(l, 1<<30); got != l.Layers {
		t.Errorf("LayersPerChunk(1GiB) = %d", got)
	}
	if Checksum([]byte("ab"), []byte("c")) != Checksum([]byte("a"), []byte("bc")) {
		t.Error("checksum is not over the concatenation")
	}
}

func TestSenderGivesUpWithoutCredit(t *testing.T) {
	stream := &discardStream{}
	snd := NewSender(SenderConfig{Layout: testLayout, PromptTokens: 40, InitialCredits: 1, CreditTimeout: 50 * time.Millisecond},
		patternPages{testLayout}, stream)
	snd.PagesReady(3)
	start := time.Now()
	err := snd.Run(context.Background())
	if !errors.Is(err, ErrStalled) {
		t.Fatalf("Run = %v, want ErrStalled", err)
	}
	if took := time.Since(start); took < 50*time.Millisecond {
		t.Errorf("gave up after %v, before the credit timeout", took)
	}
	if stream.n != 1 {
		t.Errorf("sent %d chunks on one credit", stream.n)
	}
}

type discardStream struct{ n int }

func (d *discardStream) Send(*batonv1.TransferKVResponse) error { d.n++; return nil }

// recordStream keeps what a Sender sends, for a test to read while it runs.
type recordStream struct {
	mu   sync.Mutex
	msgs []*batonv1.TransferKVResponse
}

func (r *recordStream) Send(m *batonv1.TransferKVResponse) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.msgs = append(r.msgs, m)
	return nil
}

func (r *recordStream) progress() (n int, last uint32) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, m := range r.msgs {
		if p := m.GetProgress(); p != nil {
			n, last = n+1, p.GetPagesReady()
		}
	}
	return n, last
}

// A transfer whose prompt is still queued or computing sends heartbeats, so
// the receiver's idle deadline does not mistake a busy prefill for a dead
// one; once pages flow, chunks take their place.
func TestSenderHeartbeatWhileWaiting(t *testing.T) {
	stream := &recordStream{}
	snd := NewSender(SenderConfig{Layout: testLayout, PromptTokens: 40, InitialCredits: 100, Heartbeat: 20 * time.Millisecond},
		patternPages{testLayout}, stream)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- snd.Run(ctx) }()

	deadline := time.Now().Add(10 * time.Second)
	for n, _ := stream.progress(); n < 3; n, _ = stream.progress() {
		if time.Now().After(deadline) {
			t.Fatalf("%d heartbeats in 10 s with a 20 ms interval", n)
		}
		time.Sleep(5 * time.Millisecond)
	}
	snd.PagesReady(1)
	for _, last := stream.progress(); last != 1; _, last = stream.progress() {
		if time.Now().After(deadline) {
			t.Fatal("no heartbeat reported the ready page")
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Run = %v, want context.Canceled", err)
	}
}

func TestSenderNoHeartbeatByDefault(t *testing.T) {
	stream := &recordStream{}
	snd := NewSender(SenderConfig{Layout: testLayout, PromptTokens: 40, InitialCredits: 100},
		patternPages{testLayout}, stream)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := snd.Run(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Run = %v", err)
	}
	if n, _ := stream.progress(); n != 0 {
		t.Fatalf("%d heartbeats with Heartbeat unset", n)
	}
}

// TestTransferSkipsHeldPages: pages decode holds are not sent by a prefill
// that knows the handshake's cached_page_hashes, and not written by decode
// when an older prefill sends them anyway; either way the rest arrives
// whole and the transfer completes.
func TestTransferSkipsHeldPages(t *testing.T) {
	const prompt, held = 70, 3 // 5 pages of 16, the first 3 held
	for _, skip := range []bool{true, false} {
		t.Run(fmt.Sprintf("prefill skips %v", skip), func(t *testing.T) {
			srv := &server{runErr: make(chan error, 1), skipHeld: skip}
			client := startServer(t, srv)
			sink := &checkSink{layout: testLayout, seen: map[[2]int]bool{}}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			rcv, last, err := receiveHolding(ctx, client, testLayout, prompt, 2, 0, held, sink)
			if err != nil {
				t.Fatalf("%v (sender: %v)", err, <-srv.runErr)
			}
			if err := <-srv.runErr; err != nil || last.GetPrefillDone() == nil {
				t.Fatalf("sender: %v; last %v", err, last)
			}
			for k := range sink.seen {
				if k[0] < held {
					t.Errorf("held page %d layer %d written", k[0], k[1])
				}
			}
			if want := (5 - held) * testLayout.Layers; len(sink.seen) != want {
				t.Errorf("%d page-layers written, want %d", len(sink.seen), want)
			}
			sentTokens := prompt
			if skip {
				sentTokens -= held * testLayout.PageSize
			}
			if want := uint64(2 * sentTokens * testLayout.Layers * testLayout.RowBytes()); rcv.Bytes() != want {
				t.Errorf("%d bytes received, want %d", rcv.Bytes(), want)
			}
			if want := map[bool]int{true: held, false: 0}[skip]; rcv.Skipped() != want {
				t.Errorf("skipped %d, want %d", rcv.Skipped(), want)
			}
		})
	}
}

func TestReceiverHoldAndSkip(t *testing.T) {
	r := NewReceiver(testLayout, 33, 4, &checkSink{layout: testLayout, seen: map[[2]int]bool{}}) // 3 pages
	if err := r.Hold(3); err == nil {
		t.Error("held the page of the last token")
	}
	if err := r.Hold(-1); err == nil {
		t.Error("held -1 pages")
	}
	if err := r.Hold(2); err != nil {
		t.Fatal(err)
	}
	if err := r.Skip(3); err == nil || !strings.Contains(err.Error(), "decode holds 2") {
		t.Errorf("skip beyond the held pages: %v", err)
	}
	if err := r.Skip(2); err != nil {
		t.Fatal(err)
	}
	k := make([]byte, 16*testLayout.Layers*testLayout.RowBytes())
	v := make([]byte, len(k))
	patternPages{testLayout}.CopyPage(0, 0, testLayout.Layers, 16, k, v)
	// After skipping two pages the next chunk must be page 2's.
	if _, err := r.Chunk(&batonv1.KVChunk{PageIndex: 0, LayerEnd: uint32(testLayout.Layers), Tokens: 16, K: k, V: v, Checksum: Checksum(k, v)}); err == nil || !strings.Contains(err.Error(), "want page 2") {
		t.Errorf("chunk for a skipped page: %v", err)
	}
}

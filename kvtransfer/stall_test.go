package kvtransfer

import (
	"context"
	"errors"
	"testing"
	"time"

	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"github.com/baton-serving/baton/kernels"
	"github.com/baton-serving/baton/kernels/quant"
	"google.golang.org/grpc"
)

// bigLayout is the llama-110m shape at F16: a 16-token page is 576 KiB of
// K and V, so a few chunks exhaust gRPC's 64 KiB windows.
var bigLayout = kernels.KVLayout{DType: quant.F16, PageSize: 16, Layers: 12, KVHeads: 12, HeadDim: 64}

// runResult is how one Sender.Run ended.
type runResult struct {
	err    error
	took   time.Duration
	chunks uint64
}

// stallServer is a PrefillService whose TransferKV has the whole prompt
// ready at once and sends it as credits allow, with the prefill worker's
// deadlines, reporting how Run ended.
type stallServer struct {
	batonv1.UnimplementedPrefillServiceServer
	idle  time.Duration // the Sender's deadlines (--transfer-idle-timeout)
	codec *Codec
	runs  chan runResult
}

func (s *stallServer) TransferKV(stream batonv1.PrefillService_TransferKVServer) error {
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
	snd := NewSender(SenderConfig{Layout: layout, PromptTokens: prompt, InitialCredits: int(hs.GetInitialCredits()),
		CreditTimeout: s.idle, SendTimeout: s.idle, Codec: s.codec}, patternPages{layout}, stream)
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	go forwardCredits(stream, snd, cancel)
	snd.Finish(&batonv1.PrefillDone{PromptTokens: uint32(prompt)})
	start := time.Now()
	err = snd.Run(ctx)
	chunks, _ := snd.Stats()
	s.runs <- runResult{err: err, took: time.Since(start), chunks: chunks}
	return err
}

// A decode worker that stops reading while credits are outstanding (its
// gRPC windows exhausted, as a black-holed network or a wedged process
// leaves them) must not hold the sender, and so the request's pages, in
// Send until the stream ends: a send that makes no progress for the idle
// deadline ends the transfer with ErrSendStalled, an ErrStalled.
func TestSenderSendDeadline(t *testing.T) {
	const idle = time.Second
	const prompt = 256 // 9 MiB of K and V
	codec := NewCodec()
	srv := &stallServer{idle: idle, codec: codec, runs: make(chan runResult, 1)}
	// Fixed 64 KiB windows (no BDP growth): the stream's window closes
	// after about one chunk the client does not read.
	client := serveKV(t, srv, []grpc.ServerOption{codec.ServerOption()},
		grpc.WithInitialWindowSize(1<<16), grpc.WithInitialConnWindowSize(1<<16))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	stream, err := client.TransferKV(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Credit for every chunk, then nothing is read.
	if err := stream.Send(&batonv1.TransferKVRequest{Msg: &batonv1.TransferKVRequest_Handshake{Handshake: &batonv1.Handshake{
		PromptTokenIds: make([]uint32, prompt), KvLayout: LayoutProto(bigLayout), InitialCredits: 1000}}}); err != nil {
		t.Fatal(err)
	}
	per := LayersPerChunk(bigLayout, DefaultMaxChunkBytes)
	total := uint64(bigLayout.PagesFor(prompt) * ((bigLayout.Layers + per - 1) / per))
	select {
	case r := <-srv.runs:
		if !errors.Is(r.err, ErrSendStalled) || !errors.Is(r.err, ErrStalled) {
			t.Fatalf("Run = %v, want ErrSendStalled", r.err)
		}
		if r.took < idle {
			t.Errorf("gave up after %v, before the %v deadline", r.took, idle)
		}
		if r.chunks == 0 || r.chunks >= total {
			t.Errorf("%d of %d chunks sent before the stall; want some, not all", r.chunks, total)
		}
		t.Logf("%v after %d of %d chunks, in %v", r.err, r.chunks, total, r.took.Round(time.Millisecond))
	case <-time.After(15 * time.Second):
		t.Fatalf("Run still blocked 15 s after decode stopped reading (deadline %v)", idle)
	}
	// The handler has returned: the stream ends for decode too, with the
	// unread chunks discarded.
	for {
		if _, err := stream.Recv(); err != nil {
			break
		}
	}
}

// slowSink is a decode worker that writes pages slowly: its reads, and so
// its gRPC windows, move, only late.
type slowSink struct {
	PageSink
	delay time.Duration
}

func (s slowSink) WritePage(p, lo, hi, tokens int, k, v []byte) error {
	time.Sleep(s.delay)
	return s.PageSink.WritePage(p, lo, hi, tokens, k, v)
}

// A slow reader is not a stalled one: each send waits for decode to read,
// within the deadline, and the transfer completes.
func TestSenderSendDeadlineSlowReader(t *testing.T) {
	const idle = 2 * time.Second
	const prompt = 100
	codec := NewCodec()
	srv := &stallServer{idle: idle, codec: codec, runs: make(chan runResult, 1)}
	client := serveKV(t, srv, []grpc.ServerOption{codec.ServerOption()},
		grpc.WithInitialWindowSize(1<<16), grpc.WithInitialConnWindowSize(1<<16))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sink := slowSink{PageSink: &checkSink{layout: bigLayout, seen: map[[2]int]bool{}}, delay: 20 * time.Millisecond}
	if _, err := pull(ctx, client, bigLayout, prompt, 4, sink, codec); err != nil {
		t.Fatal(err)
	}
	if r := <-srv.runs; r.err != nil {
		t.Fatalf("Run = %v after %d chunks", r.err, r.chunks)
	}
}

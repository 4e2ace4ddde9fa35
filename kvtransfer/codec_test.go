package kvtransfer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"github.com/baton-serving/baton/kernels"
	"github.com/baton-serving/baton/kernels/quant"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// pieces cuts b into buffers of n bytes (the last one shorter), the way gRPC
// hands a received message to a codec as the payloads of HTTP/2 frames.
func pieces(b []byte, n int) mem.BufferSlice {
	var out mem.BufferSlice
	for len(b) > 0 {
		m := min(n, len(b))
		out = append(out, mem.SliceBuffer(bytes.Clone(b[:m])))
		b = b[m:]
	}
	return out
}

func filled(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i*7) + byte(i>>9)
	}
	return b
}

func chunkResponse(c *batonv1.KVChunk) *batonv1.TransferKVResponse {
	return &batonv1.TransferKVResponse{Msg: &batonv1.TransferKVResponse_KvChunk{KvChunk: c}}
}

// chunkCases are KV chunks the fast paths must encode and decode exactly as
// the protobuf library does.
var chunkCases = []struct {
	name string
	c    *batonv1.KVChunk
}{
	{"all zero", &batonv1.KVChunk{}},
	{"empty k and v", &batonv1.KVChunk{Seq: 3, PageIndex: 1, LayerStart: 2, LayerEnd: 3, Tokens: 16, Checksum: 7}},
	{"k only", &batonv1.KVChunk{Seq: 1, LayerEnd: 1, Tokens: 1, K: filled(100, 1)}},
	{"v only", &batonv1.KVChunk{LayerEnd: 1, Tokens: 1, V: filled(5000, 2)}},
	{"below pooling threshold", &batonv1.KVChunk{Seq: 9, LayerEnd: 2, Tokens: 4, K: filled(1000, 3), V: filled(1000, 4), Checksum: 1}},
	{"length varint boundaries", &batonv1.KVChunk{Seq: 127, PageIndex: 128, LayerStart: 16383, LayerEnd: 16384, Tokens: 1 << 21, K: filled(127, 5), V: filled(128, 6), Checksum: 1 << 28}},
	{"typical", &batonv1.KVChunk{Seq: 4711, PageIndex: 392, LayerStart: 5, LayerEnd: 10, Tokens: 16, K: filled(120<<10, 7), V: filled(120<<10, 8), Checksum: 0xdeadbeef}},
	{"large", &batonv1.KVChunk{Seq: 1 << 40, PageIndex: 1, LayerEnd: 12, Tokens: 16, K: filled(3<<20+5, 9), V: filled(3<<20+5, 10), Checksum: 12345}},
	{"max values", &batonv1.KVChunk{Seq: math.MaxUint64, PageIndex: math.MaxUint32, LayerStart: math.MaxUint32, LayerEnd: math.MaxUint32, Tokens: math.MaxUint32, K: []byte{0xff}, V: []byte{0}, Checksum: math.MaxUint32}},
}

func aliases(out mem.BufferSlice, b []byte) bool {
	for _, buf := range out {
		if d := buf.ReadOnlyData(); len(d) == len(b) && unsafe.SliceData(d) == unsafe.SliceData(b) {
			return true
		}
	}
	return false
}

func TestCodecMarshalMatchesProto(t *testing.T) {
	codec := NewCodec()
	for _, c := range chunkCases {
		t.Run(c.name, func(t *testing.T) {
			msg := chunkResponse(c.c)
			want, err := proto.Marshal(msg)
			if err != nil {
				t.Fatal(err)
			}
			out, err := codec.Marshal(msg)
			if err != nil {
				t.Fatal(err)
			}
			defer out.Free()
			if got := out.Materialize(); !bytes.Equal(got, want) {
				t.Fatalf("codec wrote %d bytes %x…, proto %d bytes %x…", len(got), got[:min(len(got), 40)], len(want), want[:min(len(want), 40)])
			}
			// The payload goes to gRPC as the chunk's own memory.
			for _, b := range [][]byte{c.c.K, c.c.V} {
				if len(b) > 0 && !aliases(out, b) {
					t.Errorf("a %d-byte payload was copied", len(b))
				}
			}
		})
	}
}

func TestCodecUnmarshalRoundTrip(t *testing.T) {
	codec := NewCodec()
	for _, c := range chunkCases {
		t.Run(c.name, func(t *testing.T) {
			msg := chunkResponse(c.c)
			wire, err := proto.Marshal(msg)
			if err != nil {
				t.Fatal(err)
			}
			for _, frame := range []int{1, 7, 16 << 10, len(wire)} {
				if frame < 1024 && len(wire) > 1<<20 {
					continue // a few million one-byte buffers prove nothing more
				}
				got := &batonv1.TransferKVResponse{Msg: &batonv1.TransferKVResponse_Accepted{}} // overwritten
				data := pieces(wire, frame)
				if err := codec.Unmarshal(data, got); err != nil {
					t.Fatalf("frames of %d: %v", frame, err)
				}
				if !proto.Equal(got, msg) {
					t.Fatalf("frames of %d: decoded %v", frame, got)
				}
				// The chunk must not share memory with gRPC's buffers,
				// which gRPC frees after Unmarshal.
				for _, b := range [][]byte{got.GetKvChunk().GetK(), got.GetKvChunk().GetV()} {
					if len(b) > 0 && aliases(data, b) {
						t.Fatal("decoded payload aliases the received buffers")
					}
				}
				pooled := len(c.c.K)+len(c.c.V) > 0
				want := 0
				if pooled {
					want = 1
				}
				if n := codec.outstanding(); n != want {
					t.Errorf("%d chunks outstanding before Release, want %d", n, want)
				}
				ch := got.GetKvChunk()
				codec.Release(ch)
				if pooled && (ch.K != nil || ch.V != nil) {
					t.Error("Release left K or V set")
				}
				if n := codec.outstanding(); n != 0 {
					t.Errorf("%d chunks outstanding after Release", n)
				}
				codec.Release(ch) // a second Release does nothing
			}
		})
	}
}

func TestCodecFallback(t *testing.T) {
	withUnknown := &batonv1.KVChunk{Seq: 1, K: []byte("k"), V: []byte("v")}
	withUnknown.ProtoReflect().SetUnknown(protowire.AppendVarint(protowire.AppendTag(nil, 99, protowire.VarintType), 5))
	outerUnknown := chunkResponse(&batonv1.KVChunk{Seq: 2, K: []byte("kk")})
	outerUnknown.ProtoReflect().SetUnknown(protowire.AppendBytes(protowire.AppendTag(nil, 77, protowire.BytesType), []byte("x")))
	msgs := []proto.Message{
		&batonv1.TransferKVResponse{},
		&batonv1.TransferKVResponse{Msg: &batonv1.TransferKVResponse_Accepted{Accepted: &batonv1.Accepted{QueuePosition: 3}}},
		&batonv1.TransferKVResponse{Msg: &batonv1.TransferKVResponse_PrefillDone{PrefillDone: &batonv1.PrefillDone{
			FirstTokenId: 42, FirstTokenLogprob: &batonv1.TokenLogprob{TokenId: 42, Logprob: -0.5}, ChunksSent: 9, BytesSent: 1 << 33, QueueSeconds: 0.25}}},
		&batonv1.TransferKVResponse{Msg: &batonv1.TransferKVResponse_AbortAck{AbortAck: &batonv1.AbortAck{Reason: "client cancelled"}}},
		&batonv1.TransferKVResponse{Msg: &batonv1.TransferKVResponse_Error{Error: &batonv1.Error{Code: 13, Message: "boom"}}},
		&batonv1.TransferKVResponse{Msg: &batonv1.TransferKVResponse_KvChunk{}}, // nil chunk
		chunkResponse(withUnknown),
		outerUnknown,
		&batonv1.TransferKVRequest{Msg: &batonv1.TransferKVRequest_Handshake{Handshake: &batonv1.Handshake{
			RequestId: "r1", PromptTokenIds: []uint32{1, 2, 300000}, KvLayout: LayoutProto(testLayout), InitialCredits: 8,
			Deadline: timestamppb.New(time.Unix(1700000000, 5))}}},
		&batonv1.TransferKVRequest{Msg: &batonv1.TransferKVRequest_Credit{Credit: &batonv1.Credit{Chunks: 4}}},
		LayoutProto(testLayout),
	}
	codec := NewCodec()
	for _, m := range msgs {
		t.Run(fmt.Sprintf("%T %v", m, m), func(t *testing.T) {
			want, err := proto.Marshal(m)
			if err != nil {
				t.Fatal(err)
			}
			out, err := codec.Marshal(m)
			if err != nil {
				t.Fatal(err)
			}
			if got := out.Materialize(); !bytes.Equal(got, want) {
				t.Errorf("marshal: %x, want %x", got, want)
			}
			out.Free()
			got := m.ProtoReflect().New().Interface()
			if err := codec.Unmarshal(pieces(want, 3), got); err != nil {
				t.Fatal(err)
			}
			if !proto.Equal(got, m) {
				t.Errorf("unmarshal: %v, want %v", got, m)
			}
		})
	}
	if _, err := codec.Marshal("not a message"); err == nil {
		t.Error("marshalled a string")
	}
	var s string
	if err := codec.Unmarshal(pieces([]byte{8, 1}, 1), &s); err == nil {
		t.Error("unmarshalled into a string")
	}
	if codec.Name() != "proto" {
		t.Errorf("Name() = %q", codec.Name())
	}
}

// wireOddities are valid and invalid encodings that proto.Marshal never
// writes but a peer may; the codec must decode them exactly as the protobuf
// library does.
func wireOddities() [][]byte {
	chunk := func(c *batonv1.KVChunk) []byte {
		b, err := proto.Marshal(c)
		if err != nil {
			panic(err)
		}
		return b
	}
	env := func(inner []byte) []byte {
		return protowire.AppendBytes(protowire.AppendTag(nil, 2, protowire.BytesType), inner)
	}
	a := chunk(&batonv1.KVChunk{Seq: 1, PageIndex: 2, K: []byte("abc"), V: []byte("de"), Checksum: 9})
	b := chunk(&batonv1.KVChunk{LayerEnd: 4, K: []byte("xyz")})
	full, _ := proto.Marshal(chunkResponse(&batonv1.KVChunk{Seq: 5, K: filled(300, 1), V: filled(300, 2), Checksum: 3}))
	return [][]byte{
		nil,
		env(nil),
		env(a),
		append(env(a), env(b)...),          // two chunks merge
		append(env(a), 0x1a, 0),            // then prefill_done replaces the chunk
		append([]byte{0x0a, 0}, env(a)...), // accepted, then the chunk
		env(append(a, 0x08, 7)),            // seq twice: last wins
		env(append(a, 0x32, 1, 'q')),       // k twice: last wins
		env(append(a, 0x32, 0)),            // k emptied
		env([]byte{0x88, 0x80, 0x00, 5}),   // overlong tag varint
		env([]byte{0x08, 0xff, 0xff, 0xff, 0xff, 0x7f}),                               // seq > 32 bits
		env([]byte{0x10, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}), // page index truncated to 32 bits
		env([]byte{0x10, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02}), // varint overflow
		env([]byte{0x0a, 1, 'x'}),     // seq with the bytes wire type: unknown field
		env([]byte{0x48, 1}),          // unknown field 9
		env([]byte{0x45, 1, 2, 3, 4}), // checksum as fixed32: unknown field
		env([]byte{0x00}),             // field number 0
		env([]byte{0x32, 5, 'a'}),     // k truncated
		env([]byte{0x08}),             // varint truncated
		{0x12, 10, 0x08, 1},           // envelope longer than the message
		{0x12, 0x80},                  // envelope length truncated
		{0x16},                        // the chunk with a group wire type
		full,
		full[:len(full)-1],
		append(bytes.Clone(full), 0x1a, 0),
	}
}

// FuzzCodecUnmarshal checks that the codec decodes any input exactly as the
// protobuf library does, however gRPC splits it into frames.
func FuzzCodecUnmarshal(f *testing.F) {
	for i, w := range wireOddities() {
		f.Add(w, uint16(i+1))
	}
	codec := NewCodec()
	f.Fuzz(func(t *testing.T, wire []byte, frame uint16) {
		want := &batonv1.TransferKVResponse{}
		werr := proto.Unmarshal(wire, want)
		got := &batonv1.TransferKVResponse{}
		gerr := codec.Unmarshal(pieces(wire, int(frame)+1), got)
		if (werr == nil) != (gerr == nil) {
			t.Fatalf("codec error %v, proto error %v", gerr, werr)
		}
		if werr == nil && !proto.Equal(got, want) {
			t.Fatalf("codec decoded %v, proto %v", got, want)
		}
		codec.Release(got.GetKvChunk())
	})
}

// FuzzCodecMarshal checks byte equality with proto.Marshal and the round
// trip for arbitrary chunks.
func FuzzCodecMarshal(f *testing.F) {
	for _, c := range chunkCases {
		if len(c.c.K)+len(c.c.V) < 1<<16 {
			f.Add(c.c.Seq, c.c.PageIndex, c.c.LayerStart, c.c.LayerEnd, c.c.Tokens, c.c.Checksum, c.c.K, c.c.V)
		}
	}
	codec := NewCodec()
	f.Fuzz(func(t *testing.T, seq uint64, page, lo, hi, tokens, sum uint32, k, v []byte) {
		msg := chunkResponse(&batonv1.KVChunk{Seq: seq, PageIndex: page, LayerStart: lo, LayerEnd: hi, Tokens: tokens, K: k, V: v, Checksum: sum})
		want, err := proto.Marshal(msg)
		if err != nil {
			t.Fatal(err)
		}
		out, err := codec.Marshal(msg)
		if err != nil {
			t.Fatal(err)
		}
		wire := out.Materialize()
		out.Free()
		if !bytes.Equal(wire, want) {
			t.Fatalf("codec wrote %x, proto %x", wire, want)
		}
		got := &batonv1.TransferKVResponse{}
		if err := codec.Unmarshal(pieces(wire, 1+int(seq%23)), got); err != nil {
			t.Fatal(err)
		}
		if !proto.Equal(got, msg) {
			t.Fatalf("round trip: %v, want %v", got, msg)
		}
		codec.Release(got.GetKvChunk())
	})
}

// TestCodecConcurrentReuse decodes and releases chunks from many goroutines
// through one codec while each holds a few decoded chunks, and checks that
// no held chunk's bytes change: a buffer handed out twice would show here
// (and to the race detector).
func TestCodecConcurrentReuse(t *testing.T) {
	codec := NewCodec()
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := range 8 {
		wg.Go(func() {
			type held struct {
				c    *batonv1.KVChunk
				k, v []byte
			}
			var hold []held
			for i := range 150 {
				n := 1 + (g*7919+i*104729)%(70<<10)
				src := &batonv1.KVChunk{Seq: uint64(i), PageIndex: uint32(g), K: filled(n, byte(g+i)), V: filled(n, byte(g*i)), Checksum: uint32(n)}
				out, err := codec.Marshal(chunkResponse(src))
				if err != nil {
					errs <- err
					return
				}
				wire := out.Materialize()
				out.Free()
				got := &batonv1.TransferKVResponse{}
				if err := codec.Unmarshal(pieces(wire, 16<<10), got); err != nil {
					errs <- err
					return
				}
				hold = append(hold, held{got.GetKvChunk(), src.K, src.V})
				if len(hold) > 4 {
					h := hold[0]
					if !bytes.Equal(h.c.K, h.k) || !bytes.Equal(h.c.V, h.v) {
						errs <- fmt.Errorf("goroutine %d: chunk %d changed while held", g, h.c.Seq)
						return
					}
					codec.Release(h.c)
					hold = hold[1:]
				}
			}
			for _, h := range hold {
				codec.Release(h.c)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if n := codec.outstanding(); n != 0 {
		t.Errorf("%d chunks outstanding", n)
	}
}

// heldStream plays gRPC for a Sender: it marshals each message with the
// codec and holds the result for a while after Send returns, as gRPC's
// writer may, checking when it lets go that the bytes are still those sent.
type heldStream struct {
	codec   *Codec
	hold    int
	failAt  int // Send fails, before marshalling, at this message (0: never)
	n       int
	pending []mem.BufferSlice
	want    [][]byte
}

func (s *heldStream) Send(m *batonv1.TransferKVResponse) error {
	if s.n++; s.n == s.failAt {
		return errors.New("stream broken")
	}
	want, err := proto.Marshal(m)
	if err != nil {
		return err
	}
	out, err := s.codec.Marshal(m)
	if err != nil {
		return err
	}
	s.pending, s.want = append(s.pending, out), append(s.want, want)
	for len(s.pending) > s.hold {
		if err := s.release(); err != nil {
			return err
		}
	}
	return nil
}

func (s *heldStream) release() error {
	out, want := s.pending[0], s.want[0]
	s.pending, s.want = s.pending[1:], s.want[1:]
	got := out.Materialize()
	out.Free()
	if !bytes.Equal(got, want) {
		return fmt.Errorf("a sent message changed while gRPC held it")
	}
	return nil
}

func (c *Codec) lentLen() int {
	c.lentMu.Lock()
	defer c.lentMu.Unlock()
	return len(c.lent)
}

func TestSenderRecyclesOnlyReleasedBuffers(t *testing.T) {
	for _, hold := range []int{0, 1, 5} {
		t.Run(fmt.Sprintf("gRPC holds %d", hold), func(t *testing.T) {
			codec := NewCodec()
			stream := &heldStream{codec: codec, hold: hold}
			snd := NewSender(SenderConfig{Layout: testLayout, PromptTokens: 300, InitialCredits: 1000, MaxChunkBytes: 1, Codec: codec},
				patternPages{testLayout}, stream)
			snd.Finish(&batonv1.PrefillDone{})
			if err := snd.Run(context.Background()); err != nil {
				t.Fatal(err)
			}
			for len(stream.pending) > 0 {
				if err := stream.release(); err != nil {
					t.Fatal(err)
				}
			}
			if n := codec.lentLen(); n != 0 {
				t.Errorf("%d loans left", n)
			}
		})
	}
	t.Run("send fails before marshalling", func(t *testing.T) {
		codec := NewCodec()
		stream := &heldStream{codec: codec, hold: 2, failAt: 3}
		snd := NewSender(SenderConfig{Layout: testLayout, PromptTokens: 300, InitialCredits: 1000, Codec: codec},
			patternPages{testLayout}, stream)
		snd.Finish(&batonv1.PrefillDone{})
		if err := snd.Run(context.Background()); err == nil || !strings.Contains(err.Error(), "stream broken") {
			t.Fatalf("Run = %v", err)
		}
		if n := codec.lentLen(); n != 0 {
			t.Errorf("%d loans left", n)
		}
	})
}

func TestMaxMessageBytes(t *testing.T) {
	l := kernels.KVLayout{DType: quant.F32, PageSize: 64, Layers: 3, KVHeads: 8, HeadDim: 128}
	per := l.PageSize * l.RowBytes()
	c := &batonv1.KVChunk{Seq: math.MaxUint64, PageIndex: math.MaxUint32, LayerStart: math.MaxUint32, LayerEnd: math.MaxUint32,
		Tokens: math.MaxUint32, Checksum: math.MaxUint32, K: make([]byte, per), V: make([]byte, per)}
	if got, max := proto.Size(chunkResponse(c)), MaxMessageBytes(l, 1); got > max {
		t.Errorf("a %d-byte message exceeds MaxMessageBytes %d", got, max)
	}
	if got := MaxMessageBytes(testLayout, 0); got < 2*LayersPerChunk(testLayout, DefaultMaxChunkBytes)*16*testLayout.RowBytes() {
		t.Errorf("MaxMessageBytes(default) = %d", got)
	}
}

// kvServer is a PrefillService whose TransferKV sends a whole prompt's pages
// at once, as fast as credits allow.
type kvServer struct {
	batonv1.UnimplementedPrefillServiceServer
	maxChunk int
	codec    *Codec // the Sender's (nil: chunks allocated per chunk)
	source   func(kernels.KVLayout) PageSource
}

func (s *kvServer) TransferKV(stream batonv1.PrefillService_TransferKVServer) error {
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
		MaxChunkBytes: s.maxChunk, Codec: s.codec}, s.source(layout), stream)
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	go forwardCredits(stream, snd, cancel)
	snd.Finish(&batonv1.PrefillDone{PromptTokens: uint32(prompt)})
	return snd.Run(ctx)
}

// forwardCredits hands the credits decode sends to snd until the stream
// ends, then cancels the transfer: a test prefill's receive loop.
func forwardCredits(stream batonv1.PrefillService_TransferKVServer, snd *Sender, cancel context.CancelFunc) {
	for {
		m, err := stream.Recv()
		if err != nil {
			cancel()
			return
		}
		if c := m.GetCredit(); c != nil {
			snd.AddCredits(int(c.GetChunks()))
		}
	}
}

func serveKV(tb testing.TB, s batonv1.PrefillServiceServer, opts []grpc.ServerOption, dopts ...grpc.DialOption) batonv1.PrefillServiceClient {
	tb.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	gs := grpc.NewServer(opts...)
	batonv1.RegisterPrefillServiceServer(gs, s)
	go gs.Serve(lis)
	dopts = append(dopts, grpc.WithTransportCredentials(insecure.NewCredentials()))
	conn, err := grpc.NewClient(lis.Addr().String(), dopts...)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { conn.Close(); gs.Stop() })
	return batonv1.NewPrefillServiceClient(conn)
}

// pull is the decode end of a transfer: chunks into sink, credits back,
// until PrefillDone. With a codec it decodes through it and releases every
// chunk once written, as the decode service should.
func pull(ctx context.Context, client batonv1.PrefillServiceClient, layout kernels.KVLayout, prompt, window int, sink PageSink, codec *Codec) (*Receiver, error) {
	var opts []grpc.CallOption
	if codec != nil {
		opts = append(opts, codec.CallOption())
	}
	stream, err := client.TransferKV(ctx, opts...)
	if err != nil {
		return nil, err
	}
	rcv := NewReceiver(layout, prompt, window, sink)
	if err := stream.Send(&batonv1.TransferKVRequest{Msg: &batonv1.TransferKVRequest_Handshake{Handshake: &batonv1.Handshake{
		PromptTokenIds: make([]uint32, prompt), KvLayout: LayoutProto(layout), InitialCredits: uint32(rcv.Window())}}}); err != nil {
		return rcv, err
	}
	for {
		m, err := stream.Recv()
		if err != nil {
			return rcv, fmt.Errorf("after %d chunks: %w", rcv.Chunks(), err)
		}
		switch x := m.GetMsg().(type) {
		case *batonv1.TransferKVResponse_KvChunk:
			grant, err := rcv.Chunk(x.KvChunk)
			if codec != nil {
				codec.Release(x.KvChunk)
			}
			if err != nil {
				return rcv, err
			}
			if grant > 0 {
				// io.EOF: prefill has sent everything and ended the stream;
				// Recv returns what is left.
				if err := stream.Send(&batonv1.TransferKVRequest{Msg: &batonv1.TransferKVRequest_Credit{Credit: &batonv1.Credit{Chunks: uint32(grant)}}}); err != nil && !errors.Is(err, io.EOF) {
					return rcv, err
				}
			}
		case *batonv1.TransferKVResponse_PrefillDone:
			if err := stream.CloseSend(); err != nil {
				return rcv, err
			}
			return rcv, rcv.Complete(x.PrefillDone)
		default:
			return rcv, fmt.Errorf("unexpected message %v", m)
		}
	}
}

// TestTransferWithCodec runs concurrent transfers over real gRPC with the
// codec at either end or both, the Sender's buffers recycled through one
// shared pool, and checks every byte that arrives.
func TestTransferWithCodec(t *testing.T) {
	big := kernels.KVLayout{DType: quant.F32, PageSize: 16, Layers: 12, KVHeads: 12, HeadDim: 64}
	cases := []struct {
		name                   string
		server, sender, client bool
	}{
		{"codec at both ends", true, true, true},
		{"codec at both ends, sender allocates", true, false, true},
		{"default server, codec client", false, false, true},
		{"codec server, default client", true, true, false},
		{"sender pool with default server codec", false, true, false},
		{"codec at both ends, frames in the codec's pool", true, true, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			serverCodec, clientCodec := NewCodec(), NewCodec()
			srv := &kvServer{source: func(l kernels.KVLayout) PageSource { return patternPages{l} }}
			var opts []grpc.ServerOption
			if c.server {
				opts = append(opts, serverCodec.ServerOption())
			}
			if c.sender {
				srv.codec = serverCodec
			}
			var dopts []grpc.DialOption
			if strings.Contains(c.name, "frames") {
				dopts = append(dopts, clientCodec.DialOption())
			}
			client := serveKV(t, srv, opts, dopts...)
			var cc *Codec
			if c.client {
				cc = clientCodec
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			var wg sync.WaitGroup
			errs := make(chan error, 6)
			for i := range 6 {
				layout, prompt, window := testLayout, 40+37*i, 1+i
				if i%2 == 1 {
					layout = big
				}
				wg.Go(func() {
					sink := &checkSink{layout: layout, seen: map[[2]int]bool{}}
					rcv, err := pull(ctx, client, layout, prompt, window, sink, cc)
					if err != nil {
						errs <- fmt.Errorf("transfer %d: %w", i, err)
						return
					}
					if want := uint64(2 * prompt * layout.Layers * layout.RowBytes()); rcv.Bytes() != want {
						errs <- fmt.Errorf("transfer %d: %d bytes, want %d", i, rcv.Bytes(), want)
					}
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
			if n := clientCodec.outstanding(); n != 0 {
				t.Errorf("%d received chunks not released", n)
			}
			if n := serverCodec.lentLen(); n != 0 {
				t.Errorf("%d sent chunks still lent", n)
			}
		})
	}
}

func TestBufferPool(t *testing.T) {
	var p bufferPool
	for _, n := range []int{0, 1, 1024, 1025, 48 << 10, 240 << 10, 1 << 26, 1<<26 + 1} {
		b := p.Get(n)
		if len(*b) != n {
			t.Errorf("Get(%d) has length %d", n, len(*b))
		}
		if c := cap(*b); n <= 1<<26 && (c < n || c&(c-1) != 0) {
			t.Errorf("Get(%d) has capacity %d, want a power of two", n, c)
		}
		p.Put(b)
	}
	odd := make([]byte, 3000)
	p.Put(&odd) // not a size class: dropped, not handed out as a 2 KiB buffer
	for range 10 {
		if b := p.Get(2048); cap(*b) == 3000 {
			t.Fatal("a foreign buffer came out of the pool")
		}
	}
}

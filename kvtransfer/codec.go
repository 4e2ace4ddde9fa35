package kvtransfer

import (
	"fmt"
	"math/bits"
	"runtime"
	"sync"
	"unsafe"
	"weak"

	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"github.com/baton-serving/baton/kernels"
	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	protoenc "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/experimental"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// Codec is a gRPC codec (encoding.CodecV2) named "proto" that moves KV chunk
// bytes with as few copies as gRPC allows, and handles every other message
// exactly like gRPC's default codec, to which it hands them. Its wire format
// is the protobuf encoding, byte for byte what proto.Marshal writes, so a peer
// using the default codec reads and writes the same bytes.
//
// The default codec copies a chunk's K and V about five times between the
// page and the socket. Codec instead:
//
//   - on send, writes the few header bytes of a TransferKVResponse holding a
//     KVChunk itself and hands K and V to gRPC as they are (no copy); and
//   - on receive, copies K and V once, straight out of the HTTP/2 frame
//     buffers gRPC received, into buffers from its own pool.
//
// Buffer ownership:
//
//   - Sending. gRPC may still be writing a message's K and V after Send
//     returns, so a chunk's buffers must not be modified until gRPC lets go
//     of them. A Sender configured with this codec (SenderConfig.Codec)
//     takes K and V from the codec's pool and lends them to the codec for
//     the Send; Marshal hands them to gRPC as mem.Buffers whose release puts
//     them back in the pool, which happens only when gRPC has written them.
//     A chunk built elsewhere is sent without copying too, but is never
//     recycled: its K and V must stay unchanged after Send (it is safest to
//     never touch them again and let the garbage collector have them).
//   - Receiving. K and V of a received chunk belong to the caller, and stay
//     valid until the caller passes the chunk to Release, which returns them
//     to the pool and clears them. Calling Release is optional (unreleased
//     buffers are garbage collected), safe for chunks this codec did not
//     decode (it ignores them) and for chunks already released; after it,
//     no copy of the chunk's K or V slices may be used.
//
// A Codec is safe for concurrent use by any number of streams. Create one per
// process and use it for both the gRPC option and the Senders on the
// prefill server (ServerOption, SenderConfig.Codec), and for the call
// option, the connection's DialOption and Release on the decode client.
type Codec struct {
	fallback encoding.CodecV2
	pool     *bufferPool

	// lent holds the pooled buffers of chunks being sent, from just before a
	// Sender's Send to Marshal, which takes them over.
	lentMu sync.Mutex
	lent   map[*batonv1.KVChunk]*loan

	// decoded holds the pooled buffers of received chunks until Release.
	// Weak keys, and a cleanup that forgets chunks the caller dropped
	// without releasing, keep it from pinning memory nobody will release.
	decodedMu sync.Mutex
	decoded   map[weak.Pointer[batonv1.KVChunk]]*loan
}

// loan is a chunk's pooled K and V buffers (nil where K or V is empty).
type loan struct {
	k, v    *[]byte
	cleanup runtime.Cleanup // decoded chunks only
}

// NewCodec returns a Codec that falls back to the "proto" codec registered
// with gRPC (its default) for every message it does not special-case.
func NewCodec() *Codec {
	fb := encoding.GetCodecV2(protoenc.Name)
	if _, self := fb.(*Codec); self || fb == nil {
		// Someone registered a Codec as gRPC's default: falling back to it
		// would recurse.
		fb = plainProto{}
	}
	return &Codec{
		fallback: fb,
		pool:     &bufferPool{},
		lent:     make(map[*batonv1.KVChunk]*loan),
		decoded:  make(map[weak.Pointer[batonv1.KVChunk]]*loan),
	}
}

// Name is "proto": the codec speaks the protobuf wire format, so a peer
// needs no special codec to talk to it.
func (c *Codec) Name() string { return protoenc.Name }

// ServerOption installs the codec for every service of a gRPC server (on the
// prefill worker). Messages other than KV chunks go through gRPC's default
// codec unchanged.
func (c *Codec) ServerOption() grpc.ServerOption { return grpc.ForceServerCodecV2(c) }

// CallOption installs the codec for one call (the decode worker's
// TransferKV).
func (c *Codec) CallOption() grpc.CallOption { return grpc.ForceCodecV2(c) }

// DialOption (optional, for the decode worker's connections to prefill
// workers) makes gRPC read incoming HTTP/2 frames into buffers from the
// codec's pool. gRPC's own pool clears every buffer it hands out, a pass
// over every received byte that costs several percent of a transfer's CPU;
// this pool does not, because gRPC fills the buffers before reading them.
// It relies on grpc/experimental.
func (c *Codec) DialOption() grpc.DialOption { return experimental.WithBufferPool(c.pool) }

// MaxMessageBytes is the size of the largest TransferKVResponse a Sender
// with layout l and maxChunkBytes (0: DefaultMaxChunkBytes) sends. The
// decode side must accept messages that large: gRPC refuses messages over
// 4 MiB unless the call sets grpc.MaxCallRecvMsgSize.
func MaxMessageBytes(l kernels.KVLayout, maxChunkBytes int) int {
	if maxChunkBytes <= 0 {
		maxChunkBytes = DefaultMaxChunkBytes
	}
	n := LayersPerChunk(l, maxChunkBytes) * l.BlockBytes()
	// Field tags and lengths: at most 1+10 for the envelope, 1+10 for seq,
	// 4×(1+5) for the uint32 fields, 2×(1+10) for k and v, 1+5 for the
	// checksum.
	return 2*n + 11 + 11 + 24 + 22 + 6
}

// Marshal encodes v. A TransferKVResponse carrying a KVChunk is written here
// without copying K and V; everything else goes to the fallback codec.
func (c *Codec) Marshal(v any) (mem.BufferSlice, error) {
	r, ok := v.(*batonv1.TransferKVResponse)
	if !ok {
		return c.fallback.Marshal(v)
	}
	m, ok := r.GetMsg().(*batonv1.TransferKVResponse_KvChunk)
	if !ok || m.KvChunk == nil || len(r.ProtoReflect().GetUnknown()) > 0 || len(m.KvChunk.ProtoReflect().GetUnknown()) > 0 {
		// Nil chunks and unknown fields are rare enough to leave their
		// exact encoding to the protobuf library.
		return c.fallback.Marshal(v)
	}
	ch := m.KvChunk
	k, vb := c.payload(ch)

	size := chunkSize(ch)
	// One small allocation holds the three header pieces: the envelope and
	// fields 1-5 and k's tag and length; v's tag and length; the checksum.
	hdr := make([]byte, 0, 1+protowire.SizeVarint(uint64(size))+size-len(ch.K)-len(ch.V))
	hdr = protowire.AppendTag(hdr, 2, protowire.BytesType)
	hdr = protowire.AppendVarint(hdr, uint64(size))
	hdr = appendVarintField(hdr, 1, ch.Seq)
	hdr = appendVarintField(hdr, 2, uint64(ch.PageIndex))
	hdr = appendVarintField(hdr, 3, uint64(ch.LayerStart))
	hdr = appendVarintField(hdr, 4, uint64(ch.LayerEnd))
	hdr = appendVarintField(hdr, 5, uint64(ch.Tokens))
	out := make(mem.BufferSlice, 0, 5)
	hdr, out = appendBytesField(hdr, out, 6, k)
	hdr, out = appendBytesField(hdr, out, 7, vb)
	if hdr = appendVarintField(hdr, 8, uint64(ch.Checksum)); len(hdr) > 0 {
		out = append(out, mem.SliceBuffer(hdr))
	}
	return out, nil
}

// payload returns ch's K and V as mem.Buffers: pooled ones that go back to
// the pool when gRPC frees them if a Sender lent them, the slices themselves
// (never recycled) otherwise.
func (c *Codec) payload(ch *batonv1.KVChunk) (k, v mem.Buffer) {
	c.lentMu.Lock()
	l := c.lent[ch]
	delete(c.lent, ch)
	c.lentMu.Unlock()
	if l != nil && sameSlice(*l.k, ch.K) && sameSlice(*l.v, ch.V) {
		return mem.NewBuffer(l.k, c.pool), mem.NewBuffer(l.v, c.pool)
	}
	// A loan that no longer matches the chunk is dropped: the chunk may
	// still reference its buffers, so they must not be reused.
	return mem.SliceBuffer(ch.K), mem.SliceBuffer(ch.V)
}

func sameSlice(a, b []byte) bool {
	return len(a) == len(b) && unsafe.SliceData(a) == unsafe.SliceData(b)
}

// lend marks k and v, from the codec's pool, as ch's K and V for one Send.
func (c *Codec) lend(ch *batonv1.KVChunk, k, v *[]byte) {
	c.lentMu.Lock()
	c.lent[ch] = &loan{k: k, v: v}
	c.lentMu.Unlock()
}

// unlend ends the loan of ch's buffers after Send returns. If Marshal took
// them, gRPC recycles them; if not (Send failed first, or the server uses
// another codec, which may hold them without telling), they are left to the
// garbage collector, since nothing says gRPC is done with them.
func (c *Codec) unlend(ch *batonv1.KVChunk) {
	c.lentMu.Lock()
	delete(c.lent, ch)
	c.lentMu.Unlock()
}

// Release returns the K and V buffers of a chunk this codec decoded to its
// pool and sets them to nil. It ignores chunks the codec did not decode and
// chunks already released. The caller must not use any copy of the chunk's
// K or V slices afterwards.
func (c *Codec) Release(ch *batonv1.KVChunk) {
	if ch == nil {
		return
	}
	key := weak.Make(ch)
	c.decodedMu.Lock()
	l := c.decoded[key]
	delete(c.decoded, key)
	c.decodedMu.Unlock()
	if l == nil {
		return
	}
	l.cleanup.Stop()
	ch.K, ch.V = nil, nil
	runtime.KeepAlive(ch) // reachable until the cleanup is stopped
	for _, b := range []*[]byte{l.k, l.v} {
		if b != nil {
			c.pool.Put(b)
		}
	}
}

// forget drops the record of a decoded chunk that became unreachable
// without Release; its buffers go to the garbage collector, as the caller
// may still hold its K or V.
func (c *Codec) forget(key weak.Pointer[batonv1.KVChunk]) {
	c.decodedMu.Lock()
	delete(c.decoded, key)
	c.decodedMu.Unlock()
}

// outstanding is the number of decoded chunks not yet released or
// collected.
func (c *Codec) outstanding() int {
	c.decodedMu.Lock()
	defer c.decodedMu.Unlock()
	return len(c.decoded)
}

// Unmarshal decodes data into v. A TransferKVResponse that holds exactly one
// well-formed KVChunk without unknown fields is parsed here, copying K and V
// once into pooled buffers; anything else, including malformed input, goes
// to the fallback codec, which yields the protobuf library's result or error.
func (c *Codec) Unmarshal(data mem.BufferSlice, v any) error {
	r, ok := v.(*batonv1.TransferKVResponse)
	if !ok {
		return c.fallback.Unmarshal(data, v)
	}
	ch, l, ok := c.decodeChunk(data)
	if !ok {
		return c.fallback.Unmarshal(data, v)
	}
	r.Reset()
	r.Msg = &batonv1.TransferKVResponse_KvChunk{KvChunk: ch}
	if l != nil {
		key := weak.Make(ch)
		l.cleanup = runtime.AddCleanup(ch, c.forget, key)
		c.decodedMu.Lock()
		c.decoded[key] = l
		c.decodedMu.Unlock()
	}
	return nil
}

// decodeChunk parses a TransferKVResponse consisting of exactly one kv_chunk
// field whose fields are all known and of the expected wire types, and K and
// V at most once each. ok is false for anything else, which the protobuf
// library then decodes (merging repeated chunks, keeping unknown fields) or
// rejects.
func (c *Codec) decodeChunk(data mem.BufferSlice) (ch *batonv1.KVChunk, l *loan, ok bool) {
	r := bufReader{bufs: data, left: data.Len()}
	if tag, ok := r.varint(); !ok || tag != uint64(protowire.EncodeTag(2, protowire.BytesType)) {
		return nil, nil, false
	}
	if n, ok := r.varint(); !ok || n != uint64(r.left) {
		return nil, nil, false
	}
	ch = &batonv1.KVChunk{}
	var k, v *[]byte
	fail := func() (*batonv1.KVChunk, *loan, bool) {
		if k != nil {
			c.pool.Put(k)
		}
		if v != nil {
			c.pool.Put(v)
		}
		return nil, nil, false
	}
	for r.left > 0 {
		tag, ok := r.varint()
		if !ok {
			return fail()
		}
		num, typ := protowire.DecodeTag(tag)
		switch {
		case typ == protowire.VarintType && (num >= 1 && num <= 5 || num == 8):
			x, ok := r.varint()
			if !ok {
				return fail()
			}
			switch num {
			case 1:
				ch.Seq = x
			case 2:
				ch.PageIndex = uint32(x)
			case 3:
				ch.LayerStart = uint32(x)
			case 4:
				ch.LayerEnd = uint32(x)
			case 5:
				ch.Tokens = uint32(x)
			case 8:
				ch.Checksum = uint32(x)
			}
		case typ == protowire.BytesType && (num == 6 || num == 7):
			n, ok := r.varint()
			if !ok || n > uint64(r.left) {
				return fail()
			}
			dst, buf := &ch.K, &k
			if num == 7 {
				dst, buf = &ch.V, &v
			}
			if *buf != nil || *dst != nil {
				return fail() // a repeated k or v: rare, left to the library
			}
			if n == 0 {
				continue // the library decodes an empty bytes field as nil
			}
			*buf = c.pool.Get(int(n))
			r.read(**buf)
			*dst = **buf
		default:
			return fail()
		}
	}
	if k == nil && v == nil {
		return ch, nil, true
	}
	return ch, &loan{k: k, v: v}, true
}

// bufReader reads a mem.BufferSlice front to back without copying it first.
type bufReader struct {
	bufs mem.BufferSlice
	cur  []byte // unread part of the current buffer
	left int    // bytes left in all buffers
}

func (r *bufReader) fill() bool {
	for len(r.cur) == 0 {
		if len(r.bufs) == 0 {
			return false
		}
		r.cur, r.bufs = r.bufs[0].ReadOnlyData(), r.bufs[1:]
	}
	return true
}

// varint reads a base-128 varint, refusing what protowire.ConsumeVarint
// refuses (truncation, more than 64 bits).
func (r *bufReader) varint() (uint64, bool) {
	var x uint64
	for i := 0; i < 10; i++ {
		if !r.fill() {
			return 0, false
		}
		b := r.cur[0]
		r.cur, r.left = r.cur[1:], r.left-1
		if i == 9 && b > 1 {
			return 0, false
		}
		x |= uint64(b&0x7f) << (7 * i)
		if b < 0x80 {
			return x, true
		}
	}
	return 0, false
}

// read fills dst, which the caller has checked is at most r.left bytes.
func (r *bufReader) read(dst []byte) {
	for len(dst) > 0 && r.fill() {
		n := copy(dst, r.cur)
		dst, r.cur, r.left = dst[n:], r.cur[n:], r.left-n
	}
}

// chunkSize is the encoded size of ch, as proto.Size computes it.
func chunkSize(ch *batonv1.KVChunk) int {
	n := varintFieldSize(ch.Seq) + varintFieldSize(uint64(ch.PageIndex)) +
		varintFieldSize(uint64(ch.LayerStart)) + varintFieldSize(uint64(ch.LayerEnd)) +
		varintFieldSize(uint64(ch.Tokens)) + varintFieldSize(uint64(ch.Checksum))
	for _, b := range [][]byte{ch.K, ch.V} {
		if len(b) > 0 {
			n += 1 + protowire.SizeVarint(uint64(len(b))) + len(b)
		}
	}
	return n
}

// varintFieldSize is the size of a proto3 scalar field with a one-byte tag,
// which is omitted when zero.
func varintFieldSize(x uint64) int {
	if x == 0 {
		return 0
	}
	return 1 + protowire.SizeVarint(x)
}

func appendVarintField(b []byte, num protowire.Number, x uint64) []byte {
	if x == 0 {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.VarintType)
	return protowire.AppendVarint(b, x)
}

// appendBytesField adds bytes field num, holding b, to a message being
// built as out: its tag and length go at the end of hdr, which then goes
// into out ahead of b, uncopied. An empty b is not written (proto3 leaves
// empty bytes out) and is freed. It returns the rest of hdr's capacity for
// the next piece, and out.
func appendBytesField(hdr []byte, out mem.BufferSlice, num protowire.Number, b mem.Buffer) ([]byte, mem.BufferSlice) {
	if b.Len() == 0 {
		b.Free()
		return hdr, out
	}
	hdr = protowire.AppendTag(hdr, num, protowire.BytesType)
	hdr = protowire.AppendVarint(hdr, uint64(b.Len()))
	return hdr[len(hdr):], append(out, mem.SliceBuffer(hdr), b)
}

// plainProto is the fallback when gRPC's default codec is unavailable: the
// protobuf library on contiguous bytes.
type plainProto struct{}

func (plainProto) Name() string { return protoenc.Name }

func (plainProto) Marshal(v any) (mem.BufferSlice, error) {
	m, ok := v.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("kvtransfer codec: cannot marshal %T, not a proto.Message", v)
	}
	b, err := proto.Marshal(m)
	if err != nil {
		return nil, err
	}
	return mem.BufferSlice{mem.SliceBuffer(b)}, nil
}

func (plainProto) Unmarshal(data mem.BufferSlice, v any) error {
	m, ok := v.(proto.Message)
	if !ok {
		return fmt.Errorf("kvtransfer codec: cannot unmarshal into %T, not a proto.Message", v)
	}
	return proto.Unmarshal(data.Materialize(), m)
}

// bufferPool recycles K and V buffers in power-of-two size classes. Unlike
// gRPC's pools it does not clear buffers: every user overwrites all of a
// buffer's length before reading it.
type bufferPool struct {
	classes [maxClassShift - minClassShift + 1]sync.Pool
}

const (
	// Below 1 KiB mem.NewBuffer does not pool, so neither does this.
	minClassShift = 10
	// 64 MiB: larger chunks are allocated and collected.
	maxClassShift = 26
)

// class is the index of the smallest size class that holds n bytes, or -1.
func class(n int) int {
	if n > 1<<maxClassShift {
		return -1
	}
	if n <= 1<<minClassShift {
		return 0
	}
	return bits.Len(uint(n-1)) - minClassShift
}

// Get returns a buffer of length n (contents unspecified).
func (p *bufferPool) Get(n int) *[]byte {
	i := class(n)
	if i < 0 {
		b := make([]byte, n)
		return &b
	}
	if b, ok := p.classes[i].Get().(*[]byte); ok {
		*b = (*b)[:n]
		return b
	}
	b := make([]byte, n, 1<<(i+minClassShift))
	return &b
}

// Put recycles b if it is one of the pool's buffers (its capacity a size
// class) and drops it otherwise.
func (p *bufferPool) Put(b *[]byte) {
	n := cap(*b)
	if i := class(n); i >= 0 && n == 1<<(i+minClassShift) {
		p.classes[i].Put(b)
	}
}

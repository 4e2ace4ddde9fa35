package kvtransfer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"github.com/baton-serving/baton/kernels"
)

// PageSource reads a request's KV pages at the prefill worker.
type PageSource interface {
	// CopyPage copies the keys and values of layers [lo, hi) for the first
	// tokens slots of the request's page p into k and v, which are sized for
	// them, in the layout's byte order: for each layer, [token][kv_head][head_dim].
	CopyPage(p, lo, hi, tokens int, k, v []byte) error
}

// SendStream is the part of the TransferKV server stream the Sender uses.
// Only the Sender's writer goroutine calls Send. A Send blocked on flow
// control must return once the stream ends, as gRPC's does when its
// handler returns.
type SendStream interface {
	Send(*batonv1.TransferKVResponse) error
}

// Sender is the prefill end of one transfer: a single goroutine (Run) that
// decides what to send, and the writer goroutine it starts, the only caller
// of the stream's Send. The scheduler and the stream's receive loop tell Run
// what to do through methods that never block: they record state and wake
// it. So a slow or dead decode worker stalls only its own request, never the
// prefill batch; and a Send stuck on flow control (decode stopped reading,
// the network black-holed) stalls only the writer, which Run stops waiting
// for at the send deadline.
type Sender struct {
	layout       kernels.KVLayout
	src          PageSource
	stream       SendStream
	promptTokens int
	firstPage    int
	layersPer    int
	creditWait   time.Duration
	sendWait     time.Duration
	heartbeat    time.Duration
	codec        *Codec // nil: chunk buffers are allocated per chunk

	wake chan struct{} // capacity 1: coalesced notifications

	mu      sync.Mutex
	ready   int // pages [0, ready) are final and may be sent
	credits int
	done    *batonv1.PrefillDone
	fail    *batonv1.Error
	abort   string // non-empty: decode asked to stop
	aborted bool

	// Progress of the goroutine; read through Stats.
	sent  uint64
	bytes uint64
}

// SenderConfig configures a Sender.
type SenderConfig struct {
	Layout         kernels.KVLayout
	PromptTokens   int
	InitialCredits int
	// FirstPage is the first page sent: decode holds the pages before it
	// (Handshake.cached_page_hashes, Accepted.skipped_pages).
	FirstPage int
	// MaxChunkBytes bounds a chunk's K+V bytes (default 256 KiB).
	MaxChunkBytes int
	// CreditTimeout ends the transfer with ErrStalled when chunks are ready
	// but decode grants no credit for this long (0: wait forever).
	CreditTimeout time.Duration
	// SendTimeout ends the transfer with ErrSendStalled when one message
	// (a chunk of at most MaxChunkBytes, or a control message) takes longer
	// than this to go out (0: wait until the stream ends). gRPC's Send
	// blocks while the peer's flow-control windows are exhausted, which
	// with credits outstanding only a peer that stopped reading, or a
	// network that stopped delivering, leaves them for long; without a
	// deadline the pages would be held until the stream's own deadline.
	SendTimeout time.Duration
	// Heartbeat sends a Progress message whenever nothing else has been
	// sent for this long (0: never), so that the receiver's idle deadline
	// measures a silent peer or network rather than a long queue or a long
	// prompt.
	Heartbeat time.Duration
	// Codec should be the codec installed on the gRPC server
	// (Codec.ServerOption). Chunk buffers then come from its pool and go
	// back to it once gRPC has written them, instead of being allocated
	// (and zeroed) for every chunk; with any other codec on the server they
	// are left to the garbage collector, which is safe but slower. Without
	// it (nil), chunks still go out without copies if the server uses a
	// Codec, but cost an allocation each. Pooled buffers are not cleared:
	// the PageSource must fill all of k and v, as its contract says.
	Codec *Codec
}

// DefaultMaxChunkBytes keeps chunks well above gRPC's per-message overhead and
// below the sizes at which copies stop fitting in cache. Measured over
// loopback with the 110M model's layout (bench_test.go): chunks of 48 and
// 96 KiB cost 10-50% more CPU per byte; 256 to 576 KiB were within noise of
// each other; and 1 MiB messages ran 10-15% slower than 256 KiB ones in
// the measurements of shared/TOOLCHAIN.md.
const DefaultMaxChunkBytes = 256 << 10

// NewSender prepares the sending end of a transfer. Run must be called to
// send anything.
func NewSender(cfg SenderConfig, src PageSource, stream SendStream) *Sender {
	if cfg.MaxChunkBytes <= 0 {
		cfg.MaxChunkBytes = DefaultMaxChunkBytes
	}
	return &Sender{
		layout: cfg.Layout, src: src, stream: stream, promptTokens: cfg.PromptTokens,
		firstPage: cfg.FirstPage, layersPer: LayersPerChunk(cfg.Layout, cfg.MaxChunkBytes), creditWait: cfg.CreditTimeout,
		sendWait: cfg.SendTimeout, heartbeat: cfg.Heartbeat, codec: cfg.Codec, credits: cfg.InitialCredits, wake: make(chan struct{}, 1),
	}
}

func (s *Sender) notify() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// PagesReady says that the request's first n pages hold their final keys
// and values and may be sent. Never blocks.
func (s *Sender) PagesReady(n int) {
	s.mu.Lock()
	if n > s.ready {
		s.ready = n
	}
	s.mu.Unlock()
	s.notify()
}

// Finish says the prompt is done: every page is final, and done is sent
// after the last chunk. Never blocks.
func (s *Sender) Finish(done *batonv1.PrefillDone) {
	s.mu.Lock()
	s.ready = s.layout.PagesFor(s.promptTokens)
	s.done = done
	s.mu.Unlock()
	s.notify()
}

// Fail ends the transfer with an Error message. Never blocks.
func (s *Sender) Fail(code int32, msg string) {
	s.mu.Lock()
	if s.fail == nil {
		s.fail = &batonv1.Error{Code: code, Message: msg}
	}
	s.mu.Unlock()
	s.notify()
}

// AddCredits grants permission to send n more chunks. Never blocks.
func (s *Sender) AddCredits(n int) {
	s.mu.Lock()
	s.credits += n
	s.mu.Unlock()
	s.notify()
}

// Abort stops sending; Run answers with AbortAck and returns ErrAborted.
// The caller must stop touching the request's pages before Run sends the
// ack, which Run guarantees by not reading pages after it sees the abort.
func (s *Sender) Abort(reason string) {
	s.mu.Lock()
	if !s.aborted {
		s.aborted = true
		s.abort = reason
	}
	s.mu.Unlock()
	s.notify()
}

// ErrAborted is returned by Run when decode aborted the transfer.
var ErrAborted = errors.New("transfer aborted by decode")

// ErrStalled is returned, wrapped, by Run when the transfer made no
// progress for its deadline: decode granted no credit (CreditTimeout) or a
// send did not go out (ErrSendStalled, SendTimeout).
var ErrStalled = errors.New("transfer stalled")

// ErrSendStalled is the ErrStalled of a send that made no progress for
// SenderConfig.SendTimeout.
var ErrSendStalled = fmt.Errorf("%w: a send made no progress", ErrStalled)

// Stats reports chunks and K/V bytes sent so far.
func (s *Sender) Stats() (chunks, bytes uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sent, s.bytes
}

// Run sends chunks as pages become ready and credits allow, then
// PrefillDone; or AbortAck after Abort; or Error after Fail. It returns when
// the transfer is over, when ctx ends (the stream is gone), or when a
// deadline passes without progress (ErrStalled). Its writer goroutine
// calls the stream's Send; when Run returns after a send that did not go
// out in time (ErrSendStalled) or with ctx, that Send may still be blocked,
// and the writer ends with it when the stream ends: the caller must end the
// stream (return from the handler) promptly. The writer holds only its
// chunk's copy of the pages, never the pages themselves, so they may be
// released as soon as Run returns.
func (s *Sender) Run(ctx context.Context) error {
	w := s.startWriter()
	defer w.stop()
	page, lo := s.firstPage, 0
	var seq uint64
	var starved *time.Timer // runs while chunks wait for credit
	var beat *time.Timer    // the next heartbeat
	defer func() {
		if starved != nil {
			starved.Stop()
		}
		if beat != nil {
			beat.Stop()
		}
	}()
	lastSend := time.Now() // the handshake's answer went just before Run
	for {
		s.mu.Lock()
		aborted, reason, fail, done := s.aborted, s.abort, s.fail, s.done
		blocked := page < s.ready && s.credits == 0
		canSend := page < s.ready && s.credits > 0
		if canSend {
			s.credits--
		}
		s.mu.Unlock()

		switch {
		case aborted:
			if err := w.send(ctx, &batonv1.TransferKVResponse{Msg: &batonv1.TransferKVResponse_AbortAck{
				AbortAck: &batonv1.AbortAck{Reason: reason}}}, "abort ack"); err != nil {
				return err
			}
			return ErrAborted
		case fail != nil:
			if err := w.send(ctx, &batonv1.TransferKVResponse{Msg: &batonv1.TransferKVResponse_Error{Error: fail}}, "error"); err != nil {
				return err
			}
			return fmt.Errorf("transfer failed: %s", fail.GetMessage())
		case canSend:
			hi := min(lo+s.layersPer, s.layout.Layers)
			chunk, err := s.chunk(seq, page, lo, hi)
			if err != nil {
				s.Fail(13, err.Error()) // INTERNAL
				continue
			}
			n := uint64(len(chunk.K) + len(chunk.V))
			// The chunk is the writer's now.
			if err := w.send(ctx, &batonv1.TransferKVResponse{Msg: &batonv1.TransferKVResponse_KvChunk{KvChunk: chunk}}, fmt.Sprintf("chunk %d", seq)); err != nil {
				return err
			}
			s.mu.Lock()
			s.sent++
			s.bytes += n
			s.mu.Unlock()
			lastSend = time.Now()
			seq++
			if lo = hi; lo == s.layout.Layers {
				page, lo = page+1, 0
			}
			continue
		case done != nil && page == s.layout.PagesFor(s.promptTokens):
			done.ChunksSent, done.BytesSent = s.Stats()
			if err := w.send(ctx, &batonv1.TransferKVResponse{Msg: &batonv1.TransferKVResponse_PrefillDone{PrefillDone: done}}, "prefill done"); err != nil {
				return err
			}
			return nil
		}
		var beatC <-chan time.Time
		if s.heartbeat > 0 {
			wait := s.heartbeat - time.Since(lastSend)
			if wait <= 0 {
				s.mu.Lock()
				ready := s.ready
				s.mu.Unlock()
				if err := w.send(ctx, &batonv1.TransferKVResponse{Msg: &batonv1.TransferKVResponse_Progress{
					Progress: &batonv1.Progress{PagesReady: uint32(ready)}}}, "progress"); err != nil {
					return err
				}
				lastSend = time.Now()
				continue
			}
			if beat == nil {
				beat = time.NewTimer(wait)
			} else {
				beat.Reset(wait)
			}
			beatC = beat.C
		}
		var starvedC <-chan time.Time
		switch {
		case blocked && s.creditWait > 0:
			if starved == nil {
				starved = time.NewTimer(s.creditWait)
			}
			starvedC = starved.C
		case starved != nil:
			starved.Stop()
			starved = nil
		}
		select {
		case <-s.wake:
		case <-starvedC:
			return fmt.Errorf("%w: decode granted no credit for %v with chunk %d ready", ErrStalled, s.creditWait, seq)
		case <-beatC:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// writer is a Sender's one caller of the stream's Send, on a goroutine of
// its own so that Run can stop waiting for a Send that makes no progress:
// gRPC's Send cannot be interrupted but by the end of its stream.
type writer struct {
	stream SendStream
	codec  *Codec
	wait   time.Duration // the send deadline; 0: none
	timer  *time.Timer   // the send deadline's, reused
	msgs   chan *batonv1.TransferKVResponse
	// errs carries each Send's result back; its one slot takes the result
	// of a Send that Run stopped waiting for, so the goroutine never blocks
	// on it.
	errs chan error
}

func (s *Sender) startWriter() *writer {
	w := &writer{stream: s.stream, codec: s.codec, wait: s.sendWait,
		msgs: make(chan *batonv1.TransferKVResponse, 1), errs: make(chan error, 1)}
	go w.loop()
	return w
}

// loop sends each message it is handed until stop. It outlives Run only
// while a Send that Run gave up on is still blocked: until the stream ends.
func (w *writer) loop() {
	for m := range w.msgs {
		err := w.stream.Send(m)
		if c := m.GetKvChunk(); c != nil && w.codec != nil {
			// From here the buffers are gRPC's to release (or, if the
			// codec did not marshal them, the collector's).
			w.codec.unlend(c)
		}
		w.errs <- err
	}
}

// send hands m to the writer and waits until it has gone out, at most the
// send deadline (ErrSendStalled), or until ctx ends. Any error ends Run:
// the writer is idle whenever send is called, so handing m over never
// blocks.
func (w *writer) send(ctx context.Context, m *batonv1.TransferKVResponse, what string) error {
	w.msgs <- m
	var deadline <-chan time.Time
	if w.wait > 0 {
		if w.timer == nil {
			w.timer = time.NewTimer(w.wait)
		} else {
			w.timer.Reset(w.wait)
		}
		deadline = w.timer.C
	}
	select {
	case err := <-w.errs:
		return w.sent(err, what)
	case <-deadline:
		return fmt.Errorf("%w: %s did not go out within %v", ErrSendStalled, what, w.wait)
	case <-ctx.Done():
		// A message that went out is not undone by a cancel that came
		// after it: when decode half-closes on PrefillDone, the end of its
		// stream cancels ctx while the writer reports the Send, and select
		// would pick either at random. The writer's result wins if it is
		// there.
		select {
		case err := <-w.errs:
			return w.sent(err, what)
		default:
		}
		return ctx.Err()
	}
}

// sent is send's result once the writer has reported the Send's error.
func (w *writer) sent(err error, what string) error {
	if w.timer != nil {
		w.timer.Stop()
	}
	if err != nil {
		return fmt.Errorf("sending %s: %w", what, err)
	}
	return nil
}

// stop lets the writer's goroutine end once its Send, if any, returns.
func (w *writer) stop() {
	if w.timer != nil {
		w.timer.Stop()
	}
	close(w.msgs)
}

// tokensIn is the number of prompt tokens in page p.
func (s *Sender) tokensIn(p int) int {
	return min(s.layout.PageSize, s.promptTokens-p*s.layout.PageSize)
}

func (s *Sender) chunk(seq uint64, p, lo, hi int) (*batonv1.KVChunk, error) {
	tokens := s.tokensIn(p)
	n := (hi - lo) * tokens * s.layout.RowBytes()
	var kb, vb *[]byte
	if s.codec != nil {
		kb, vb = s.codec.pool.Get(n), s.codec.pool.Get(n)
	} else {
		k, v := make([]byte, n), make([]byte, n)
		kb, vb = &k, &v
	}
	k, v := *kb, *vb
	if err := s.src.CopyPage(p, lo, hi, tokens, k, v); err != nil {
		if s.codec != nil {
			s.codec.pool.Put(kb)
			s.codec.pool.Put(vb)
		}
		return nil, fmt.Errorf("reading page %d layers %d-%d: %w", p, lo, hi, err)
	}
	c := &batonv1.KVChunk{
		Seq: seq, PageIndex: uint32(p), LayerStart: uint32(lo), LayerEnd: uint32(hi),
		Tokens: uint32(tokens), K: k, V: v, Checksum: Checksum(k, v),
	}
	if s.codec != nil {
		s.codec.lend(c, kb, vb)
	}
	return c, nil
}

package kvtransfer

import (
	"fmt"

	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"github.com/baton-serving/baton/kernels"
)

// PageSink writes a request's KV pages at the decode worker.
type PageSink interface {
	// WritePage copies k and v — layers [lo, hi) for the first tokens slots
	// of the request's page p, in the layout's byte order — into the page.
	WritePage(p, lo, hi, tokens int, k, v []byte) error
}

// Receiver is the decode end of one transfer: it checks every chunk (order,
// bounds, sizes, checksum) before writing it into the reserved pages, and
// decides when to grant more credits.
type Receiver struct {
	layout       kernels.KVLayout
	sink         PageSink
	promptTokens int
	window       int

	// held leading pages already hold the prompt's keys and values
	// (decode's prefix cache had them; they are shared, so never written);
	// skipped of them prefill does not send (Accepted.skipped_pages).
	held, skipped int
	started       bool // a chunk arrived: Skip comes too late

	nextSeq  uint64
	page, lo int // the next (page, first layer) expected
	pending  int // chunks consumed since the last grant
	bytes    uint64
}

// NewReceiver prepares to receive the KV cache of a promptTokens-token
// prompt with window chunks of credit outstanding.
func NewReceiver(layout kernels.KVLayout, promptTokens, window int, sink PageSink) *Receiver {
	return &Receiver{layout: layout, sink: sink, promptTokens: promptTokens, window: max(window, 1)}
}

// Hold says, before the transfer starts, that the first n pages already hold
// the prompt's keys and values (the handshake offers their hashes): chunks
// for them are still checked but never written, since those pages are
// shared with the prefix cache. At most the full pages before the page of
// the prompt's last token may be held.
func (r *Receiver) Hold(n int) error {
	if n < 0 || n > r.layout.PagesFor(r.promptTokens)-1 {
		return fmt.Errorf("kvtransfer: %d held pages of a %d-token prompt (%d pages)", n, r.promptTokens, r.layout.PagesFor(r.promptTokens))
	}
	r.held = n
	return nil
}

// Skip applies prefill's Accepted.skipped_pages: the first chunk will be for
// page n. Prefill may skip only pages decode holds, and says so before its
// first chunk.
func (r *Receiver) Skip(n int) error {
	switch {
	case n > r.held:
		return fmt.Errorf("prefill skips %d pages, decode holds %d", n, r.held)
	case r.started && n != r.skipped:
		return fmt.Errorf("prefill skips %d pages after its first chunk", n)
	}
	r.skipped, r.page = n, n
	return nil
}

// Skipped is the number of leading pages prefill did not send.
func (r *Receiver) Skipped() int { return r.skipped }

// Window is the number of chunks to grant in the handshake.
func (r *Receiver) Window() int { return r.window }

// Bytes is the K and V bytes received so far.
func (r *Receiver) Bytes() uint64 { return r.bytes }

// Chunks is the number of chunks received so far.
func (r *Receiver) Chunks() uint64 { return r.nextSeq }

// Chunk validates c and writes it into the pages. It returns how many credits
// to grant now (0 most of the time: credits are returned in batches of half
// the window to keep control messages rare). Chunk reads c's K and V only
// during the call: once it returns, a chunk decoded by a Codec may be given
// back with Codec.Release, whatever the result.
func (r *Receiver) Chunk(c *batonv1.KVChunk) (grant int, err error) {
	pages := r.layout.PagesFor(r.promptTokens)
	lo, hi, p := int(c.GetLayerStart()), int(c.GetLayerEnd()), int(c.GetPageIndex())
	switch {
	case c.GetSeq() != r.nextSeq:
		return 0, fmt.Errorf("kv chunk seq %d, want %d", c.GetSeq(), r.nextSeq)
	case p >= pages:
		return 0, fmt.Errorf("kv chunk %d: page %d, the prompt has %d pages", c.GetSeq(), p, pages)
	case p != r.page || lo != r.lo:
		return 0, fmt.Errorf("kv chunk %d: page %d layer %d, want page %d layer %d", c.GetSeq(), p, lo, r.page, r.lo)
	case hi <= lo || hi > r.layout.Layers:
		return 0, fmt.Errorf("kv chunk %d: layers [%d, %d) outside [0, %d)", c.GetSeq(), lo, hi, r.layout.Layers)
	}
	tokens := min(r.layout.PageSize, r.promptTokens-p*r.layout.PageSize)
	if int(c.GetTokens()) != tokens {
		return 0, fmt.Errorf("kv chunk %d: %d tokens in page %d, want %d", c.GetSeq(), c.GetTokens(), p, tokens)
	}
	want := (hi - lo) * tokens * r.layout.RowBytes()
	if len(c.GetK()) != want || len(c.GetV()) != want {
		return 0, fmt.Errorf("kv chunk %d: %d K and %d V bytes, want %d each", c.GetSeq(), len(c.GetK()), len(c.GetV()), want)
	}
	if sum := Checksum(c.GetK(), c.GetV()); sum != c.GetChecksum() {
		return 0, fmt.Errorf("kv chunk %d: checksum %08x, computed %08x", c.GetSeq(), c.GetChecksum(), sum)
	}
	// A held page already has these bytes, and other holders read it: a
	// prefill that sends it anyway (one that predates skipped_pages) is
	// checked above and ignored here.
	if p >= r.held {
		if err := r.sink.WritePage(p, lo, hi, tokens, c.GetK(), c.GetV()); err != nil {
			return 0, fmt.Errorf("kv chunk %d: %w", c.GetSeq(), err)
		}
	}
	r.started = true
	r.nextSeq++
	r.bytes += uint64(2 * want)
	if r.lo = hi; r.lo == r.layout.Layers {
		r.page, r.lo = r.page+1, 0
	}
	r.pending++
	if r.pending >= (r.window+1)/2 {
		grant, r.pending = r.pending, 0
	}
	return grant, nil
}

// Complete checks, when PrefillDone arrives, that every page and layer of the
// prompt was received.
func (r *Receiver) Complete(done *batonv1.PrefillDone) error {
	pages := r.layout.PagesFor(r.promptTokens)
	if r.page != pages || r.lo != 0 {
		return fmt.Errorf("prefill done after page %d layer %d of %d pages", r.page, r.lo, pages)
	}
	if done.GetChunksSent() != 0 && done.GetChunksSent() != r.nextSeq {
		return fmt.Errorf("prefill done reports %d chunks sent, %d received", done.GetChunksSent(), r.nextSeq)
	}
	return nil
}

package model

import (
	"fmt"

	"github.com/baton-serving/baton/engine"
	"github.com/baton-serving/baton/engine/kvcache"
)

// Chunk is one sequence's part of a batched step over a paged KV cache:
// consecutive tokens at positions Pos…Pos+len(Tokens)-1. A decoding
// sequence contributes one token, a prefilling one a chunk of its prompt.
type Chunk struct {
	Tokens []int32
	// Pos is the position of Tokens[0]; positions 0…Pos-1 must already be
	// stored in Pages.
	Pos int
	// Pages is the sequence's block table: position i lives in slot
	// i mod PageSize of page Pages[i/PageSize]. It must cover every
	// position of the chunk.
	Pages []kvcache.PageID
	// Logits, when not nil, receives the next-token logits after the last
	// token (Config().Vocab of them).
	Logits []float32
	// RowLogits, when not nil, is called for every token of the chunk, in
	// order, with the next-token logits after Tokens[i] (Config().Vocab of
	// them): a prompt's log-probabilities (echo) need every position's.
	// The slice is the model's scratch space, valid only during the call;
	// the callback must not keep or modify it. It runs on the goroutine
	// that called ForwardBatch, before ForwardBatch returns, and only when
	// the step succeeds up to the output head. Only chunks that set it pay:
	// their rows go through the last block and the output head, which the
	// model computes a bounded group of rows at a time (headGroupRows), so
	// a long chunk never holds len(Tokens)×Vocab logits at once.
	RowLogits func(i int, logits []float32)
}

// ForwardBatch implements Model.
func (m *decoder) ForwardBatch(kv *kvcache.Pool, batch []Chunk) error {
	c := m.cfg
	if kv == nil {
		return fmt.Errorf("model: nil KV cache pool: %w", engine.ErrInvalidInput)
	}
	if len(batch) == 0 {
		return fmt.Errorf("model: empty batch: %w", engine.ErrInvalidInput)
	}
	l := kv.Layout()
	if l.Layers != c.Layers || l.KVHeads != c.KVHeads || l.HeadDim != c.HeadDim {
		return fmt.Errorf("model: KV cache pages of %d layers × %d KV heads × %d, model needs %d × %d × %d: %w",
			l.Layers, l.KVHeads, l.HeadDim, c.Layers, c.KVHeads, c.HeadDim, engine.ErrInvalidInput)
	}
	total := kv.Stats().Total
	for i, ch := range batch {
		n := len(ch.Tokens)
		switch {
		case n == 0:
			return fmt.Errorf("model: batch chunk %d has no tokens: %w", i, engine.ErrInvalidInput)
		case ch.Pos < 0:
			return fmt.Errorf("model: batch chunk %d at position %d: %w", i, ch.Pos, engine.ErrInvalidInput)
		case ch.Logits != nil && len(ch.Logits) != c.Vocab:
			return fmt.Errorf("model: batch chunk %d: logits buffer of %d, want the vocabulary size %d: %w", i, len(ch.Logits), c.Vocab, engine.ErrInvalidInput)
		case ch.Pos+n > c.ContextLength:
			return fmt.Errorf("model: batch chunk %d: positions %d…%d exceed the context window of %d: %w",
				i, ch.Pos, ch.Pos+n-1, c.ContextLength, engine.ErrContextOverflow)
		case l.PagesFor(ch.Pos+n) > len(ch.Pages):
			return fmt.Errorf("model: batch chunk %d: %d pages of %d positions cannot hold positions up to %d: %w",
				i, len(ch.Pages), l.PageSize, ch.Pos+n-1, engine.ErrInvalidInput)
		}
		for _, id := range ch.Pages[:l.PagesFor(ch.Pos+n)] {
			if id < 0 || int(id) >= total {
				return fmt.Errorf("model: batch chunk %d: page %d outside the pool's %d pages: %w", i, id, total, engine.ErrInvalidInput)
			}
		}
		if err := m.checkTokens(ch.Tokens, fmt.Sprintf("batch chunk %d: ", i)); err != nil {
			return err
		}
	}

	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.closed {
		return ErrClosed
	}
	kvh, err := kv.On(m.be)
	if err != nil {
		return err
	}
	s := m.state()
	defer m.putState(s)
	// The block tables as the backend takes them, side by side in one
	// buffer.
	np := 0
	for _, ch := range batch {
		np += l.PagesFor(ch.Pos + len(ch.Tokens))
	}
	s.pages = grow(s.pages, np)
	s.segs = s.segs[:0]
	np = 0
	for _, ch := range batch {
		pages := s.pages[np : np+l.PagesFor(ch.Pos+len(ch.Tokens))]
		for i := range pages {
			pages[i] = int32(ch.Pages[i])
		}
		np += len(pages)
		s.segs = append(s.segs, segment{tokens: ch.Tokens, pos: ch.Pos, pages: pages, logits: ch.Logits, rowLogits: ch.RowLogits})
	}
	return m.forward(s, kvh, l.PageSize)
}

// rowInfo locates one token row of a step: its segment, position, and row
// index in the step.
type rowInfo struct {
	seg, pos, row int
}

// segment is one sequence's tokens in a forward call, with its block
// table.
type segment struct {
	tokens    []int32
	pos       int
	pages     []int32
	logits    []float32
	rowLogits func(i int, logits []float32)
}

// outRow is a row whose next-token logits the step computes: its segment
// and its index among the segment's tokens.
type outRow struct {
	seg, tok int
}

// headGroupRows bounds the rows the output head computes at once when a
// chunk asks for every row's logits (Chunk.RowLogits): the logits scratch
// holds at most this many rows of Vocab floats, whatever the chunk's
// length. Steps without such a chunk compute all their rows at once, as
// before.
const headGroupRows = 32

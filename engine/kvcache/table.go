package kvcache

import (
	"fmt"
	"slices"

	"github.com/baton-serving/baton/engine"
)

// BlockTable is one sequence's list of pages in position order: position i
// lives in slot i mod PageSize of page Pages()[i / PageSize]. It holds one
// reference to each of its pages. A BlockTable is owned by one goroutine
// (the scheduler's); it is not safe for concurrent use.
type BlockTable struct {
	pool  *Pool
	pages []PageID
}

// NewTable returns an empty block table over p.
func (p *Pool) NewTable() *BlockTable { return &BlockTable{pool: p} }

// Pages returns the table's pages. The slice aliases the table and is valid
// until the next Grow, Share or Release.
func (t *BlockTable) Pages() []PageID { return t.pages }

// Len returns the number of pages held.
func (t *BlockTable) Len() int { return len(t.pages) }

// Cap returns the number of positions the pages can hold.
func (t *BlockTable) Cap() int { return len(t.pages) * t.pool.layout.PageSize }

// Grow makes the table hold at least positions positions, allocating the
// missing pages all together or none: when too few are free the error wraps
// engine.ErrKVCacheFull.
func (t *BlockTable) Grow(positions int) error {
	need := t.pool.layout.PagesFor(positions) - len(t.pages)
	if need <= 0 {
		return nil
	}
	pages, err := t.pool.AppendAlloc(t.pages, need)
	if err != nil {
		return fmt.Errorf("kvcache: grow a sequence to %d positions: %w", positions, err)
	}
	t.pages = pages
	return nil
}

// Share appends pages held elsewhere (a shared prefix), adding a reference to
// each; they must be in use.
func (t *BlockTable) Share(ids ...PageID) error {
	if err := t.pool.Retain(ids...); err != nil {
		return err
	}
	t.pages = append(t.pages, ids...)
	return nil
}

// Release drops the table's reference to every page it holds and empties
// it. Releasing an empty table does nothing, so Release is idempotent.
func (t *BlockTable) Release() error {
	if len(t.pages) == 0 {
		return nil
	}
	err := t.pool.Release(t.pages...)
	t.pages = t.pages[:0]
	if err != nil {
		return fmt.Errorf("kvcache: release a sequence's pages: %w", err)
	}
	return nil
}

// Clone returns a copy of the page list.
func (t *BlockTable) Clone() []PageID { return slices.Clone(t.pages) }

// AttachPrefix makes an empty table start with the cached pages that hold
// tokens' longest cached run of full pages, at most maxPages of them (see
// Pool.MatchPrefix), and returns how many it attached.
func (t *BlockTable) AttachPrefix(tokens []int32, maxPages int) (int, error) {
	if len(t.pages) != 0 {
		return 0, fmt.Errorf("kvcache: attach a cached prefix to a table of %d pages: %w", len(t.pages), engine.ErrInvalidInput)
	}
	ids := t.pool.MatchPrefix(tokens, maxPages)
	t.pages = append(t.pages, ids...)
	return len(ids), nil
}

// Cache offers the table's full pages holding tokens to the pool's prefix
// cache (see Pool.Insert); the table keeps its references.
func (t *BlockTable) Cache(tokens []int32) int { return t.pool.Insert(tokens, t.pages) }

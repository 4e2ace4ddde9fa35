package kvtransfer

import (
	"fmt"
	"sync"

	"github.com/baton-serving/baton/engine/kvcache"
)

// PoolSource is the PageSource of a request's pages in a kvcache.Pool, at
// the prefill worker. The scheduler announces the block table once the
// pages are allocated (SetPages); the sender reads only pages announced
// complete.
type PoolSource struct {
	pool  *kvcache.Pool
	mu    sync.Mutex
	pages []kvcache.PageID
}

// NewPoolSource returns the source of pages in pool, without a block table
// yet.
func NewPoolSource(pool *kvcache.Pool) *PoolSource { return &PoolSource{pool: pool} }

// SetPages sets the request's block table.
func (p *PoolSource) SetPages(pages []kvcache.PageID) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.pages = pages
}

// Ready reports whether the block table is known (the prompt's pages exist).
func (p *PoolSource) Ready() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.pages != nil
}

// CopyPage implements PageSource.
func (p *PoolSource) CopyPage(page, lo, hi, tokens int, k, v []byte) error {
	p.mu.Lock()
	if page >= len(p.pages) {
		p.mu.Unlock()
		return fmt.Errorf("page %d of %d", page, len(p.pages))
	}
	id := p.pages[page]
	p.mu.Unlock()
	n := tokens * p.pool.Layout().RowBytes()
	for l := lo; l < hi; l++ {
		off := (l - lo) * n
		// A device pool's backend copies the layer out first (after the
		// forward step that wrote it); a host pool's bytes are copied as
		// they are.
		if err := p.pool.ReadRows(id, l, tokens, k[off:off+n], v[off:off+n]); err != nil {
			return err
		}
	}
	return nil
}

// PoolSink is the PageSink of the pages decode reserved for a request in a
// kvcache.Pool.
type PoolSink struct {
	Pool  *kvcache.Pool
	Pages []kvcache.PageID
}

// WritePage implements PageSink.
func (p *PoolSink) WritePage(page, lo, hi, tokens int, k, v []byte) error {
	if page >= len(p.Pages) {
		return fmt.Errorf("page %d beyond the %d reserved", page, len(p.Pages))
	}
	n := tokens * p.Pool.Layout().RowBytes()
	if len(k) < (hi-lo)*n || len(v) < (hi-lo)*n {
		return fmt.Errorf("page %d layers %d-%d: %d key and %d value bytes for %d positions", page, lo, hi, len(k), len(v), tokens)
	}
	for l := lo; l < hi; l++ {
		off := (l - lo) * n
		if err := p.Pool.WriteRows(p.Pages[page], l, tokens, k[off:off+n], v[off:off+n]); err != nil {
			return err
		}
	}
	return nil
}

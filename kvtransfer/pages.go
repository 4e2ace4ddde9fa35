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
	row := p.pool.Layout().RowBytes()
	n := tokens * row
	for l := lo; l < hi; l++ {
		pk, pv := p.pool.PageBytes(id, l)
		off := (l - lo) * n
		copy(k[off:off+n], pk[:n])
		copy(v[off:off+n], pv[:n])
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
	for l := lo; l < hi; l++ {
		dk, dv := p.Pool.PageBytes(p.Pages[page], l)
		if dk == nil || n > len(dk) {
			return fmt.Errorf("page %d layer %d: %d bytes do not fit", page, l, n)
		}
		off := (l - lo) * n
		copy(dk[:n], k[off:off+n])
		copy(dv[:n], v[off:off+n])
	}
	return nil
}

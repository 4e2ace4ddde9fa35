package prefill

import (
	"fmt"
	"sync"

	"github.com/baton-serving/baton/engine/kvcache"
)

// pageSource reads a request's pages for the sender. The scheduler sets the
// block table once the pages are allocated; the sender reads only pages the
// scheduler has announced complete.
type pageSource struct {
	pool  *kvcache.Pool
	mu    sync.Mutex
	pages []kvcache.PageID
}

func (p *pageSource) setPages(pages []kvcache.PageID) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.pages = pages
}

// ready reports whether the block table is known (the prompt's pages exist).
func (p *pageSource) ready() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.pages != nil
}

// CopyPage implements kvtransfer.PageSource.
func (p *pageSource) CopyPage(page, lo, hi, tokens int, k, v []byte) error {
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

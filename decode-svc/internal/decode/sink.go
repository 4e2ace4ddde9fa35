package decode

import (
	"fmt"

	"github.com/baton-serving/baton/engine/kvcache"
)

// pageSink writes received chunks into the reserved pages.
type pageSink struct {
	pool  *kvcache.Pool
	pages []kvcache.PageID
}

// WritePage implements kvtransfer.PageSink.
func (p *pageSink) WritePage(page, lo, hi, tokens int, k, v []byte) error {
	if page >= len(p.pages) {
		return fmt.Errorf("page %d beyond the %d reserved", page, len(p.pages))
	}
	n := tokens * p.pool.Layout().RowBytes()
	for l := lo; l < hi; l++ {
		dk, dv := p.pool.PageBytes(p.pages[page], l)
		if dk == nil || n > len(dk) {
			return fmt.Errorf("page %d layer %d: %d bytes do not fit", page, l, n)
		}
		off := (l - lo) * n
		copy(dk[:n], k[off:off+n])
		copy(dv[:n], v[off:off+n])
	}
	return nil
}

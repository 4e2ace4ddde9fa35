// Package kvcache is the paged KV cache: a pool of fixed-size pages, each
// holding the attention keys and values of PageSize consecutive positions of
// one sequence in every layer, and per-sequence block tables that list a
// sequence's pages in position order.
//
// # Byte layout
//
// A pool's pages have the shape of a [kernels.KVLayout]. A page is one
// contiguous byte range of PageBytes() bytes. Inside it, layer by layer,
// come the keys and then the values of that layer:
//
//	page = K(layer 0) V(layer 0) K(layer 1) V(layer 1) … K(L-1) V(L-1)
//
// and each K or V block (BlockBytes() bytes) is
//
//	[token 0…PageSize-1][kv_head 0…KVHeads-1][head_dim 0…HeadDim-1]
//
// elements of DType (F32 or F16), little-endian, with keys already
// rotated by RoPE. A slot that no position has been written to holds
// undefined bytes. PageBytes returns one layer's K and V blocks of a page,
// the unit in which the KV transfer streams pages between processes; both
// ends must agree on the layout, which KVLayout.String spells out.
//
// # Ownership
//
// Pages are reference counted so that block tables and the prefix cache
// (see EnableCache) can share them. Alloc hands out pages with one reference, Retain adds
// one, Release drops one and frees the page when none is left; each is O(1)
// per page. The pool's bookkeeping is safe for concurrent use. The page
// bytes are not guarded: whoever holds a page decides who writes it and when
// (the scheduler writes through the model's forward pass; the transfer
// reads complete pages, or writes reserved ones, while the scheduler keeps
// them out of every batch).
package kvcache

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/baton-serving/baton/engine"
	"github.com/baton-serving/baton/kernels"
)

// DefaultPageSize is the number of positions per page unless configured.
const DefaultPageSize = 16

// maxPageSize bounds a pool's PageSize; pages of thousands of positions
// would defeat the point of paging.
const maxPageSize = 1 << 12

// PageID names a page of a Pool: 0 … Stats().Total-1.
type PageID int32

// ValidateLayout checks that l can shape a pool: every dimension is
// positive, a page has at most 4096 positions and DType is F32 or F16; the
// error wraps engine.ErrInvalidInput. It is stricter than
// kernels.KVLayout.Validate, which bounds what a backend can address,
// not what the engine pages sensibly.
func ValidateLayout(l kernels.KVLayout) error {
	const maxDim = 1 << 16
	switch {
	case l.Layers <= 0 || l.Layers > maxDim, l.KVHeads <= 0 || l.KVHeads > maxDim, l.HeadDim <= 0 || l.HeadDim > maxDim:
		return fmt.Errorf("kvcache: %d layers × %d KV heads × %d: each must be in [1, %d]: %w",
			l.Layers, l.KVHeads, l.HeadDim, maxDim, engine.ErrInvalidInput)
	case l.PageSize <= 0 || l.PageSize > maxPageSize:
		return fmt.Errorf("kvcache: page size %d, want [1, %d]: %w", l.PageSize, maxPageSize, engine.ErrInvalidInput)
	case l.ElemSize() == 0:
		return fmt.Errorf("kvcache: element type %s, want F32 or F16: %w", l.DType, engine.ErrInvalidInput)
	}
	if uint64(l.PageSize)*uint64(l.Layers)*uint64(l.KVHeads)*uint64(l.HeadDim)*8 > math.MaxInt32 {
		return fmt.Errorf("kvcache: a page of %s would exceed 2 GiB: %w", l, engine.ErrInvalidInput)
	}
	return nil
}

// Stats counts a pool's pages.
type Stats struct {
	Total, Free, Used int
	// Shared counts the used pages with more than one reference.
	Shared int
	// Cached counts the pages the prefix cache keeps (part of Used).
	Cached int
}

// Pool is a fixed set of pages of one kernels.KVLayout.
//
// The pages live in host memory ([New]) or in a backend's own memory
// ([NewOn] with a backend that does not compute on host memory, such as a
// GPU's). The bookkeeping is the same either way; only how the page bytes
// are reached differs: a host pool's through [Pool.Page] and
// [Pool.PageBytes], which alias it, a device pool's through the backend's
// copies ([Pool.ReadRows], [Pool.WriteRows], [Pool.CopyPage]).
type Pool struct {
	layout    kernels.KVLayout
	pageBytes int
	data      []byte           // host pages; nil for a device pool
	view      kernels.HostView // the pages as the last backend to compute on them sees them

	// dev is a device pool's pages, allocated by devBE; nil for a host
	// pool. staging holds 2·BlockBytes buffers for copies of one layer.
	dev     kernels.KVCache
	devBE   kernels.Backend
	staging sync.Pool
	closed  atomic.Bool

	mu     sync.Mutex
	refs   []int32
	free   []PageID // a stack: Alloc pops, the last reference pushes
	shared int
	cache  *prefixCache // nil while the prefix cache is off
}

// New allocates a pool of pages pages of layout l in host memory.
func New(l kernels.KVLayout, pages int) (*Pool, error) { return NewOn(nil, l, pages) }

// NewOn allocates a pool of pages pages of layout l for backend b: in host
// memory when b is nil or computes on host memory ([kernels.HostKV], the
// CPU backend: its attention then reads the pool in place), else in b's
// own memory through b.NewKVCache (device memory on a GPU), which only b
// can compute on. A device pool must be closed ([Pool.Close]) to give its
// memory back; an allocation the backend refuses (out of device memory)
// is an error naming the bytes asked for.
func NewOn(b kernels.Backend, l kernels.KVLayout, pages int) (*Pool, error) {
	if err := ValidateLayout(l); err != nil {
		return nil, err
	}
	if pages <= 0 || pages > math.MaxInt32 || pages > math.MaxInt/l.PageBytes() {
		return nil, fmt.Errorf("kvcache: %d pages of %d bytes: want [1, %d]: %w",
			pages, l.PageBytes(), min(math.MaxInt32, math.MaxInt/l.PageBytes()), engine.ErrInvalidInput)
	}
	p := &Pool{
		layout:    l,
		pageBytes: l.PageBytes(),
		refs:      make([]int32, pages),
		free:      make([]PageID, pages),
	}
	if _, host := b.(kernels.HostKV); b == nil || host {
		p.data = make([]byte, pages*l.PageBytes())
	} else {
		kv, err := b.NewKVCache(l, pages)
		if err != nil {
			return nil, fmt.Errorf("kvcache: %d pages of %s (%d bytes) on %s: %w", pages, l, int64(pages)*int64(l.PageBytes()), b.Name(), err)
		}
		p.dev, p.devBE = kv, b
		blk := 2 * l.BlockBytes()
		p.staging.New = func() any { b := make([]byte, blk); return &b }
	}
	// Lowest ids on top of the stack, so a fresh pool hands out 0, 1, 2 …
	for i := range p.free {
		p.free[i] = PageID(pages - 1 - i)
	}
	return p, nil
}

// PagesForBudget returns how many pages of layout l fit in budget bytes.
func PagesForBudget(l kernels.KVLayout, budget int64) int {
	pb := int64(l.PageBytes())
	if pb <= 0 || budget <= 0 {
		return 0
	}
	return int(min(budget/pb, math.MaxInt32))
}

// NewForBudget allocates as many pages of layout l as fit in budget bytes.
// The pool must hold at least one sequence of maxSeqLen positions (the
// model's context window); otherwise the error, wrapping
// engine.ErrInvalidInput, says how many bytes that needs.
func NewForBudget(l kernels.KVLayout, budget int64, maxSeqLen int) (*Pool, error) {
	return NewForBudgetOn(nil, l, budget, maxSeqLen)
}

// NewForBudgetOn is NewForBudget with the pages allocated as [NewOn]
// allocates them for backend b.
func NewForBudgetOn(b kernels.Backend, l kernels.KVLayout, budget int64, maxSeqLen int) (*Pool, error) {
	if err := ValidateLayout(l); err != nil {
		return nil, err
	}
	pages := PagesForBudget(l, budget)
	if need := l.PagesFor(max(maxSeqLen, 1)); pages < need {
		return nil, fmt.Errorf("kvcache: a budget of %d bytes holds %d pages (%s), but one sequence of %d positions needs %d pages: give at least %d bytes: %w",
			budget, pages, l, maxSeqLen, need, int64(need)*int64(l.PageBytes()), engine.ErrInvalidInput)
	}
	return NewOn(b, l, pages)
}

// Device reports whether the pages live in a backend's own memory (a
// device pool) rather than in host memory.
func (p *Pool) Device() bool { return p.dev != nil }

// Close gives a device pool's memory back to its backend; it does nothing
// to a host pool, whose memory the garbage collector reclaims. The pool
// must not be used afterwards. Closing twice is not an error.
func (p *Pool) Close() error {
	if p.dev == nil || p.closed.Swap(true) {
		return nil
	}
	if err := p.devBE.FreeKVCache(p.dev); err != nil {
		return fmt.Errorf("kvcache: freeing the pages on %s: %w", p.devBE.Name(), err)
	}
	return nil
}

// Layout returns the pool's page layout.
func (p *Pool) Layout() kernels.KVLayout { return p.layout }

// Stats returns the page counts.
func (p *Pool) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return Stats{Total: len(p.refs), Free: len(p.free), Used: len(p.refs) - len(p.free), Shared: p.shared, Cached: p.cachedLocked()}
}

func (p *Pool) cachedLocked() int {
	if p.cache == nil {
		return 0
	}
	return len(p.cache.entries)
}

// Alloc takes n free pages, each with one reference, or none at all: when
// fewer than n are free the error wraps engine.ErrKVCacheFull and names the
// numbers.
func (p *Pool) Alloc(n int) ([]PageID, error) {
	return p.AppendAlloc(nil, n)
}

// AppendAlloc is Alloc appending the new pages to ids. When too few pages
// are free it evicts prefix cache pages that no sequence holds, least
// recently used first — but only when that makes n pages free.
func (p *Pool) AppendAlloc(ids []PageID, n int) ([]PageID, error) {
	if n < 0 {
		return ids, fmt.Errorf("kvcache: allocate %d pages: %w", n, engine.ErrInvalidInput)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if n > len(p.free)+p.evictable() {
		return ids, fmt.Errorf("kvcache: %d pages needed, %d of %d free (%d more cached and evictable): %w",
			n, len(p.free), len(p.refs), p.evictable(), engine.ErrKVCacheFull)
	}
	for n > len(p.free) && p.evictOne() {
	}
	for range n {
		id := p.free[len(p.free)-1]
		p.free = p.free[:len(p.free)-1]
		p.refs[id] = 1
		ids = append(ids, id)
	}
	return ids, nil
}

func (p *Pool) valid(id PageID) bool { return id >= 0 && int(id) < len(p.refs) }

// Retain adds a reference to each page, which must be in use. On an error
// (a page out of range or free) no reference is added.
func (p *Pool) Retain(ids ...PageID) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, id := range ids {
		if !p.valid(id) || p.refs[id] == 0 {
			return fmt.Errorf("kvcache: retain page %d, which is %s: %w", id, p.describe(id), engine.ErrInvalidInput)
		}
	}
	for _, id := range ids {
		if p.refs[id] == 1 {
			p.shared++
			p.onRetained(id)
		}
		p.refs[id]++
	}
	return nil
}

// Release drops a reference to each page and frees the pages left with
// none. Releasing a free or unknown page is an error (a double free), and
// then no reference is dropped.
func (p *Pool) Release(ids ...PageID) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, id := range ids {
		if !p.valid(id) || p.refs[id] == 0 || p.refs[id] == 1 && p.cachedOnly(id) {
			err := fmt.Errorf("kvcache: release page %d, which is %s: %w", id, p.describe(id), engine.ErrInvalidInput)
			p.undoRelease(ids[:i])
			return err
		}
		p.refs[id]--
		switch p.refs[id] {
		case 0:
			p.free = append(p.free, id)
		case 1:
			p.shared--
			p.onReleased(id)
		}
	}
	return nil
}

// undoRelease gives back the references that a failed Release dropped, in
// reverse order, so that each freed page is again the top of the stack.
func (p *Pool) undoRelease(ids []PageID) {
	for _, id := range slices.Backward(ids) {
		switch p.refs[id] {
		case 0:
			p.free = p.free[:len(p.free)-1]
		case 1:
			p.shared++
			p.onRetained(id)
		}
		p.refs[id]++
	}
}

func (p *Pool) describe(id PageID) string {
	switch {
	case !p.valid(id):
		return fmt.Sprintf("outside [0, %d)", len(p.refs))
	case p.refs[id] == 0:
		return "free"
	case p.refs[id] == 1 && p.cachedOnly(id):
		return "held only by the prefix cache"
	}
	return fmt.Sprintf("held %d times", p.refs[id])
}

// Refs returns the number of references to page id (0 for a free or unknown
// page).
func (p *Pool) Refs(id PageID) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.valid(id) {
		return 0
	}
	return int(p.refs[id])
}

// Page returns the bytes of page id (Layout().PageBytes of them, laid out as
// the package documentation describes), or nil for an unknown page or a
// device pool. The slice aliases the pool.
func (p *Pool) Page(id PageID) []byte {
	if !p.valid(id) || p.data == nil {
		return nil
	}
	off := int(id) * p.pageBytes
	return p.data[off : off+p.pageBytes : off+p.pageBytes]
}

// PageBytes returns the keys and values of one layer of page id, each
// Layout().BlockBytes bytes laid out [token][kv_head][head_dim], or nil, nil
// for an unknown page or layer, and for a device pool (use ReadRows and
// WriteRows). The slices alias the pool: an exporter reads them, an
// importer writes them.
func (p *Pool) PageBytes(id PageID, layer int) (k, v []byte) {
	if !p.valid(id) || layer < 0 || layer >= p.layout.Layers || p.data == nil {
		return nil, nil
	}
	bb := p.layout.BlockBytes()
	off := int(id)*p.pageBytes + 2*layer*bb
	return p.data[off : off+bb : off+bb], p.data[off+bb : off+2*bb : off+2*bb]
}

// Import copies one layer's keys and values of a page (as PageBytes returns
// them) into page id. It checks the page, layer and lengths.
func (p *Pool) Import(id PageID, layer int, k, v []byte) error {
	bb := p.layout.BlockBytes()
	if len(k) != bb || len(v) != bb {
		return fmt.Errorf("kvcache: import into page %d layer %d: %d key and %d value bytes, want %d each: %w",
			id, layer, len(k), len(v), bb, engine.ErrInvalidInput)
	}
	return p.WriteRows(id, layer, p.layout.PageSize, k, v)
}

// checkRows checks ReadRows' and WriteRows' operands.
func (p *Pool) checkRows(op string, id PageID, layer, tokens int, k, v []byte) error {
	if !p.valid(id) || layer < 0 || layer >= p.layout.Layers {
		return fmt.Errorf("kvcache: %s page %d layer %d: no such page or layer (%d pages, %d layers): %w",
			op, id, layer, len(p.refs), p.layout.Layers, engine.ErrInvalidInput)
	}
	if tokens < 0 || tokens > p.layout.PageSize {
		return fmt.Errorf("kvcache: %s page %d: %d positions, want [0, %d]: %w", op, id, tokens, p.layout.PageSize, engine.ErrInvalidInput)
	}
	if n := tokens * p.layout.RowBytes(); len(k) < n || len(v) < n {
		return fmt.Errorf("kvcache: %s page %d layer %d: %d key and %d value bytes for %d positions of %d bytes: %w",
			op, id, layer, len(k), len(v), tokens, p.layout.RowBytes(), engine.ErrInvalidInput)
	}
	if p.closed.Load() {
		return fmt.Errorf("kvcache: %s page %d: the pool is closed: %w", op, id, engine.ErrInvalidInput)
	}
	return nil
}

// ReadRows copies the keys and values of the first tokens positions of one
// layer of page id into k and v (tokens·RowBytes bytes each, laid out
// [token][kv_head][head_dim]): the KV transfer's export. On a device pool
// the backend copies the layer to host memory first, after every
// operation issued before that writes it.
func (p *Pool) ReadRows(id PageID, layer, tokens int, k, v []byte) error {
	if err := p.checkRows("read", id, layer, tokens, k, v); err != nil {
		return err
	}
	n := tokens * p.layout.RowBytes()
	if p.dev == nil {
		pk, pv := p.PageBytes(id, layer)
		copy(k[:n], pk)
		copy(v[:n], pv)
		return nil
	}
	buf := p.staging.Get().(*[]byte)
	defer p.staging.Put(buf)
	if err := p.devBE.ExportKV(*buf, p.dev, int(id), layer); err != nil {
		return fmt.Errorf("kvcache: reading page %d layer %d from %s: %w", id, layer, p.devBE.Name(), err)
	}
	bb := p.layout.BlockBytes()
	copy(k[:n], (*buf)[:n])
	copy(v[:n], (*buf)[bb:bb+n])
	return nil
}

// WriteRows is the reverse of ReadRows: it overwrites the first tokens
// positions of one layer of page id with k and v and leaves the others as
// they were (the KV transfer's import). On a device pool a partial page
// costs a copy of the layer out and back.
func (p *Pool) WriteRows(id PageID, layer, tokens int, k, v []byte) error {
	if err := p.checkRows("write", id, layer, tokens, k, v); err != nil {
		return err
	}
	n := tokens * p.layout.RowBytes()
	if p.dev == nil {
		dk, dv := p.PageBytes(id, layer)
		copy(dk, k[:n])
		copy(dv, v[:n])
		return nil
	}
	buf := p.staging.Get().(*[]byte)
	defer p.staging.Put(buf)
	if tokens < p.layout.PageSize {
		if err := p.devBE.ExportKV(*buf, p.dev, int(id), layer); err != nil {
			return fmt.Errorf("kvcache: reading page %d layer %d from %s: %w", id, layer, p.devBE.Name(), err)
		}
	}
	bb := p.layout.BlockBytes()
	copy((*buf)[:n], k[:n])
	copy((*buf)[bb:bb+n], v[:n])
	if err := p.devBE.ImportKV(p.dev, int(id), layer, *buf); err != nil {
		return fmt.Errorf("kvcache: writing page %d layer %d to %s: %w", id, layer, p.devBE.Name(), err)
	}
	return nil
}

// WriteRow stores the keys and values of the position in slot slot of page
// id in layer, converting them to the pool's element type. len(k) ==
// len(v) == Layout().RowElems(), a valid page, layer and slot are the
// caller's contract: this is the model's hot path, and the model checks the
// block table once per step. Host pools only: on a device pool it panics
// (use WriteRows).
func (p *Pool) WriteRow(id PageID, layer, slot int, k, v []float32) {
	if p.data == nil {
		panic("kvcache: WriteRow on a device pool")
	}
	kb, vb := p.PageBytes(id, layer)
	rb := p.layout.RowBytes()
	kernels.EncodeKV(kb[slot*rb:(slot+1)*rb], k, p.layout.DType)
	kernels.EncodeKV(vb[slot*rb:(slot+1)*rb], v, p.layout.DType)
}

// ReadRow loads the keys and values of slot slot of page id in layer into
// k and v, under WriteRow's contract (host pools only).
func (p *Pool) ReadRow(id PageID, layer, slot int, k, v []float32) {
	if p.data == nil {
		panic("kvcache: ReadRow on a device pool")
	}
	kb, vb := p.PageBytes(id, layer)
	rb := p.layout.RowBytes()
	kernels.DecodeKV(k, kb[slot*rb:(slot+1)*rb], p.layout.DType)
	kernels.DecodeKV(v, vb[slot*rb:(slot+1)*rb], p.layout.DType)
}

// On returns the pool's pages as a KV cache of backend b, for b's
// attention and KV stores: b computes on the pool's memory in place, so
// the pages a forward pass writes are the pages the transfer reads. Only
// backends that compute on host memory ([kernels.HostKV], the CPU) can;
// others give an error wrapping engine.ErrUnsupported. The handle of the
// last backend asked is kept, so asking again costs a comparison; it holds
// no resources of the backend.
//
// A device pool's pages are only its own backend's: On returns them for
// that backend and an error wrapping engine.ErrUnsupported for any other.
func (p *Pool) On(b kernels.Backend) (kernels.KVCache, error) {
	if p.dev != nil {
		if b != p.devBE {
			return nil, fmt.Errorf("kvcache: pages of %s live on %s, not on %s: %w", p.layout, p.devBE.Name(), b.Name(), engine.ErrUnsupported)
		}
		if p.closed.Load() {
			return nil, fmt.Errorf("kvcache: pages of %s: the pool is closed: %w", p.layout, engine.ErrInvalidInput)
		}
		return p.dev, nil
	}
	kv, err := p.view.On(b, p.layout, p.data)
	if errors.Is(err, kernels.ErrUnsupported) {
		return nil, fmt.Errorf("kvcache: pages of %s: %w: %w", p.layout, err, engine.ErrUnsupported)
	}
	if err != nil {
		return nil, fmt.Errorf("kvcache: pages of %s on backend %s: %w", p.layout, b.Name(), err)
	}
	return kv, nil
}

// CopyPage copies every byte of page src into page dst: a sequence that
// forks from another (sched's n > 1) gets its own copy of the partial last
// page, which both will go on writing, while they share the full ones.
// Both pages must be in use; the caller holds dst for writing and src is
// not written while it copies.
func (p *Pool) CopyPage(dst, src PageID) error {
	p.mu.Lock()
	for _, id := range []PageID{dst, src} {
		if !p.valid(id) || p.refs[id] == 0 {
			err := fmt.Errorf("kvcache: copy page %d to %d: page %d is %s: %w", src, dst, id, p.describe(id), engine.ErrInvalidInput)
			p.mu.Unlock()
			return err
		}
	}
	p.mu.Unlock()
	switch {
	case dst == src:
	case p.dev != nil:
		if err := p.devBE.CopyKVPage(p.dev, int(dst), int(src)); err != nil {
			return fmt.Errorf("kvcache: copy page %d to %d on %s: %w", src, dst, p.devBE.Name(), err)
		}
	default:
		copy(p.Page(dst), p.Page(src))
	}
	return nil
}

package model

import (
	"errors"
	"fmt"
	"math"
	"sync"

	"github.com/baton-serving/baton/engine"
	"github.com/baton-serving/baton/kernels"
	"github.com/baton-serving/baton/kernels/quant"
)

// KVCache stores one sequence's attention keys and values, position by
// position, for every layer. Forward writes the rows of the positions it
// processes and reads back every earlier one. ContiguousCache is the
// implementation Forward computes on.
type KVCache interface {
	// Layers and KVDim give the shape of the cache, which Forward checks
	// against the model: Layers layers of rows of KVDim float32s.
	Layers() int
	KVDim() int
	// Cap is the number of positions the cache can hold.
	Cap() int
	// Len is the number of positions stored (0…Len-1).
	Len() int
	// SetLen sets the number of stored positions: below Len it forgets the
	// tail (to rewind a sequence), above it it marks rows written with Put
	// as stored. n must be in [0, Cap].
	SetLen(n int) error
	// Put stores the key and value rows of position pos in layer. pos < Cap
	// and len(k) == len(v) == KVDim are the caller's contract.
	Put(layer, pos int, k, v []float32)
	// View returns the keys and values of positions 0…n-1 of layer as n
	// consecutive rows of KVDim elements each. The slices are valid until
	// the next Put, SetLen or View.
	View(layer, n int) (k, v []float32)
}

// contigPageSize is the number of positions per page of a
// ContiguousCache. Any size gives the same results (attention reads F32
// pages the same way whatever their size); a multiple of 4 lets it read
// four keys at a time in place.
const contigPageSize = 64

// ContiguousCache is a KVCache for one sequence in one preallocated block
// of host memory: float32 keys and values in the page layout of
// engine/kvcache (pages of 64 positions, numbered in position order), so
// that the backend's attention runs on it as it does on a page pool.
type ContiguousCache struct {
	layers, kvDim, capacity, n int
	layout                     kernels.KVLayout
	data                       []byte
	pages                      []int32 // 0, 1, 2 …: the block table
	view                       []float32
	on                         kernels.HostView // the last backend's handle on data

	// dev holds the pages on a backend that cannot compute on host memory
	// (a GPU), allocated there on first use; Put and View, the host
	// numerics' access, never see them. Close frees them.
	mu    sync.Mutex
	dev   kernels.KVCache
	devBE kernels.Backend
}

// NewContiguousCache returns an empty cache for a model of configuration cfg
// holding up to maxSeq positions; maxSeq 0 means cfg.ContextLength. It
// allocates 2·Layers·maxSeq·KVDim float32s up front (maxSeq rounded up to
// a multiple of 64).
func NewContiguousCache(cfg Config, maxSeq int) (*ContiguousCache, error) {
	if maxSeq == 0 {
		maxSeq = cfg.ContextLength
	}
	if maxSeq <= 0 || maxSeq > maxDim {
		return nil, fmt.Errorf("model: cache of %d positions, want [1, %d]: %w", maxSeq, maxDim, engine.ErrInvalidInput)
	}
	kvDim := cfg.KVDim()
	if cfg.Layers <= 0 || kvDim <= 0 {
		return nil, fmt.Errorf("model: cache for %d layers of width %d: %w", cfg.Layers, kvDim, engine.ErrInvalidInput)
	}
	l := cfg.KVLayout(contigPageSize, quant.F32)
	pages := (maxSeq + contigPageSize - 1) / contigPageSize
	if err := kernels.CheckKVPages(l, pages); err != nil || int64(pages)*int64(l.PageBytes()) > math.MaxInt {
		return nil, fmt.Errorf("model: cache of %d positions × %d layers × %d: too large: %w", maxSeq, cfg.Layers, kvDim, engine.ErrInvalidInput)
	}
	c := &ContiguousCache{
		layers:   cfg.Layers,
		kvDim:    kvDim,
		capacity: maxSeq,
		layout:   l,
		data:     make([]byte, pages*l.PageBytes()),
		pages:    make([]int32, pages),
	}
	for i := range c.pages {
		c.pages[i] = int32(i)
	}
	return c, nil
}

// Close frees the pages the cache holds on a backend's own memory (a
// GPU's), if any; the host memory is the garbage collector's. The cache
// must not be used afterwards; closing twice is not an error.
func (c *ContiguousCache) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.dev == nil {
		return nil
	}
	err := c.devBE.FreeKVCache(c.dev)
	c.dev, c.devBE = nil, nil
	if err != nil {
		return fmt.Errorf("model: freeing a cache's pages on %s: %w", c.devBE.Name(), err)
	}
	return nil
}

// Layers implements KVCache.
func (c *ContiguousCache) Layers() int { return c.layers }

// KVDim implements KVCache.
func (c *ContiguousCache) KVDim() int { return c.kvDim }

// Cap implements KVCache.
func (c *ContiguousCache) Cap() int { return c.capacity }

// Len implements KVCache.
func (c *ContiguousCache) Len() int { return c.n }

// SetLen implements KVCache.
func (c *ContiguousCache) SetLen(n int) error {
	if n < 0 || n > c.capacity {
		return fmt.Errorf("model: cache length %d outside [0, %d]: %w", n, c.capacity, engine.ErrInvalidInput)
	}
	c.n = n
	return nil
}

// row returns the bytes of position pos's keys (v false) or values in
// layer.
func (c *ContiguousCache) row(layer, pos int, v bool) []byte {
	l := c.layout
	off := (pos/l.PageSize)*l.PageBytes() + l.LayerOffset(layer) + (pos%l.PageSize)*l.RowBytes()
	if v {
		off += l.BlockBytes()
	}
	return c.data[off : off+l.RowBytes()]
}

// Put implements KVCache.
func (c *ContiguousCache) Put(layer, pos int, k, v []float32) {
	kernels.EncodeKV(c.row(layer, pos, false), k[:c.kvDim], quant.F32)
	kernels.EncodeKV(c.row(layer, pos, true), v[:c.kvDim], quant.F32)
}

// View implements KVCache. It copies the rows out of their pages.
func (c *ContiguousCache) View(layer, n int) (k, v []float32) {
	if cap(c.view) < 2*n*c.kvDim {
		c.view = make([]float32, 2*n*c.kvDim)
	}
	k, v = c.view[:n*c.kvDim], c.view[n*c.kvDim:2*n*c.kvDim]
	for p := range n {
		kernels.DecodeKV(k[p*c.kvDim:(p+1)*c.kvDim], c.row(layer, p, false), quant.F32)
		kernels.DecodeKV(v[p*c.kvDim:(p+1)*c.kvDim], c.row(layer, p, true), quant.F32)
	}
	return k, v
}

// kvOn returns the cache as a KV cache of backend b, and the cache's block
// table: the host memory itself for a backend that computes on it in
// place, else pages of b's own memory, allocated on first use (a cache is
// one sequence's, so it serves one backend: another is refused with an
// error wrapping engine.ErrUnsupported).
func (c *ContiguousCache) kvOn(b kernels.Backend) (kernels.KVCache, []int32, error) {
	if _, host := b.(kernels.HostKV); !host {
		c.mu.Lock()
		defer c.mu.Unlock()
		switch {
		case c.devBE == nil:
			kv, err := b.NewKVCache(c.layout, len(c.pages))
			if err != nil {
				return nil, nil, fmt.Errorf("model: a cache of %d positions on %s: %w", c.capacity, b.Name(), err)
			}
			c.dev, c.devBE = kv, b
		case c.devBE != b:
			return nil, nil, fmt.Errorf("model: a contiguous cache whose pages are on %s, used on %s: %w", c.devBE.Name(), b.Name(), engine.ErrUnsupported)
		}
		return c.dev, c.pages, nil
	}
	c.mu.Lock()
	onDevice := c.devBE
	c.mu.Unlock()
	if onDevice != nil {
		return nil, nil, fmt.Errorf("model: a contiguous cache whose pages are on %s, used on %s: %w", onDevice.Name(), b.Name(), engine.ErrUnsupported)
	}
	kv, err := c.on.On(b, c.layout, c.data)
	if errors.Is(err, kernels.ErrUnsupported) {
		return nil, nil, fmt.Errorf("model: a contiguous cache (use ForwardBatch with a page pool): %w: %w", err, engine.ErrUnsupported)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("model: contiguous cache on backend %s: %w", b.Name(), err)
	}
	return kv, c.pages, nil
}

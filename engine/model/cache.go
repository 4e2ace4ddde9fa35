package model

import (
	"fmt"

	"github.com/baton-serving/baton/engine"
)

// KVCache stores one sequence's attention keys and values, position by
// position, for every layer. Forward writes the rows of the positions it
// processes and reads back every earlier one. ContiguousCache is the plain
// implementation; a paged cache can stand in for it.
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
	// consecutive rows of KVDim elements each. The slices alias the cache
	// and are valid until the next Put or SetLen.
	View(layer, n int) (k, v []float32)
}

// ContiguousCache is a KVCache that keeps each layer's keys and values in one
// preallocated float32 array of Cap rows.
type ContiguousCache struct {
	layers, kvDim, capacity, n int
	k, v                       [][]float32
}

// NewContiguousCache returns an empty cache for a model of configuration cfg
// holding up to maxSeq positions; maxSeq 0 means cfg.ContextLength. It
// allocates 2·Layers·maxSeq·KVDim float32s up front.
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
	c := &ContiguousCache{
		layers:   cfg.Layers,
		kvDim:    kvDim,
		capacity: maxSeq,
		k:        make([][]float32, cfg.Layers),
		v:        make([][]float32, cfg.Layers),
	}
	for l := range c.k {
		c.k[l] = make([]float32, maxSeq*kvDim)
		c.v[l] = make([]float32, maxSeq*kvDim)
	}
	return c, nil
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

// Put implements KVCache.
func (c *ContiguousCache) Put(layer, pos int, k, v []float32) {
	off := pos * c.kvDim
	copy(c.k[layer][off:off+c.kvDim], k)
	copy(c.v[layer][off:off+c.kvDim], v)
}

// View implements KVCache.
func (c *ContiguousCache) View(layer, n int) (k, v []float32) {
	return c.k[layer][:n*c.kvDim], c.v[layer][:n*c.kvDim]
}

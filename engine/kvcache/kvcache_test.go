package kvcache

import (
	"encoding/binary"
	"errors"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/baton-serving/baton/engine"
	"github.com/baton-serving/baton/kernels"
	"github.com/baton-serving/baton/kernels/quant"
)

func layout(typ quant.Type) kernels.KVLayout {
	return kernels.KVLayout{Layers: 3, KVHeads: 2, HeadDim: 4, PageSize: 4, DType: typ}
}

func newPool(t *testing.T, l kernels.KVLayout, pages int) *Pool {
	t.Helper()
	p, err := New(l, pages)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestLayoutValidate(t *testing.T) {
	bad := []kernels.KVLayout{
		{},
		{Layers: 1, KVHeads: 1, HeadDim: 1, PageSize: 0, DType: quant.F32},
		{Layers: 1, KVHeads: 1, HeadDim: 1, PageSize: 1 << 13, DType: quant.F32},
		{Layers: 1, KVHeads: 1, HeadDim: 1, PageSize: 16, DType: quant.Q8_0},
		{Layers: -1, KVHeads: 1, HeadDim: 1, PageSize: 16, DType: quant.F32},
		{Layers: 1 << 16, KVHeads: 1 << 16, HeadDim: 1, PageSize: 16, DType: quant.F32},
	}
	for _, l := range bad {
		if err := ValidateLayout(l); !errors.Is(err, engine.ErrInvalidInput) {
			t.Errorf("ValidateLayout(%#v) = %v, want ErrInvalidInput", l, err)
		}
		if _, err := New(l, 4); err == nil {
			t.Errorf("New(%#v) succeeded", l)
		}
	}
	if _, err := New(layout(quant.F32), 0); !errors.Is(err, engine.ErrInvalidInput) {
		t.Errorf("New with 0 pages: %v", err)
	}
}

func TestBudget(t *testing.T) {
	l := layout(quant.F16) // 384-byte pages of 4 positions
	if n := PagesForBudget(l, 384*10+383); n != 10 {
		t.Errorf("PagesForBudget = %d, want 10", n)
	}
	p, err := NewForBudget(l, 384*10, 40)
	if err != nil {
		t.Fatal(err)
	}
	if s := p.Stats(); s.Total != 10 || s.Free != 10 {
		t.Errorf("stats %+v", s)
	}
	// 41 positions need 11 pages: the error says how many bytes.
	_, err = NewForBudget(l, 384*10, 41)
	if !errors.Is(err, engine.ErrInvalidInput) || !strings.Contains(err.Error(), "4224 bytes") {
		t.Errorf("too small a budget: %v", err)
	}
	// F16 halves the memory: the same budget holds twice the F32 pages.
	if a, b := PagesForBudget(layout(quant.F16), 1<<20), PagesForBudget(layout(quant.F32), 1<<20); a != 2*b {
		t.Errorf("F16 %d pages, F32 %d", a, b)
	}
}

func TestAllocReleaseRefs(t *testing.T) {
	p := newPool(t, layout(quant.F32), 5)
	a, err := p.Alloc(3)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(a, []PageID{0, 1, 2}) {
		t.Errorf("first pages %v", a)
	}
	if _, err := p.Alloc(3); !errors.Is(err, engine.ErrKVCacheFull) || !strings.Contains(err.Error(), "3 pages needed, 2 of 5 free") {
		t.Errorf("over-allocation: %v", err)
	}
	if s := p.Stats(); s != (Stats{Total: 5, Free: 2, Used: 3}) {
		t.Errorf("all-or-nothing failure changed the stats: %+v", s)
	}
	if err := p.Retain(a[0], a[1]); err != nil {
		t.Fatal(err)
	}
	if s := p.Stats(); s.Shared != 2 || p.Refs(a[0]) != 2 {
		t.Errorf("after retain: %+v, refs %d", s, p.Refs(a[0]))
	}
	if err := p.Release(a...); err != nil {
		t.Fatal(err)
	}
	if s := p.Stats(); s != (Stats{Total: 5, Free: 3, Used: 2}) {
		t.Errorf("after one release: %+v", s)
	}
	// Double free: page 2 is free now. Nothing is released on error.
	if err := p.Release(a[0], a[2]); !errors.Is(err, engine.ErrInvalidInput) || !strings.Contains(err.Error(), "free") {
		t.Errorf("double free: %v", err)
	}
	if p.Refs(a[0]) != 1 {
		t.Errorf("failed release dropped a reference")
	}
	// A page listed twice needs two references.
	if err := p.Release(a[0], a[0]); err == nil {
		t.Error("releasing a single reference twice succeeded")
	}
	for _, bad := range []PageID{-1, 5, 2} {
		if err := p.Retain(bad); err == nil {
			t.Errorf("Retain(%d) succeeded", bad)
		}
	}
	if err := p.Release(a[0], a[1]); err != nil {
		t.Fatal(err)
	}
	if s := p.Stats(); s != (Stats{Total: 5, Free: 5}) {
		t.Errorf("at the end: %+v", s)
	}
	if _, err := p.Alloc(-1); err == nil {
		t.Error("Alloc(-1) succeeded")
	}
}

func TestBlockTable(t *testing.T) {
	p := newPool(t, layout(quant.F32), 6)
	bt := p.NewTable()
	if err := bt.Grow(9); err != nil { // 3 pages of 4
		t.Fatal(err)
	}
	if bt.Len() != 3 || bt.Cap() != 12 {
		t.Errorf("len %d cap %d", bt.Len(), bt.Cap())
	}
	if err := bt.Grow(12); err != nil || bt.Len() != 3 {
		t.Errorf("growing within capacity: %v, %d pages", err, bt.Len())
	}
	other := p.NewTable()
	if err := other.Share(bt.Pages()[:2]...); err != nil {
		t.Fatal(err)
	}
	if err := other.Grow(30); !errors.Is(err, engine.ErrKVCacheFull) || other.Len() != 2 {
		t.Errorf("over-growing: %v, %d pages", err, other.Len())
	}
	if err := bt.Release(); err != nil {
		t.Fatal(err)
	}
	if err := bt.Release(); err != nil {
		t.Errorf("second release: %v", err)
	}
	if s := p.Stats(); s.Used != 2 {
		t.Errorf("shared pages freed early: %+v", s)
	}
	if err := other.Release(); err != nil {
		t.Fatal(err)
	}
	if s := p.Stats(); s.Used != 0 || s.Free != 6 {
		t.Errorf("end: %+v", s)
	}
}

// TestByteLayout checks the documented layout: page → layer → K then V →
// [token][kv_head][head_dim], little-endian elements.
func TestByteLayout(t *testing.T) {
	for _, typ := range []quant.Type{quant.F32, quant.F16} {
		l := layout(typ)
		p := newPool(t, l, 3)
		es := l.ElemSize()
		for layer := range l.Layers {
			for slot := range l.PageSize {
				k := make([]float32, l.RowElems())
				v := make([]float32, l.RowElems())
				for i := range k {
					k[i] = float32(1000*layer + 10*slot + i)
					v[i] = -k[i]
				}
				p.WriteRow(2, layer, slot, k, v)
			}
		}
		page := p.Page(2)
		if len(page) != l.PageBytes() {
			t.Fatalf("page of %d bytes", len(page))
		}
		read := func(b []byte) float32 {
			if typ == quant.F32 {
				return math.Float32frombits(binary.LittleEndian.Uint32(b))
			}
			return quant.F16ToF32(binary.LittleEndian.Uint16(b))
		}
		for layer := range l.Layers {
			kb, vb := p.PageBytes(2, layer)
			for slot := range l.PageSize {
				for h := range l.KVHeads {
					for d := range l.HeadDim {
						i := h*l.HeadDim + d
						want := float32(1000*layer + 10*slot + i)
						off := ((slot*l.KVHeads+h)*l.HeadDim + d) * es
						if got := read(kb[off:]); got != want {
							t.Fatalf("%s layer %d slot %d head %d dim %d: K %v, want %v", typ, layer, slot, h, d, got, want)
						}
						if got := read(vb[off:]); got != -want {
							t.Fatalf("%s: V %v, want %v", typ, got, -want)
						}
						// The same bytes, addressed within the whole page.
						pageOff := 2*layer*l.BlockBytes() + off
						if got := read(page[pageOff:]); got != want {
							t.Fatalf("%s: page bytes disagree with PageBytes", typ)
						}
					}
				}
			}
		}
		k, v := make([]float32, l.RowElems()), make([]float32, l.RowElems())
		p.ReadRow(2, 1, 3, k, v)
		if k[5] != 1035 || v[5] != -1035 {
			t.Errorf("ReadRow gave %v / %v", k, v)
		}
		if k, v := p.PageBytes(3, 0); k != nil || v != nil {
			t.Error("PageBytes of an unknown page is not nil")
		}
		if k, _ := p.PageBytes(0, l.Layers); k != nil {
			t.Error("PageBytes of an unknown layer is not nil")
		}
		if p.Page(-1) != nil {
			t.Error("Page(-1) is not nil")
		}
	}
}

func TestImportRoundTrip(t *testing.T) {
	l := layout(quant.F16)
	src, dst := newPool(t, l, 2), newPool(t, l, 2)
	for layer := range l.Layers {
		for slot := range l.PageSize {
			k := make([]float32, l.RowElems())
			for i := range k {
				k[i] = float32(layer*100+slot*10+i) / 7
			}
			src.WriteRow(1, layer, slot, k, k)
		}
	}
	for layer := range l.Layers {
		k, v := src.PageBytes(1, layer)
		if err := dst.Import(0, layer, k, v); err != nil {
			t.Fatal(err)
		}
	}
	if !slices.Equal(src.Page(1), dst.Page(0)) {
		t.Error("imported page differs")
	}
	k, v := src.PageBytes(1, 0)
	if err := dst.Import(0, 0, k[1:], v); !errors.Is(err, engine.ErrInvalidInput) {
		t.Errorf("short import: %v", err)
	}
	if err := dst.Import(2, 0, k, v); !errors.Is(err, engine.ErrInvalidInput) {
		t.Errorf("import into an unknown page: %v", err)
	}
}

// TestConcurrentBookkeeping runs allocations and releases from several
// goroutines (for the race detector) and checks that nothing is lost.
func TestConcurrentBookkeeping(t *testing.T) {
	p := newPool(t, layout(quant.F16), 64)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			bt := p.NewTable()
			for i := range 200 {
				if err := bt.Grow((i%7 + 1 + g) * 4); err != nil && !errors.Is(err, engine.ErrKVCacheFull) {
					t.Error(err)
					return
				}
				if i%3 == 0 {
					if err := bt.Release(); err != nil {
						t.Error(err)
						return
					}
				}
				_ = p.Stats()
			}
			if err := bt.Release(); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if s := p.Stats(); s.Used != 0 || s.Free != 64 {
		t.Errorf("after all releases: %+v", s)
	}
}

func BenchmarkAllocRelease(b *testing.B) {
	p, _ := New(layout(quant.F16), 1024)
	ids := make([]PageID, 0, 1)
	for b.Loop() {
		ids, _ = p.AppendAlloc(ids[:0], 1)
		_ = p.Release(ids...)
	}
}

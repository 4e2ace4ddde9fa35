package kvcache

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/baton-serving/baton/engine"
	"github.com/baton-serving/baton/kernels"
	"github.com/baton-serving/baton/kernels/quant"
)

// ownMemory is the CPU backend without its kernels.HostKV method: a
// backend that can only compute on KV pages it allocated itself, as a
// GPU's. The pool then takes the path it takes on CUDA (NewKVCache,
// ExportKV, ImportKV, CopyKVPage), computed for real by the CPU.
type ownMemory struct{ kernels.Backend }

func TestDevicePool(t *testing.T) {
	cpu := kernels.NewCPU(1)
	defer cpu.Close()
	if p, err := NewOn(cpu, layout(quant.F16), 4); err != nil || p.Device() {
		t.Fatalf("NewOn(CPU): device %v, %v: want a host pool", p != nil && p.Device(), err)
	}
	be := ownMemory{cpu}
	for _, typ := range []quant.Type{quant.F32, quant.F16} {
		l := layout(typ)
		p, err := NewOn(be, l, 6)
		if err != nil {
			t.Fatal(err)
		}
		if !p.Device() || p.Page(0) != nil {
			t.Fatalf("%s: Device() = %v, Page(0) = %d bytes: want a device pool without host pages", typ, p.Device(), len(p.Page(0)))
		}
		if kv, err := p.On(be); err != nil || kv.Pages() != 6 {
			t.Fatalf("%s: On(own backend) = %v, %v", typ, kv, err)
		}
		if _, err := p.On(cpu); !errors.Is(err, engine.ErrUnsupported) {
			t.Errorf("%s: On(another backend) = %v, want ErrUnsupported", typ, err)
		}

		// Whole pages in, then a partial page over one of them: the rows
		// not written keep their bytes.
		bb, rb := l.BlockBytes(), l.RowBytes()
		rng := rand.New(rand.NewPCG(1, uint64(typ)))
		want := make(map[[2]int][2][]byte)
		for id := range 3 {
			for layer := range l.Layers {
				k, v := randBytes(rng, bb), randBytes(rng, bb)
				if err := p.Import(PageID(id), layer, k, v); err != nil {
					t.Fatal(err)
				}
				want[[2]int{id, layer}] = [2][]byte{k, v}
			}
		}
		pk, pv := randBytes(rng, 3*rb), randBytes(rng, 3*rb)
		if err := p.WriteRows(1, 2, 3, pk, pv); err != nil {
			t.Fatal(err)
		}
		w := want[[2]int{1, 2}]
		copy(w[0], pk)
		copy(w[1], pv)
		// CopyPage runs on the backend: page 4 becomes page 1.
		if _, err := p.Alloc(5); err != nil {
			t.Fatal(err)
		}
		if err := p.CopyPage(4, 1); err != nil {
			t.Fatal(err)
		}
		for layer := range l.Layers {
			want[[2]int{4, layer}] = want[[2]int{1, layer}]
		}
		for key, w := range want {
			k, v := make([]byte, bb), make([]byte, bb)
			if err := p.ReadRows(PageID(key[0]), key[1], l.PageSize, k, v); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(k, w[0]) || !bytes.Equal(v, w[1]) {
				t.Errorf("%s: page %d layer %d reads back other bytes", typ, key[0], key[1])
			}
			// A partial read is the page's first rows.
			k2, v2 := make([]byte, 2*rb), make([]byte, 2*rb)
			if err := p.ReadRows(PageID(key[0]), key[1], 2, k2, v2); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(k2, w[0][:2*rb]) || !bytes.Equal(v2, w[1][:2*rb]) {
				t.Errorf("%s: page %d layer %d: first two rows differ", typ, key[0], key[1])
			}
		}

		for _, bad := range []struct {
			id            PageID
			layer, tokens int
			n             int
		}{{6, 0, 1, rb}, {0, 3, 1, rb}, {0, 0, 5, 5 * rb}, {0, 0, 2, rb}, {-1, 0, 1, rb}} {
			k, v := make([]byte, bad.n), make([]byte, bad.n)
			if err := p.ReadRows(bad.id, bad.layer, bad.tokens, k, v); !errors.Is(err, engine.ErrInvalidInput) {
				t.Errorf("ReadRows(%+v) = %v, want ErrInvalidInput", bad, err)
			}
			if err := p.WriteRows(bad.id, bad.layer, bad.tokens, k, v); !errors.Is(err, engine.ErrInvalidInput) {
				t.Errorf("WriteRows(%+v) = %v, want ErrInvalidInput", bad, err)
			}
		}

		if err := p.Close(); err != nil {
			t.Fatal(err)
		}
		if err := p.Close(); err != nil {
			t.Errorf("second Close: %v", err)
		}
		// The backend freed the pages: freeing them again is refused.
		if err := be.FreeKVCache(p.dev); !errors.Is(err, kernels.ErrForeign) {
			t.Errorf("FreeKVCache after Close = %v, want ErrForeign (already freed)", err)
		}
		if err := p.ReadRows(0, 0, 1, make([]byte, rb), make([]byte, rb)); err == nil {
			t.Error("ReadRows on a closed pool succeeded")
		}
		if _, err := p.On(be); err == nil {
			t.Error("On on a closed pool succeeded")
		}
	}
}

func randBytes(rng *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return b
}

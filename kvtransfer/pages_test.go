package kvtransfer

import (
	"bytes"
	"testing"

	"github.com/baton-serving/baton/engine/kvcache"
	"github.com/baton-serving/baton/engine/model"
	"github.com/baton-serving/baton/kernels/quant"
)

// TestPoolSourceToSink copies a partly filled page from one pool to another
// through the adapters, as a transfer does, and checks the bytes and the
// refusals of pages beyond the block table.
func TestPoolSourceToSink(t *testing.T) {
	layout := model.Config{Layers: 3, KVHeads: 2, HeadDim: 4}.KVLayout(4, quant.F32)
	from, err := kvcache.New(layout, 4)
	if err != nil {
		t.Fatal(err)
	}
	to, err := kvcache.New(layout, 4)
	if err != nil {
		t.Fatal(err)
	}
	for id := range kvcache.PageID(4) {
		for l := range 3 {
			k, v := from.PageBytes(id, l)
			for i := range k {
				k[i], v[i] = byte(int(id)*31+l*7+i), byte(int(id)*17+l*5+i+1)
			}
		}
	}
	src := NewPoolSource(from)
	if src.Ready() {
		t.Fatal("Ready before SetPages")
	}
	src.SetPages([]kvcache.PageID{3, 1})
	if !src.Ready() {
		t.Fatal("not Ready after SetPages")
	}
	const tokens, lo, hi = 3, 1, 3
	n := tokens * layout.RowBytes()
	k, v := make([]byte, (hi-lo)*n), make([]byte, (hi-lo)*n)
	if err := src.CopyPage(1, lo, hi, tokens, k, v); err != nil {
		t.Fatal(err)
	}
	sink := &PoolSink{Pool: to, Pages: []kvcache.PageID{0, 2}}
	if err := sink.WritePage(1, lo, hi, tokens, k, v); err != nil {
		t.Fatal(err)
	}
	for l := lo; l < hi; l++ {
		fk, fv := from.PageBytes(1, l)
		tk, tv := to.PageBytes(2, l)
		if !bytes.Equal(fk[:n], tk[:n]) || !bytes.Equal(fv[:n], tv[:n]) {
			t.Errorf("layer %d: the copied slots differ", l)
		}
	}
	if err := src.CopyPage(2, 0, 1, 1, k, v); err == nil {
		t.Error("CopyPage beyond the block table: no error")
	}
	if err := sink.WritePage(2, 0, 1, 1, k, v); err == nil {
		t.Error("WritePage beyond the reserved pages: no error")
	}
}

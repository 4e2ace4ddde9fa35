package kernels

import (
	"slices"
	"strings"
	"testing"

	"github.com/baton-serving/baton/kernels/quant"
)

func tinyKVLayout(typ quant.Type) KVLayout {
	return KVLayout{Layers: 3, KVHeads: 2, HeadDim: 4, PageSize: 4, DType: typ}
}

func TestKVLayoutSizes(t *testing.T) {
	tests := []struct {
		l                                  KVLayout
		elem, row, block, page, pagesFor17 int
	}{
		{tinyKVLayout(quant.F32), 4, 32, 128, 768, 5},
		{tinyKVLayout(quant.F16), 2, 16, 64, 384, 5},
		{KVLayout{Layers: 12, KVHeads: 12, HeadDim: 64, PageSize: 16, DType: quant.F16}, 2, 1536, 24576, 589824, 2},
	}
	for _, tc := range tests {
		l := tc.l
		if err := l.Validate(); err != nil {
			t.Fatal(err)
		}
		got := []int{l.ElemSize(), l.RowBytes(), l.BlockBytes(), l.PageBytes(), l.PagesFor(17)}
		want := []int{tc.elem, tc.row, tc.block, tc.page, tc.pagesFor17}
		if !slices.Equal(got, want) {
			t.Errorf("%v: elem,row,block,page,pagesFor(17) = %v, want %v", l, got, want)
		}
		if !strings.Contains(l.String(), l.DType.String()) {
			t.Errorf("String %q does not name the type", l)
		}
	}
	if n := tinyKVLayout(quant.F32).PagesFor(0); n != 0 {
		t.Errorf("PagesFor(0) = %d", n)
	}
}

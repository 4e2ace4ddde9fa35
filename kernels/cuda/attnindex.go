package cuda

import (
	"fmt"
	"math"
	"unsafe"

	"github.com/baton-serving/baton/kernels"
)

// attentionIndex lays out what the attention kernel reads about its rows:
// for row i, the offset of its block table and its length (2 int32 each),
// then the block tables, each stored once however many rows share it.
func attentionIndex(rows []kernels.AttnRow, pageSize int) ([]int32, error) {
	type table struct{ off, n int }
	seen := make(map[*int32]table)
	idx := make([]int32, 2*len(rows))
	for i, r := range rows {
		need := (r.Len + pageSize - 1) / pageSize
		key := unsafe.SliceData(r.Pages)
		t, ok := seen[key]
		if !ok || t.n < need {
			t = table{off: len(idx) - 2*len(rows), n: need}
			idx = append(idx, r.Pages[:need]...)
			seen[key] = t
		}
		if len(idx) > math.MaxInt32 {
			return nil, fmt.Errorf("%w: attention block tables of %d entries", kernels.ErrUnsupported, len(idx))
		}
		idx[2*i], idx[2*i+1] = int32(t.off), int32(r.Len)
	}
	return idx, nil
}

package cuda

import (
	"slices"
	"testing"

	"github.com/baton-serving/baton/kernels"
)

func TestAttentionIndex(t *testing.T) {
	a := []int32{5, 2, 9, 8}
	b := []int32{0, 7, 3}
	tests := []struct {
		name string
		rows []kernels.AttnRow
		want []int32
	}{
		{
			name: "one row",
			rows: []kernels.AttnRow{{Pages: a, Len: 5}},
			// header (table offset, length), then the 2 pages 5 positions need
			want: []int32{0, 5, 5, 2},
		},
		{
			name: "rows of one sequence share its table",
			rows: []kernels.AttnRow{{Pages: a, Len: 9}, {Pages: a, Len: 1}, {Pages: b, Len: 4}},
			want: []int32{0, 9, 0, 1, 3, 4, 5, 2, 9, 0},
		},
		{
			name: "a longer row of a seen sequence gets the whole table",
			rows: []kernels.AttnRow{{Pages: a, Len: 1}, {Pages: a, Len: 13}},
			want: []int32{0, 1, 1, 13, 5, 5, 2, 9, 8},
		},
		{
			name: "a table's unneeded tail is not copied",
			rows: []kernels.AttnRow{{Pages: b[:2], Len: 8}},
			want: []int32{0, 8, 0, 7},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := attentionIndex(tc.rows, 4)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

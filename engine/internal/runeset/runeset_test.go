package runeset

import (
	"slices"
	"testing"
)

func TestNormalize(t *testing.T) {
	in := []Range{{'x', 'z'}, {'a', 'c'}, {'d', 'f'}, {'b', 'b'}, {'y', 'y'}}
	want := []Range{{'a', 'f'}, {'x', 'z'}}
	if got := Normalize(in); !slices.Equal(got, want) {
		t.Fatalf("Normalize(%v) = %v, want %v", in, got, want)
	}
	if in[0] != (Range{'x', 'z'}) {
		t.Fatalf("Normalize modified its input: %v", in)
	}
	if got := Normalize(nil); got != nil {
		t.Fatalf("Normalize(nil) = %v, want nil", got)
	}
}

func TestComplement(t *testing.T) {
	for _, c := range []struct{ in, want []Range }{
		{nil, []Range{{0, MaxRune}}},
		{[]Range{{0, MaxRune}}, nil},
		{[]Range{{'a', 'f'}, {'x', 'z'}}, []Range{{0, 'a' - 1}, {'f' + 1, 'x' - 1}, {'z' + 1, MaxRune}}},
		{[]Range{{0, 9}, {100, MaxRune}}, []Range{{10, 99}}},
	} {
		if got := Complement(c.in); !slices.Equal(got, c.want) {
			t.Errorf("Complement(%v) = %v, want %v", c.in, got, c.want)
		}
	}
}

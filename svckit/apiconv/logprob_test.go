package apiconv

import (
	"reflect"
	"testing"

	"github.com/baton-serving/baton/engine/sample"
	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"google.golang.org/protobuf/proto"
)

func TestLogprobBothWays(t *testing.T) {
	for _, c := range []struct {
		name string
		tok  sample.Token
		wire *batonv1.TokenLogprob
	}{
		{"no alternatives", sample.Token{ID: 7, Logprob: -0.5}, &batonv1.TokenLogprob{TokenId: 7, Logprob: -0.5}},
		{"with alternatives",
			sample.Token{ID: 3, Logprob: -0.25, Top: []sample.TokenLogprob{{ID: 3, Logprob: -0.25}, {ID: 9, Logprob: -2}}},
			&batonv1.TokenLogprob{TokenId: 3, Logprob: -0.25, TopLogprobs: []*batonv1.TopLogprob{{TokenId: 3, Logprob: -0.25}, {TokenId: 9, Logprob: -2}}}},
	} {
		if got := WireLogprob(c.tok); !proto.Equal(got, c.wire) {
			t.Errorf("%s: WireLogprob = %v, want %v", c.name, got, c.wire)
		}
		if got := TokenLogprob(c.wire); !reflect.DeepEqual(got, c.tok) {
			t.Errorf("%s: TokenLogprob = %+v, want %+v", c.name, got, c.tok)
		}
	}
	if got := TokenLogprob(nil); !reflect.DeepEqual(got, sample.Token{}) {
		t.Errorf("TokenLogprob(nil) = %+v, want the zero token", got)
	}
}

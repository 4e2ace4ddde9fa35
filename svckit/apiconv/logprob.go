package apiconv

import (
	"github.com/baton-serving/baton/engine/sample"
	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
)

// WireLogprob converts a drawn token and its alternatives to the wire.
func WireLogprob(t sample.Token) *batonv1.TokenLogprob {
	lp := &batonv1.TokenLogprob{TokenId: uint32(t.ID), Logprob: t.Logprob}
	for _, alt := range t.Top {
		lp.TopLogprobs = append(lp.TopLogprobs, &batonv1.TopLogprob{TokenId: uint32(alt.ID), Logprob: alt.Logprob})
	}
	return lp
}

// TokenLogprob converts a wire token and its alternatives back, unchecked
// against a vocabulary (TokenIDs checks ids); nil is the zero token.
func TokenLogprob(lp *batonv1.TokenLogprob) sample.Token {
	t := sample.Token{ID: int32(lp.GetTokenId()), Logprob: lp.GetLogprob()}
	for _, alt := range lp.GetTopLogprobs() {
		t.Top = append(t.Top, sample.TokenLogprob{ID: int32(alt.GetTokenId()), Logprob: alt.GetLogprob()})
	}
	return t
}

package apiconv

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/baton-serving/baton/engine"
	"github.com/baton-serving/baton/engine/sample"
	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"google.golang.org/protobuf/proto"
)

// TestPromptLogprobsBytes: the bound holds for the largest entries the
// router sends on (ids needing 5 varint bytes, 20 alternatives, each with
// the text and bytes of a maxTokenBytes-byte token, its text all U+FFFD),
// and CheckPromptLogprobs refuses exactly the prompts over the limit.
func TestPromptLogprobsBytes(t *testing.T) {
	const n, m = 50, 40
	ts := make([]sample.Token, n-1)
	for i := range ts {
		ts[i] = sample.Token{ID: 1<<31 - 1, Logprob: -1.5}
		for k := range sample.MaxTopLogprobs {
			ts[i].Top = append(ts[i].Top, sample.TokenLogprob{ID: 1<<31 - 1 - int32(k), Logprob: -2})
		}
	}
	msg := &batonv1.GenerateEvent{PromptLogprobs: WirePromptLogprobs(ts)}
	raw := bytes.Repeat([]byte{0xff}, m)
	text := strings.Repeat("\uFFFD", m)
	for _, lp := range msg.PromptLogprobs {
		lp.Token, lp.Bytes = text, raw
		for _, top := range lp.TopLogprobs {
			top.Token, top.Bytes = text, raw
		}
	}
	if got, bound := proto.Size(msg), PromptLogprobsBytes(n, sample.MaxTopLogprobs, m); got > bound {
		t.Fatalf("%d entries with the router's token texts take %d bytes, bound %d", n-1, got, bound)
	}
	if PromptLogprobsBytes(1, 20, m) != 0 || WirePromptLogprobs(nil) != nil {
		t.Error("a one-token prompt has no entries")
	}
	p := &batonv1.SamplingParams{PromptLogprobs: true, TopLogprobs: 20}
	per := PromptLogprobsBytes(2, 20, m)
	fits := MaxPromptLogprobsBytes/per + 1 // tokens, the first without an entry
	if err := CheckPromptLogprobs(p, fits, m); err != nil {
		t.Errorf("%d tokens: %v", fits, err)
	}
	err := CheckPromptLogprobs(p, fits+1, m)
	if !errors.Is(err, engine.ErrInvalidInput) || !strings.Contains(err.Error(), "sampling.prompt_logprobs") {
		t.Errorf("%d tokens: %v, want an invalid sampling.prompt_logprobs", fits+1, err)
	}
	if err := CheckPromptLogprobs(&batonv1.SamplingParams{TopLogprobs: 20}, 1<<20, m); err != nil {
		t.Errorf("without prompt_logprobs: %v", err)
	}
}

func TestCheckWirePromptLogprobs(t *testing.T) {
	prompt := []uint32{5, 6, 7}
	good := []*batonv1.TokenLogprob{
		{TokenId: 6, Logprob: -1, TopLogprobs: []*batonv1.TopLogprob{{TokenId: 9, Logprob: -0.5}}},
		{TokenId: 7, Logprob: -2},
	}
	if err := CheckWirePromptLogprobs(good, prompt, 1, 10); err != nil {
		t.Fatal(err)
	}
	if err := CheckWirePromptLogprobs(nil, prompt[:1], 0, 10); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		lps  []*batonv1.TokenLogprob
		top  int
		want string
	}{
		{"too few", good[:1], 1, "1 entries for a 3-token prompt, want 2"},
		{"wrong token", []*batonv1.TokenLogprob{good[0], {TokenId: 8}}, 1, "prompt_logprobs[1]: token 8, the prompt has 7"},
		{"too many alternatives", good, 0, "prompt_logprobs[0]: 1 alternatives, want at most 0"},
		{"vocabulary", []*batonv1.TokenLogprob{{TokenId: 6, TopLogprobs: []*batonv1.TopLogprob{{TokenId: 10}}}, good[1]}, 1, "alternative 10 outside the vocabulary of 10"},
	} {
		if err := CheckWirePromptLogprobs(tc.lps, prompt, tc.top, 10); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
}

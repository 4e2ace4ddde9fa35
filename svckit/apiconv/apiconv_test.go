package apiconv

import (
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/baton-serving/baton/engine"
	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"google.golang.org/protobuf/proto"
)

func TestSamplingDefaults(t *testing.T) {
	p, err := Sampling(&batonv1.SamplingParams{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Temperature != 1 || p.TopP != 1 || p.RepeatPenalty != 1 || p.TopK != 0 || p.MinP != 0 || p.Logprobs {
		t.Errorf("defaults = %+v", p)
	}
	p, err = Sampling(&batonv1.SamplingParams{Temperature: proto.Float32(0), TopP: proto.Float32(0.9), TopK: 5, Seed: proto.Uint64(7), TopLogprobs: 3})
	if err != nil {
		t.Fatal(err)
	}
	if p.Temperature != 0 || p.TopP != 0.9 || p.TopK != 5 || p.Seed != 7 || !p.Logprobs || p.TopLogprobs != 3 {
		t.Errorf("explicit = %+v", p)
	}
}

func TestSamplingRejects(t *testing.T) {
	long := strings.Repeat("x", MaxStopBytes+1)
	cases := []struct {
		in   *batonv1.SamplingParams
		want string
	}{
		{&batonv1.SamplingParams{Temperature: proto.Float32(-0.1)}, "sampling.temperature"},
		{&batonv1.SamplingParams{Temperature: proto.Float32(2.5)}, "sampling.temperature"},
		{&batonv1.SamplingParams{TopP: proto.Float32(0)}, "sampling.top_p"},
		{&batonv1.SamplingParams{TopP: proto.Float32(1.5)}, "sampling.top_p"},
		{&batonv1.SamplingParams{MinP: -1}, "sampling.min_p"},
		{&batonv1.SamplingParams{RepetitionPenalty: proto.Float32(0)}, "sampling.repetition_penalty"},
		{&batonv1.SamplingParams{FrequencyPenalty: 3}, "sampling.frequency_penalty"},
		{&batonv1.SamplingParams{PresencePenalty: -3}, "sampling.presence_penalty"},
		{&batonv1.SamplingParams{TopLogprobs: 21}, "sampling.top_logprobs"},
		{&batonv1.SamplingParams{Stop: make([]string, 17)}, "sampling.stop"},
		{&batonv1.SamplingParams{Stop: []string{"ok", ""}}, "sampling.stop[1]"},
		{&batonv1.SamplingParams{Stop: []string{long}}, "sampling.stop[0]"},
		{&batonv1.SamplingParams{StopTokenIds: make([]uint32, 65)}, "sampling.stop_token_ids"},
	}
	for _, c := range cases {
		_, err := Sampling(c.in)
		if err == nil || !strings.Contains(err.Error(), c.want) || !errors.Is(err, engine.ErrInvalidInput) {
			t.Errorf("Sampling(%v) = %v, want an invalid-input error naming %s", c.in, err, c.want)
		}
	}
}

func TestTokenIDs(t *testing.T) {
	if _, err := TokenIDs("prompt_token_ids", []uint32{1, 2, 512}, 512); err == nil || !strings.Contains(err.Error(), "prompt_token_ids[2]") {
		t.Errorf("out-of-vocabulary id: %v", err)
	}
	ids, err := TokenIDs("x", []uint32{1, 511}, 512)
	if err != nil || ids[1] != 511 {
		t.Errorf("TokenIDs = %v, %v", ids, err)
	}
	if got := WireIDs([]int32{3, 4}); got[0] != 3 || got[1] != 4 {
		t.Errorf("WireIDs = %v", got)
	}
	if _, err := StopTokenIDs(&batonv1.SamplingParams{StopTokenIds: []uint32{600}}, 512); err == nil {
		t.Error("stop token beyond the vocabulary accepted")
	}
}

func TestValidRequestID(t *testing.T) {
	for id, ok := range map[string]bool{
		"abc-123_x.y:z": true, "": false, strings.Repeat("a", 129): false, "has space": false, "ünï": false, "a/b": false,
	} {
		if err := ValidRequestID(id); (err == nil) != ok {
			t.Errorf("ValidRequestID(%q) = %v, want ok=%v", id, err, ok)
		}
	}
}

// TestLogitBias: sampling.logit_bias becomes Params.LogitBias; a value out
// of [-100, 100] or not finite, too many entries, an id beyond the
// vocabulary and grammar with json_schema are INVALID_ARGUMENT naming the
// field.
func TestLogitBias(t *testing.T) {
	p, err := SamplingVocab(&batonv1.SamplingParams{LogitBias: map[uint32]float32{7: -100, 9: 100, 3: 0.5}}, 512)
	if err != nil || len(p.LogitBias) != 3 || p.LogitBias[7] != -100 || p.LogitBias[9] != 100 || p.LogitBias[3] != 0.5 {
		t.Fatalf("SamplingVocab = %v, %v", p.LogitBias, err)
	}
	many := make(map[uint32]float32, MaxLogitBias+1)
	for i := range MaxLogitBias + 1 {
		many[uint32(i)] = 1
	}
	cases := []struct {
		in   *batonv1.SamplingParams
		want string
	}{
		{&batonv1.SamplingParams{LogitBias: map[uint32]float32{5: 101}}, "logit_bias[5]"},
		{&batonv1.SamplingParams{LogitBias: map[uint32]float32{5: -100.5}}, "logit_bias[5]"},
		{&batonv1.SamplingParams{LogitBias: map[uint32]float32{5: float32(math.NaN())}}, "logit_bias[5]"},
		{&batonv1.SamplingParams{LogitBias: map[uint32]float32{5: float32(math.Inf(1))}}, "logit_bias[5]"},
		{&batonv1.SamplingParams{LogitBias: many}, "sampling.logit_bias"},
		{&batonv1.SamplingParams{LogitBias: map[uint32]float32{512: 1}}, "sampling.logit_bias[512]"},
		{&batonv1.SamplingParams{Grammar: `root ::= "a"`, JsonSchema: `{}`}, "sampling.grammar"},
	}
	for _, c := range cases {
		_, err := SamplingVocab(c.in, 512)
		if err == nil || !strings.Contains(err.Error(), c.want) || !errors.Is(err, engine.ErrInvalidInput) {
			t.Errorf("SamplingVocab(%v) = %v, want an invalid-input error naming %s", c.in, err, c.want)
		}
	}
	// Sampling alone does not know the vocabulary.
	if _, err := Sampling(&batonv1.SamplingParams{LogitBias: map[uint32]float32{512: 1}}); err != nil {
		t.Errorf("Sampling refused an id it cannot check: %v", err)
	}
}

// TestLogitBiasErrorNamesSmallestID: of several bad logit_bias entries the
// error names the smallest id, whatever the map's iteration order.
func TestLogitBiasErrorNamesSmallestID(t *testing.T) {
	ids := &batonv1.SamplingParams{LogitBias: map[uint32]float32{900: 1, 600: 1, 700: 1, 800: 1, 650: 1}}
	vals := &batonv1.SamplingParams{LogitBias: map[uint32]float32{9: 200, 6: 200, 7: 200, 8: 200, 1: 0}}
	for range 50 {
		if err := LogitBiasIDs(ids, 512); err == nil || !strings.Contains(err.Error(), "logit_bias[600]") {
			t.Fatalf("ids: %v, want it to name logit_bias[600]", err)
		}
		if _, err := Sampling(vals); err == nil || !strings.Contains(err.Error(), "logit_bias[6]") {
			t.Fatalf("values: %v, want it to name logit_bias[6]", err)
		}
	}
}

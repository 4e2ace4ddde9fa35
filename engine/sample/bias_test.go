package sample

import (
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/baton-serving/baton/engine"
)

// TestLogitBias: -100 bans the greedy choice, +100 forces a token at any
// temperature, and the logprobs stay the model's raw ones; the bias comes
// before the penalties and the original logits are not modified.
func TestLogitBias(t *testing.T) {
	logits := logs(0.1, 0.4, 0.2, 0.2, 0.1)
	keep := append([]float32(nil), logits...)

	p := Defaults()
	p.Temperature = 0
	p.Logprobs = true
	p.LogitBias = map[int32]float32{1: -100}
	tok, err := mustNew(t, p).Sample(logits)
	if err != nil {
		t.Fatal(err)
	}
	if tok.ID != 2 || math.Abs(float64(tok.Logprob)-math.Log(0.2)) > 1e-6 {
		t.Errorf("bias -100 on the arg-max: %+v, want id 2 with its raw logprob ln 0.2", tok)
	}

	p = Defaults()
	p.Temperature = 1
	p.Seed = 7
	p.LogitBias = map[int32]float32{4: 100, 99: 50} // ids beyond the logits are ignored
	s := mustNew(t, p)
	for i := range 200 {
		if tok, err := s.Sample(logits); err != nil || tok.ID != 4 {
			t.Fatalf("draw %d with +100 on id 4: %+v, %v", i, tok, err)
		}
	}
	for i := range logits {
		if logits[i] != keep[i] {
			t.Fatalf("Sample modified the logits: %v, was %v", logits, keep)
		}
	}

	// A small bias shifts the distribution as adding it to the logit does.
	p = Defaults()
	p.LogitBias = map[int32]float32{0: float32(math.Log(4))}
	got := frequencies(t, mustNew(t, p), logs(0.2, 0.8), 20000)
	checkFreq(t, got, []float64{0.5, 0.5})

	// Before the penalties: a repeat penalty divides the biased logit.
	p = Defaults()
	p.Temperature = 0
	p.RepeatPenalty = 2
	p.LogitBias = map[int32]float32{0: 3}
	s = mustNew(t, p)
	s.Accept(0)
	// logits 0: 0 + 3 = 3, /2 = 1.5 (penalty after bias) < 2; penalty first
	// would give 0/2 + 3 = 3 > 2.
	if tok, err := s.Sample([]float32{0, 2}); err != nil || tok.ID != 1 {
		t.Errorf("bias then penalty: %+v, %v; want id 1", tok, err)
	}
}

func TestValidateLogitBias(t *testing.T) {
	for _, b := range []map[int32]float32{{3: 101}, {3: -101}, {3: float32(math.NaN())}, {3: float32(math.Inf(-1))}, {-1: 1}} {
		p := Defaults()
		p.LogitBias = b
		if _, err := New(p); err == nil || !errors.Is(err, engine.ErrInvalidInput) || !strings.Contains(err.Error(), "logit_bias") {
			t.Errorf("LogitBias %v: %v, want an invalid-input error naming logit_bias", b, err)
		}
	}
}

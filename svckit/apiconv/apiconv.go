// Package apiconv converts between Baton's wire messages (gen/baton/v1) and
// the engine's types, validating on the way in. Every service converts the
// same way, so a request means the same thing at the router, the prefill
// worker and the decode worker. Errors name the field by its wire path and
// wrap engine.ErrInvalidInput.
package apiconv

import (
	"fmt"
	"maps"
	"math"
	"slices"

	"github.com/baton-serving/baton/engine"
	"github.com/baton-serving/baton/engine/sample"
	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
)

// Limits on request fields that protect the services.
const (
	MaxStopStrings  = 16
	MaxStopBytes    = 256
	MaxStopTokenIDs = 64
	MaxRequestIDLen = 128
	MaxTopLogprobs  = sample.MaxTopLogprobs
	MaxLogitBias    = 1024 // entries of sampling.logit_bias
	penaltyWindow   = 64   // llama.cpp's repeat_last_n default
)

func invalid(field string, v any, want string) error {
	return fmt.Errorf("%s = %v: want %s: %w", field, v, want, engine.ErrInvalidInput)
}

func finite(f float32) bool { return !math.IsNaN(float64(f)) && !math.IsInf(float64(f), 0) }

// Sampling validates p and returns the engine's sampling parameters. Unset
// optional fields take the documented defaults (temperature 1, top_p 1,
// repetition_penalty 1). The seed must already be fixed by the caller (the
// router picks one when the client did not), so every worker draws alike.
func Sampling(p *batonv1.SamplingParams) (sample.Params, error) {
	out := sample.Defaults()
	out.PenaltyLastN = penaltyWindow
	if p == nil {
		return out, nil
	}
	if p.Temperature != nil {
		t := p.GetTemperature()
		if !finite(t) || t < 0 || t > 2 {
			return out, invalid("sampling.temperature", t, "a value in [0, 2]")
		}
		out.Temperature = t
	}
	if p.TopP != nil {
		v := p.GetTopP()
		if !finite(v) || v <= 0 || v > 1 {
			return out, invalid("sampling.top_p", v, "a value in (0, 1]")
		}
		out.TopP = v
	}
	if v := p.GetMinP(); !finite(v) || v < 0 || v > 1 {
		return out, invalid("sampling.min_p", v, "a value in [0, 1]")
	}
	out.MinP = p.GetMinP()
	out.TopK = int(p.GetTopK())
	if p.RepetitionPenalty != nil {
		v := p.GetRepetitionPenalty()
		if !finite(v) || v <= 0 || v > 10 {
			return out, invalid("sampling.repetition_penalty", v, "a value in (0, 10]")
		}
		out.RepeatPenalty = v
	}
	if v := p.GetFrequencyPenalty(); !finite(v) || v < -2 || v > 2 {
		return out, invalid("sampling.frequency_penalty", v, "a value in [-2, 2]")
	}
	out.FrequencyPenalty = p.GetFrequencyPenalty()
	if v := p.GetPresencePenalty(); !finite(v) || v < -2 || v > 2 {
		return out, invalid("sampling.presence_penalty", v, "a value in [-2, 2]")
	}
	out.PresencePenalty = p.GetPresencePenalty()
	if n := p.GetTopLogprobs(); n > MaxTopLogprobs {
		return out, invalid("sampling.top_logprobs", n, fmt.Sprintf("a value in [0, %d]", MaxTopLogprobs))
	}
	out.TopLogprobs = int(p.GetTopLogprobs())
	out.Logprobs = p.GetLogprobs() || p.GetTopLogprobs() > 0
	out.Seed = p.GetSeed()
	if n := len(p.GetLogitBias()); n > MaxLogitBias {
		return out, invalid("sampling.logit_bias", fmt.Sprintf("%d entries", n), fmt.Sprintf("at most %d", MaxLogitBias))
	}
	if len(p.GetLogitBias()) > 0 {
		out.LogitBias = make(map[int32]float32, len(p.GetLogitBias()))
		// The values' range is sample's (ValidLogitBias), checked here so
		// that the error names the wire field; ids in order, so that it
		// names the smallest bad one.
		for _, id := range slices.Sorted(maps.Keys(p.GetLogitBias())) {
			v := p.GetLogitBias()[id]
			if id > math.MaxInt32 {
				return out, invalid(fmt.Sprintf("sampling.logit_bias[%d]", id), "a token id", "an id in the vocabulary")
			}
			if !sample.ValidLogitBias(v) {
				return out, invalid(fmt.Sprintf("sampling.logit_bias[%d]", id), v, fmt.Sprintf("a value in [-%d, %d]", sample.MaxLogitBias, sample.MaxLogitBias))
			}
			out.LogitBias[int32(id)] = v
		}
	}
	// The one check that grammar and json_schema exclude each other (their
	// sizes are engine/grammar's and engine/jsonschema's to bound, when a
	// worker compiles them).
	if p.GetGrammar() != "" && p.GetJsonSchema() != "" {
		return out, invalid("sampling.grammar", "set with sampling.json_schema", "at most one of grammar and json_schema")
	}
	if len(p.GetStop()) > MaxStopStrings {
		return out, invalid("sampling.stop", fmt.Sprintf("%d strings", len(p.GetStop())), fmt.Sprintf("at most %d", MaxStopStrings))
	}
	for i, s := range p.GetStop() {
		if s == "" || len(s) > MaxStopBytes {
			return out, invalid(fmt.Sprintf("sampling.stop[%d]", i), fmt.Sprintf("%d bytes", len(s)), fmt.Sprintf("1-%d bytes", MaxStopBytes))
		}
	}
	if len(p.GetStopTokenIds()) > MaxStopTokenIDs {
		return out, invalid("sampling.stop_token_ids", fmt.Sprintf("%d ids", len(p.GetStopTokenIds())), fmt.Sprintf("at most %d", MaxStopTokenIDs))
	}
	if err := out.Validate(); err != nil {
		return out, fmt.Errorf("sampling: %w", err)
	}
	return out, nil
}

// SamplingVocab is Sampling with the logit_bias ids checked against the
// vocabulary (the workers know it; Sampling alone checks everything else).
func SamplingVocab(p *batonv1.SamplingParams, vocab int) (sample.Params, error) {
	out, err := Sampling(p)
	if err != nil {
		return out, err
	}
	if err := LogitBiasIDs(p, vocab); err != nil {
		return out, err
	}
	return out, nil
}

// LogitBiasIDs checks that every sampling.logit_bias id is in the
// vocabulary.
func LogitBiasIDs(p *batonv1.SamplingParams, vocab int) error {
	for _, id := range slices.Sorted(maps.Keys(p.GetLogitBias())) {
		if int64(id) >= int64(vocab) {
			return invalid(fmt.Sprintf("sampling.logit_bias[%d]", id), id, fmt.Sprintf("an id below the vocabulary size %d", vocab))
		}
	}
	return nil
}

// StopTokenIDs returns p's stop token ids checked against the vocabulary.
func StopTokenIDs(p *batonv1.SamplingParams, vocab int) ([]int32, error) {
	out := make([]int32, 0, len(p.GetStopTokenIds()))
	for i, id := range p.GetStopTokenIds() {
		if int64(id) >= int64(vocab) {
			return nil, invalid(fmt.Sprintf("sampling.stop_token_ids[%d]", i), id, fmt.Sprintf("an id below the vocabulary size %d", vocab))
		}
		out = append(out, int32(id))
	}
	return out, nil
}

// TokenIDs converts wire token ids, checking each against the vocabulary.
func TokenIDs(field string, ids []uint32, vocab int) ([]int32, error) {
	out := make([]int32, len(ids))
	for i, id := range ids {
		if int64(id) >= int64(vocab) {
			return nil, invalid(fmt.Sprintf("%s[%d]", field, i), id, fmt.Sprintf("an id below the vocabulary size %d", vocab))
		}
		out[i] = int32(id)
	}
	return out, nil
}

// WireIDs converts engine token ids to wire ids.
func WireIDs(ids []int32) []uint32 {
	out := make([]uint32, len(ids))
	for i, id := range ids {
		out[i] = uint32(id)
	}
	return out
}

// ValidRequestID checks a client-chosen request id: 1-128 characters of
// [A-Za-z0-9._:-]. (Empty ids are replaced by the router before this.)
func ValidRequestID(id string) error {
	if id == "" || len(id) > MaxRequestIDLen {
		return invalid("request_id", fmt.Sprintf("%q", id), fmt.Sprintf("1-%d characters", MaxRequestIDLen))
	}
	for _, r := range id {
		ok := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == ':' || r == '-'
		if !ok {
			return invalid("request_id", fmt.Sprintf("%q", id), "only the characters A-Z a-z 0-9 . _ : -")
		}
	}
	return nil
}

// DefaultMaxN is the default of the services' --max-n: the most choices
// (SamplingParams.n) a request may ask for.
const DefaultMaxN = 16

// maxMaxN bounds --max-n itself: every choice is a scheduler request, with
// its own pages beyond the shared prompt.
const maxMaxN = 128

// CheckMaxN validates a --max-n flag.
func CheckMaxN(n int) error {
	if n < 1 || n > maxMaxN {
		return fmt.Errorf("--max-n: %d, want 1-%d", n, maxMaxN)
	}
	return nil
}

// Choices returns the number of choices p asks for (sampling.n): 1 when
// unset, an error naming the field when 0 or above maxN.
func Choices(p *batonv1.SamplingParams, maxN int) (int, error) {
	if p == nil || p.N == nil {
		return 1, nil
	}
	if n := p.GetN(); n < 1 || int64(n) > int64(maxN) {
		return 0, invalid("sampling.n", n, fmt.Sprintf("1-%d (--max-n)", maxN))
	}
	return int(p.GetN()), nil
}

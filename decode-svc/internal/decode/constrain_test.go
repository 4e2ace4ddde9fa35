package decode

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/baton-serving/baton/engine/testmodel"
	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"github.com/baton-serving/baton/svckit/workerapi/workertest"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The tests here run constrained decoding and logit_bias through real
// workers (a prefill worker and a decode worker on the tiny generated
// model, whose vocabulary has every byte token), colocated and
// disaggregated.

// genOut is a Generate stream's tokens, text and end.
type genOut struct {
	tokens []uint32
	text   string
	finish batonv1.FinishReason
}

// generate runs one request to its end.
func (p *pd) generate(t *testing.T, id, endpoint string, sp *batonv1.SamplingParams) (genOut, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	stream, err := p.client.Generate(ctx, &batonv1.DecodeServiceGenerateRequest{
		Request:         &batonv1.GenerateRequest{RequestId: id, PromptTokenIds: prompt(12), Sampling: sp},
		PrefillEndpoint: endpoint,
	})
	if err != nil {
		return genOut{}, err
	}
	var out genOut
	var text strings.Builder
	for {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			out.text = text.String()
			return out, nil
		}
		if err != nil {
			return out, err
		}
		ev := resp.GetEvent()
		out.tokens = append(out.tokens, ev.GetTokenIds()...)
		text.WriteString(ev.GetText())
		if ev.GetFinishReason() != batonv1.FinishReason_FINISH_REASON_UNSPECIFIED {
			out.finish = ev.GetFinishReason()
		}
	}
}

// both runs sp colocated and through prefill and fails unless the two
// generate the same tokens and text.
func (p *pd) both(t *testing.T, name string, sp *batonv1.SamplingParams) genOut {
	t.Helper()
	local, err := p.generate(t, name+"-local", localPrefill, sp)
	if err != nil {
		t.Fatalf("%s colocated: %v", name, err)
	}
	remote, err := p.generate(t, name+"-pd", p.prefill.Addr(), sp)
	if err != nil {
		t.Fatalf("%s PD: %v", name, err)
	}
	if !slices.Equal(local.tokens, remote.tokens) || local.text != remote.text || local.finish != remote.finish {
		t.Fatalf("%s: PD differs from colocated:\n pd:    %v %q %v\n local: %v %q %v", name,
			remote.tokens, remote.text, remote.finish, local.tokens, local.text, local.finish)
	}
	return local
}

func seeded(temp float32, seed uint64, maxNew int) *batonv1.SamplingParams {
	return &batonv1.SamplingParams{Temperature: &temp, Seed: &seed, MaxNewTokens: uint32(maxNew)}
}

// testSchema is a nested object, array, string, integer, boolean and enum
// schema whose every sentence is short: the tiny model's random weights
// would otherwise fill the context with digits.
const testSchema = `{
  "type": "object",
  "properties": {
    "name": {"type": "string", "maxLength": 6},
    "size": {"type": "integer", "minimum": 0, "maximum": 999},
    "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
    "inner": {"type": "object", "properties": {"ok": {"type": "boolean"}, "x": {"type": "integer", "minimum": -5, "maximum": 5}},
              "required": ["ok", "x"], "additionalProperties": false}
  },
  "required": ["name", "size", "tags", "inner"],
  "additionalProperties": false
}`

// noSpace is a logit_bias banning every token of the tiny model that is or
// starts with whitespace: the schema's grammar allows a little between
// JSON tokens, and random weights would spend the context on it.
func noSpace() map[uint32]float32 {
	tokens, _, _ := testmodel.Vocabulary(workertest.ModelSpec.Vocab, workertest.ModelSpec.Seed)
	ban := map[uint32]float32{}
	for id, tok := range tokens {
		if strings.HasPrefix(tok, "▁") || tok == "<0x20>" || tok == "<0x0A>" || tok == "<0x09>" {
			ban[uint32(id)] = -100
		}
	}
	return ban
}

// validTestSchema checks text against testSchema by hand.
func validTestSchema(text string) error {
	var v struct {
		Name  *string        `json:"name"`
		Size  *json.Number   `json:"size"`
		Tags  []string       `json:"tags"`
		Inner map[string]any `json:"inner"`
		Extra map[string]any `json:"-"`
	}
	dec := json.NewDecoder(strings.NewReader(text))
	dec.DisallowUnknownFields()
	dec.UseNumber()
	if err := dec.Decode(&v); err != nil {
		return err
	}
	if dec.More() {
		return errors.New("text after the object")
	}
	switch {
	case v.Name == nil || len([]rune(*v.Name)) > 6:
		return fmt.Errorf("name %v", v.Name)
	case v.Size == nil || strings.ContainsAny(v.Size.String(), ".eE"):
		return fmt.Errorf("size %v is not an integer", v.Size)
	case !inRange(*v.Size, 0, 999):
		return fmt.Errorf("size %v outside [0, 999]", v.Size)
	case v.Tags == nil || len(v.Tags) > 3:
		return fmt.Errorf("tags %v", v.Tags)
	case len(v.Inner) != 2:
		return fmt.Errorf("inner %v", v.Inner)
	}
	for _, tag := range v.Tags {
		if tag != "a" && tag != "b" && tag != "c" {
			return fmt.Errorf("tag %q not in the enum", tag)
		}
	}
	if _, ok := v.Inner["ok"].(bool); !ok {
		return fmt.Errorf("inner.ok %v", v.Inner["ok"])
	}
	if x, ok := v.Inner["x"].(json.Number); !ok || strings.ContainsAny(x.String(), ".eE") || !inRange(x, -5, 5) {
		return fmt.Errorf("inner.x %v", v.Inner["x"])
	}
	return nil
}

func inRange(n json.Number, lo, hi int64) bool {
	v, err := n.Int64()
	return err == nil && v >= lo && v <= hi
}

// TestJSONSchemaConstrained: greedy and seeded generations under a JSON
// Schema parse and validate, end with STOP, and are token for token the
// same colocated and through prefill (whose first token is sampled under
// the grammar too); the workers end idle.
func TestJSONSchemaConstrained(t *testing.T) {
	p := startPD(t, nil, nil, nil)
	for i, sp := range []*batonv1.SamplingParams{seeded(0, 0, 110), seeded(0.9, 7, 110), seeded(1, 42, 110), seeded(0.7, 1234, 110)} {
		sp.JsonSchema = testSchema
		sp.LogitBias = noSpace()
		out := p.both(t, fmt.Sprintf("schema-%d", i), sp)
		if out.finish != batonv1.FinishReason_FINISH_REASON_STOP {
			t.Fatalf("generation %d: finish %v after %d tokens, want STOP; text %q", i, out.finish, len(out.tokens), out.text)
		}
		if err := validTestSchema(out.text); err != nil {
			t.Fatalf("generation %d: %q does not validate: %v", i, out.text, err)
		}
		t.Logf("generation %d (%d tokens): %s", i, len(out.tokens), out.text)
	}
	p.waitIdle(t)
}

// TestGrammarForcesEnd: a grammar with one sentence generates it and ends
// with STOP at once, ignore_eos notwithstanding; an empty grammar ends
// before any token.
func TestGrammarForcesEnd(t *testing.T) {
	p := startPD(t, nil, nil, nil)
	sp := seeded(1, 3, 50)
	sp.Grammar = `root ::= "ok:" [0-9] "!"`
	sp.IgnoreEos = true
	out := p.both(t, "forced", sp)
	if out.finish != batonv1.FinishReason_FINISH_REASON_STOP || len(out.text) != 5 || !strings.HasPrefix(out.text, "ok:") || !strings.HasSuffix(out.text, "!") {
		t.Fatalf("got %q (%d tokens) finish %v; want ok:N! and STOP", out.text, len(out.tokens), out.finish)
	}
	sp.Grammar = `root ::= ""`
	out = p.both(t, "empty", sp)
	if out.finish != batonv1.FinishReason_FINISH_REASON_STOP || out.text != "" || len(out.tokens) != 0 {
		t.Fatalf("empty grammar: %q %v finish %v; want nothing and STOP", out.text, out.tokens, out.finish)
	}
	p.waitIdle(t)
}

// TestGrammarIgnoreEOSPD: with ignore_eos under a grammar whose every
// prefix is a sentence (root ::= [a-z]*), the end-of-generation token
// (id 2, pushed first by logit_bias +100) is never chosen: the prefill
// worker that samples the first token honours ignore_eos as the decode
// worker does, so PD generates what colocated does: max_new_tokens
// letters, ending LENGTH.
func TestGrammarIgnoreEOSPD(t *testing.T) {
	p := startPD(t, nil, nil, nil)
	sp := seeded(0, 0, 6)
	sp.Grammar = `root ::= [a-z]*`
	sp.IgnoreEos = true
	sp.LogitBias = map[uint32]float32{2: 100}
	out := p.both(t, "ignore-eos", sp)
	if out.finish != batonv1.FinishReason_FINISH_REASON_LENGTH || len(out.tokens) != 6 {
		t.Fatalf("got %q (%d tokens) finish %v; want 6 letters and LENGTH", out.text, len(out.tokens), out.finish)
	}
	p.waitIdle(t)
}

// TestLogitBiasWorkers: -100 on the token greedy decoding picks first bans
// it; +100 on a token makes every token that one; colocated and PD agree.
func TestLogitBiasWorkers(t *testing.T) {
	p := startPD(t, nil, nil, nil)
	base := p.both(t, "base", seeded(0, 0, 4))
	banned := base.tokens[0]
	sp := seeded(0, 0, 4)
	sp.LogitBias = map[uint32]float32{banned: -100}
	out := p.both(t, "ban", sp)
	if out.tokens[0] == banned {
		t.Fatalf("logit_bias -100 on %d: still generated first (%v)", banned, out.tokens)
	}
	forced := uint32(200)
	if slices.Contains(base.tokens, forced) {
		forced = 201
	}
	sp = seeded(1, 9, 6)
	sp.IgnoreEos = true
	sp.LogitBias = map[uint32]float32{forced: 100}
	out = p.both(t, "force", sp)
	for i, id := range out.tokens {
		if id != forced {
			t.Fatalf("logit_bias +100 on %d: token %d is %d (%v)", forced, i, id, out.tokens)
		}
	}
	p.waitIdle(t)
}

// TestConstraintBadInputs: bad logit_bias entries, grammar with
// json_schema, a bad GBNF grammar and an unsupported schema are
// INVALID_ARGUMENT naming the field, colocated and through prefill.
func TestConstraintBadInputs(t *testing.T) {
	p := startPD(t, nil, nil, nil)
	cases := []struct {
		name string
		set  func(*batonv1.SamplingParams)
		want string
	}{
		{"bias id", func(sp *batonv1.SamplingParams) { sp.LogitBias = map[uint32]float32{512: 1} }, "logit_bias[512]"},
		{"bias 101", func(sp *batonv1.SamplingParams) { sp.LogitBias = map[uint32]float32{5: 101} }, "logit_bias[5]"},
		{"bias NaN", func(sp *batonv1.SamplingParams) { sp.LogitBias = map[uint32]float32{5: float32(math.NaN())} }, "logit_bias[5]"},
		{"both", func(sp *batonv1.SamplingParams) { sp.Grammar, sp.JsonSchema = `root ::= "a"`, `{"type":"object"}` }, "grammar"},
		{"bad gbnf", func(sp *batonv1.SamplingParams) { sp.Grammar = `root ::= "a" | (` }, "sampling.grammar"},
		{"no root", func(sp *batonv1.SamplingParams) { sp.Grammar = `start ::= "a"` }, "sampling.grammar"},
		{"bad schema", func(sp *batonv1.SamplingParams) { sp.JsonSchema = `{"type": "object", "properties": 3}` }, "sampling.json_schema"},
	}
	for _, c := range cases {
		for _, ep := range []string{localPrefill, p.prefill.Addr()} {
			sp := seeded(0, 0, 4)
			c.set(sp)
			_, err := p.generate(t, "bad", ep, sp)
			if st := status.Convert(err); st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), c.want) {
				t.Errorf("%s (%s): %v; want INVALID_ARGUMENT naming %s", c.name, ep, err, c.want)
			}
		}
	}
	p.waitIdle(t)
}

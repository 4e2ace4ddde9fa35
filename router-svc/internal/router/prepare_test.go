package router

import (
	"math"
	"strings"
	"testing"

	"github.com/baton-serving/baton/engine/gguf"
	"github.com/baton-serving/baton/engine/jsonschema"
	"github.com/baton-serving/baton/engine/model"
	"github.com/baton-serving/baton/engine/refdata"
	"github.com/baton-serving/baton/engine/tokenizer"
	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"github.com/baton-serving/baton/router-svc/internal/openai"
	"github.com/baton-serving/baton/svckit/apiconv"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// testRouter is a router with the shared model's tokenizer and
// hyper-parameters, as Open would set them up.
func testRouter(t *testing.T) *Service {
	t.Helper()
	f, err := gguf.Open(refdata.Model(t))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	s := New()
	if s.tok, err = tokenizer.FromGGUF(f); err != nil {
		t.Fatal(err)
	}
	if s.cfg, s.fingerprint, err = model.Inspect(f, 0); err != nil {
		t.Fatal(err)
	}
	s.modelID, s.maxNewTokens = "stories260K", 256
	s.limits.maxN = apiconv.DefaultMaxN
	s.maxTokenBytes = openai.MaxTokenBytes(s.tok)
	return s
}

func TestPrepare(t *testing.T) {
	s := testRouter(t)
	req, err := s.prepare(&batonv1.GenerateRequest{Prompt: "Once upon a time"})
	if err != nil {
		t.Fatal(err)
	}
	if got := req.GetPromptTokenIds(); len(got) != 5 || got[0] != 1 || got[1] != 403 {
		t.Errorf("prompt ids = %v, want [1 403 407 261 378]", got)
	}
	if req.GetPrompt() != "" || req.GetRequestId() == "" || req.GetModel() != "stories260K" {
		t.Errorf("prepared = %v", req)
	}
	if req.GetSampling().Seed == nil {
		t.Error("seed not fixed")
	}
	// Default max_new_tokens is capped by the context window (128 here).
	if got := req.GetSampling().GetMaxNewTokens(); got != 128-5 {
		t.Errorf("max_new_tokens = %d, want %d", got, 128-5)
	}
	// The empty prompt is BOS alone.
	req, err = s.prepare(&batonv1.GenerateRequest{})
	if err != nil || len(req.GetPromptTokenIds()) != 1 {
		t.Errorf("empty prompt: %v, %v", req.GetPromptTokenIds(), err)
	}
	// n up to --max-n passes, unchanged.
	req, err = s.prepare(&batonv1.GenerateRequest{Prompt: "x", Sampling: &batonv1.SamplingParams{N: proto.Uint32(16)}})
	if err != nil || req.GetSampling().GetN() != 16 {
		t.Errorf("n = 16: %v, %v", req.GetSampling(), err)
	}
	// The client's seed is kept.
	req, _ = s.prepare(&batonv1.GenerateRequest{Prompt: "x", Sampling: &batonv1.SamplingParams{Seed: proto.Uint64(9)}})
	if req.GetSampling().GetSeed() != 9 {
		t.Errorf("seed = %d", req.GetSampling().GetSeed())
	}
}

func TestPrepareRejects(t *testing.T) {
	s := testRouter(t)
	long := strings.Repeat("Once upon a time ", 60)
	cases := []struct {
		name string
		in   *batonv1.GenerateRequest
		code codes.Code
		want string
	}{
		{"unknown model", &batonv1.GenerateRequest{Model: "gpt-9", Prompt: "x"}, codes.NotFound, `model "gpt-9"`},
		{"bad id", &batonv1.GenerateRequest{RequestId: "a b", Prompt: "x"}, codes.InvalidArgument, "request_id"},
		{"canary id", &batonv1.GenerateRequest{RequestId: "canary-0123", Prompt: "x"}, codes.InvalidArgument, "reserved for the router's canary"},
		{"both prompts", &batonv1.GenerateRequest{Prompt: "x", PromptTokenIds: []uint32{1}}, codes.InvalidArgument, "prompt: set prompt or prompt_token_ids"},
		{"id beyond vocabulary", &batonv1.GenerateRequest{PromptTokenIds: []uint32{1, 9999}}, codes.InvalidArgument, "prompt_token_ids[1]"},
		{"invalid utf-8", &batonv1.GenerateRequest{Prompt: "a\xffb"}, codes.InvalidArgument, "UTF-8"},
		{"prompt fills the context", &batonv1.GenerateRequest{Prompt: long}, codes.InvalidArgument, "context window is 128"},
		{"too many new tokens", &batonv1.GenerateRequest{Prompt: "x", Sampling: &batonv1.SamplingParams{MaxNewTokens: 500}}, codes.InvalidArgument, "sampling.max_new_tokens"},
		{"bad temperature", &batonv1.GenerateRequest{Prompt: "x", Sampling: &batonv1.SamplingParams{Temperature: proto.Float32(3)}}, codes.InvalidArgument, "sampling.temperature"},
		{"stop id beyond vocabulary", &batonv1.GenerateRequest{Prompt: "x", Sampling: &batonv1.SamplingParams{StopTokenIds: []uint32{512}}}, codes.InvalidArgument, "sampling.stop_token_ids[0]"},
		{"logit_bias id beyond vocabulary", &batonv1.GenerateRequest{Prompt: "x", Sampling: &batonv1.SamplingParams{LogitBias: map[uint32]float32{3: 1, 512: 1}}}, codes.InvalidArgument, "sampling.logit_bias[512]"},
		{"logit_bias above 100", &batonv1.GenerateRequest{Prompt: "x", Sampling: &batonv1.SamplingParams{LogitBias: map[uint32]float32{3: 100.5}}}, codes.InvalidArgument, "sampling.logit_bias[3]"},
		{"logit_bias NaN", &batonv1.GenerateRequest{Prompt: "x", Sampling: &batonv1.SamplingParams{LogitBias: map[uint32]float32{3: float32(math.NaN())}}}, codes.InvalidArgument, "sampling.logit_bias[3]"},
		{"n 0", &batonv1.GenerateRequest{Prompt: "x", Sampling: &batonv1.SamplingParams{N: proto.Uint32(0)}}, codes.InvalidArgument, "sampling.n = 0"},
		{"n above --max-n", &batonv1.GenerateRequest{Prompt: "x", Sampling: &batonv1.SamplingParams{N: proto.Uint32(17)}}, codes.InvalidArgument, "sampling.n = 17"},
		{"logit_bias too many", &batonv1.GenerateRequest{Prompt: "x", Sampling: &batonv1.SamplingParams{LogitBias: manyBiases(1025)}}, codes.InvalidArgument, "sampling.logit_bias = 1025 entries"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := s.prepare(c.in)
			st := status.Convert(err)
			if st.Code() != c.code || !strings.Contains(st.Message(), c.want) {
				t.Errorf("got %v, want %v naming %q", err, c.code, c.want)
			}
		})
	}
}

func TestInflightRejectsDuplicates(t *testing.T) {
	inf := newInflight()
	remove, err := inf.add(&request{id: "a"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := inf.add(&request{id: "a"}); status.Code(err) != codes.AlreadyExists {
		t.Errorf("duplicate: %v", err)
	}
	remove()
	remove()
	if inf.len() != 0 {
		t.Errorf("len after remove = %d", inf.len())
	}
	if _, err := inf.add(&request{id: "a"}); err != nil {
		t.Errorf("re-adding a finished id: %v", err)
	}
}

// manyBiases is a logit_bias of n entries (ids beyond the vocabulary from
// 512 on: the count is checked first).
func manyBiases(n int) map[uint32]float32 {
	m := make(map[uint32]float32, n)
	for i := range n {
		m[uint32(i)] = 1
	}
	return m
}

// TestPrepareKeepsLogitBias: a valid logit_bias reaches the workers as sent.
func TestPrepareKeepsLogitBias(t *testing.T) {
	s := testRouter(t)
	req, err := s.prepare(&batonv1.GenerateRequest{Prompt: "x", Sampling: &batonv1.SamplingParams{LogitBias: map[uint32]float32{0: -100, 511: 100}}})
	if err != nil {
		t.Fatal(err)
	}
	if b := req.GetSampling().GetLogitBias(); len(b) != 2 || b[0] != -100 || b[511] != 100 {
		t.Errorf("logit_bias = %v", b)
	}
}

// TestPrepareConstraints: the native API's grammar is parsed and its
// json_schema compiled at the router (travelling as the grammar); what the
// constrained decoder cannot follow is INVALID_ARGUMENT naming the field.
func TestPrepareConstraints(t *testing.T) {
	s := testRouter(t)
	const schema = `{"type":"object","properties":{"a":{"type":"boolean"}},"required":["a"],"additionalProperties":false}`
	req, err := s.prepare(&batonv1.GenerateRequest{Prompt: "x", Sampling: &batonv1.SamplingParams{JsonSchema: schema}})
	if err != nil {
		t.Fatal(err)
	}
	want, err := jsonschema.ToGrammar([]byte(schema))
	if err != nil {
		t.Fatal(err)
	}
	if sp := req.GetSampling(); sp.GetGrammar() != want || sp.GetJsonSchema() != "" {
		t.Errorf("grammar %q json_schema %q, want the compiled schema", sp.GetGrammar(), sp.GetJsonSchema())
	}
	const gbnf = `root ::= "yes" | "no"`
	if req, err := s.prepare(&batonv1.GenerateRequest{Prompt: "x", Sampling: &batonv1.SamplingParams{Grammar: gbnf}}); err != nil || req.GetSampling().GetGrammar() != gbnf {
		t.Errorf("grammar: %v %v", req.GetSampling(), err)
	}
	for _, c := range []struct {
		name string
		sp   *batonv1.SamplingParams
		want string
	}{
		{"bad grammar", &batonv1.SamplingParams{Grammar: "root ::= ("}, "sampling.grammar"},
		{"unsupported keyword", &batonv1.SamplingParams{JsonSchema: `{"type":"object","patternProperties":{"x":{}}}`}, "patternProperties"},
		{"schema not JSON", &batonv1.SamplingParams{JsonSchema: `{"type":`}, "sampling.json_schema"},
		{"both", &batonv1.SamplingParams{Grammar: gbnf, JsonSchema: schema}, "sampling.grammar"},
	} {
		_, err := s.prepare(&batonv1.GenerateRequest{Prompt: "x", Sampling: c.sp})
		if st := status.Convert(err); st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), c.want) {
			t.Errorf("%s: %v, want INVALID_ARGUMENT naming %q", c.name, err, c.want)
		}
	}
}

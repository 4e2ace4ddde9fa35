package router

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"unicode/utf8"

	"github.com/baton-serving/baton/engine/grammar"
	"github.com/baton-serving/baton/engine/jsonschema"
	"github.com/baton-serving/baton/engine/tokenizer"
	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"github.com/baton-serving/baton/router-svc/internal/canary"
	"github.com/baton-serving/baton/router-svc/internal/openai"
	"github.com/baton-serving/baton/svckit/apiconv"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// prepare validates a client's request and returns the request the workers
// get: with an id, the prompt as token ids, max_new_tokens set and a fixed
// seed (so that prefill and decode draw the same random numbers, and a
// request can be replayed), and a json_schema compiled to its grammar.
// Every error is INVALID_ARGUMENT (NOT_FOUND for an unknown model) naming
// the field.
func (s *Service) prepare(in *batonv1.GenerateRequest) (*batonv1.GenerateRequest, error) {
	bad := func(format string, a ...any) error { return status.Errorf(codes.InvalidArgument, format, a...) }
	if in == nil {
		return nil, bad("request: missing")
	}
	req := proto.Clone(in).(*batonv1.GenerateRequest)
	if m := req.GetModel(); m != "" && m != s.modelID {
		return nil, status.Errorf(codes.NotFound, "model %q is not served here (this router serves %q)", m, s.modelID)
	}
	req.Model = s.modelID
	if req.GetRequestId() == "" {
		req.RequestId = newRequestID()
	} else if err := apiconv.ValidRequestID(req.GetRequestId()); err != nil {
		return nil, bad("%v", err)
	} else if canary.ReservedID(req.GetRequestId()) {
		return nil, bad("request_id %q: ids starting with %q are reserved for the router's canary", req.GetRequestId(), canary.IDPrefix)
	}

	vocab := s.cfg.Vocab
	switch {
	case req.GetPrompt() != "" && len(req.GetPromptTokenIds()) > 0:
		return nil, bad("prompt: set prompt or prompt_token_ids, not both")
	case len(req.GetPromptTokenIds()) > 0:
		if _, err := apiconv.TokenIDs("prompt_token_ids", req.GetPromptTokenIds(), vocab); err != nil {
			return nil, bad("%v", err)
		}
	default:
		if !utf8.ValidString(req.GetPrompt()) {
			return nil, bad("prompt: not valid UTF-8")
		}
		// A text that cannot fit whatever it tokenizes to is refused
		// before any tokenizing (openai.MaxTokenBytes).
		tokens, reason, _ := openai.PromptLimit(s.cfg.ContextLength, s.limits.maxPromptTokens)
		if n := len(req.GetPrompt()); int64(n) > int64(tokens)*int64(s.maxTokenBytes) {
			return nil, bad("prompt: %d bytes, more than %d tokens can hold (%d bytes at most per token of this model's vocabulary); %s",
				n, tokens, s.maxTokenBytes, reason)
		}
		ids := s.tok.Encode(req.GetPrompt(), tokenizer.EncodeOptions{AddSpecial: true, ParseSpecial: true})
		if len(ids) == 0 {
			return nil, bad("prompt: empty (the model adds no BOS token, so there is nothing to complete)")
		}
		req.PromptTokenIds = apiconv.WireIDs(ids)
		req.Prompt = ""
	}
	n, ctxLen := len(req.GetPromptTokenIds()), s.cfg.ContextLength
	if lim := s.limits.maxPromptTokens; lim > 0 && n > lim {
		return nil, bad("prompt: %d tokens; this router accepts at most %d (--max-prompt-tokens)", n, lim)
	}
	if n >= ctxLen {
		return nil, bad("prompt: %d tokens; the context window is %d tokens and at least one must be left to generate", n, ctxLen)
	}
	if req.Sampling == nil {
		req.Sampling = &batonv1.SamplingParams{}
	}
	sp := req.Sampling
	switch maxNew, lim := int(sp.GetMaxNewTokens()), s.limits.maxNewTokens; {
	case maxNew == 0:
		sp.MaxNewTokens = uint32(min(s.maxNewTokens, ctxLen-n))
	case lim > 0 && maxNew > lim:
		return nil, bad("sampling.max_new_tokens: %d; this router generates at most %d tokens per request (--max-new-tokens-limit)", maxNew, lim)
	case n+maxNew > ctxLen:
		return nil, bad("sampling.max_new_tokens: %d tokens of prompt + %d new tokens exceed the context window of %d", n, maxNew, ctxLen)
	}
	if _, err := apiconv.SamplingVocab(sp, vocab); err != nil {
		return nil, bad("%v", err)
	}
	if _, err := apiconv.StopTokenIDs(sp, vocab); err != nil {
		return nil, bad("%v", err)
	}
	if _, err := apiconv.Choices(sp, s.limits.maxN); err != nil {
		return nil, bad("%v", err)
	}
	// A grammar or schema the constrained decoder cannot follow is refused
	// here, naming the field (and the schema keyword), not by the workers.
	// A schema travels compiled, as the grammar the workers would make of
	// it.
	if js := sp.GetJsonSchema(); js != "" {
		g, err := jsonschema.ToGrammar([]byte(js))
		if err != nil {
			return nil, bad("sampling.json_schema: %v", err)
		}
		sp.Grammar, sp.JsonSchema = g, ""
	}
	if g := sp.GetGrammar(); g != "" {
		if _, err := grammar.Parse(g); err != nil {
			if in.GetSampling().GetJsonSchema() != "" {
				return nil, status.Errorf(codes.Internal, "sampling.json_schema: the compiled grammar does not parse: %v", err)
			}
			return nil, bad("sampling.grammar: %v", err)
		}
	}
	if sp.Seed == nil {
		seed := randomUint64()
		sp.Seed = &seed
	}
	return req, nil
}

func newRequestID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return "req-" + hex.EncodeToString(b[:])
}

func randomUint64() uint64 {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return binary.LittleEndian.Uint64(b[:])
}

// Package backend sends benchmark requests to a Baton router and reports
// each streamed chunk of output as it arrives: over gRPC
// (RouterService.Generate) or over the OpenAI-compatible HTTP API
// (POST /v1/completions with stream=true, read as server-sent events).
package backend

import (
	"context"
	"fmt"
	"strings"
)

// Request is one completion to ask for.
type Request struct {
	// PromptIDs is the prompt as token ids, passed to the model unchanged.
	PromptIDs []int32
	// MaxTokens is the most tokens to generate.
	MaxTokens int
	// IgnoreEOS keeps generating through end-of-generation tokens, so a
	// request produces exactly MaxTokens tokens.
	IgnoreEOS bool
	// Temperature 0 is greedy decoding.
	Temperature float64
	// Seed is the sampling seed.
	Seed uint64
}

// Result is what the server reported about a finished request.
type Result struct {
	// InputTokens and OutputTokens are the server's counts (usage).
	InputTokens, OutputTokens int
	// ServerTTFT is the router's own time to first token in seconds when
	// it reports one (gRPC timing), else 0.
	ServerTTFT float64
	// FinishReason is "stop" or "length".
	FinishReason string
	// CachedTokens are the prompt tokens the server reused from a cache
	// (usage.prompt_tokens_details.cached_tokens, Baton's usage, or
	// llama-server's timings.cache_n); 0 when it reports none.
	CachedTokens int
	// KVTransferBytes are the K and V bytes that crossed from prefill to
	// decode for the prompt (gRPC timing); valid when HasKVTransferBytes.
	KVTransferBytes    uint64
	HasKVTransferBytes bool
	// Stages is where the server says the request's time went (gRPC
	// timing), nil when it does not say.
	Stages *Stages
}

// Stages are the server's per-stage times of one request, in seconds.
type Stages struct {
	PreallocWait, PrefillQueue, Prefill, KVTransfer, Decode float64
}

// OnChunk is called, on the goroutine that called Generate, as each chunk of
// output arrives. tokens is the number of tokens it carries, or 0 when the
// API does not say.
type OnChunk func(tokens int)

// Model describes the served model.
type Model struct {
	ID            string
	VocabSize     int
	ContextLength int
	Fingerprint   string
}

// Backend is a router API.
type Backend interface {
	// Model asks the router which model it serves.
	Model(ctx context.Context) (Model, error)
	// Generate runs one request to its end, calling onChunk for each
	// chunk of output. An error ends the request: the server's refusal,
	// a broken stream or an abort.
	Generate(ctx context.Context, req Request, onChunk OnChunk) (Result, error)
	// Close releases the connections.
	Close() error
}

// Options configure New.
type Options struct {
	// Kind is "grpc" or "openai".
	Kind string
	// Addr is the router's gRPC address (grpc) or HTTP address or base
	// URL (openai).
	Addr string
	// APIKey, when set, is sent as a bearer token.
	APIKey string
	// MaxConns bounds the HTTP connections kept open for reuse (openai).
	MaxConns int
}

// New connects to the router.
func New(o Options) (Backend, error) {
	switch o.Kind {
	case "grpc":
		return NewGRPC(o.Addr, o.APIKey)
	case "openai":
		return NewOpenAI(o.Addr, o.APIKey, o.MaxConns)
	}
	return nil, fmt.Errorf("backend %q: want grpc or openai", o.Kind)
}

// wireIDs converts token ids to the API's unsigned form; a negative id is
// a bug in the caller's dataset.
func wireIDs(ids []int32) ([]uint32, error) {
	out := make([]uint32, len(ids))
	for i, id := range ids {
		if id < 0 {
			return nil, fmt.Errorf("prompt token %d: negative id %d", i, id)
		}
		out[i] = uint32(id)
	}
	return out, nil
}

// oneLine flattens a message so that the same failure groups under one
// message in the report.
func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

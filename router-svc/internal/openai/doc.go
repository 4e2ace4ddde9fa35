// Package openai serves the OpenAI-compatible HTTP API of Baton's router:
// POST /v1/completions and POST /v1/chat/completions (whole, or streamed as
// server-sent events with "data: [DONE]" at the end), GET /v1/models and
// GET /v1/models/{model}.
//
// The package validates and decodes requests, renders chat prompts with the
// model's chat template (see ChatTemplate), tokenizes them, and hands each
// request to a Generator — the router, which routes it to its workers — as a
// baton.v1.GenerateRequest carrying token ids. Every refusal is an error in
// OpenAI's shape, {"error":{"message","type","param","code"}}, with param
// naming the offending request field by its JSON path; errors from the
// Generator, which are gRPC status errors, are mapped by one table
// (codeTable) to HTTP statuses and OpenAI error types.
//
// Parameters: model, prompt / messages, max_tokens (max_completion_tokens),
// temperature, top_p, n (1 only), stop, seed, presence_penalty,
// frequency_penalty, logprobs / top_logprobs, user, stream and
// stream_options.include_usage; and the extensions top_k, min_p,
// repetition_penalty and ignore_eos. A client may name its request with the
// X-Request-Id header (echoed in the answer; a duplicate of a request in
// flight is 409), and the response ids are "cmpl-<id>" and "chatcmpl-<id>".
//
// A client that goes away cancels its request's context, which the router
// propagates to every worker. Optional API keys (Keys) guard the HTTP API
// and, through Keys.Guard, the router's gRPC service.
package openai

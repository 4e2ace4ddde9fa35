// Package engine is Baton's inference engine: GGUF loading (gguf), tokenizers
// (tokenizer), model architectures (model), sampling (sample) and, later, the
// paged KV cache and the continuous-batching scheduler. It depends on kernels
// only; it never imports gRPC or generated code, so it can be tested and
// benchmarked on its own.
package engine

// Package engine is Baton's inference engine: GGUF loading (gguf), model
// files and downloads (modelfile), tokenizers (tokenizer), model
// architectures (model), sampling (sample), the paged KV cache (kvcache) and
// the continuous-batching scheduler (sched). It depends on kernels only; it
// never imports gRPC or generated code, so it can be tested and benchmarked
// on its own.
package engine

// Package tokenizer turns text into token ids and back, the way llama.cpp does
// for the vocabularies stored in GGUF files.
//
// Three tokenizer models are implemented:
//
//   - "llama": SentencePiece-style BPE over scores (llama.cpp's SPM
//     tokenizer). Spaces become "▁" (U+2581), a dummy-prefix space is added
//     before the text (and after every special token) unless the vocabulary
//     turns add_space_prefix off (Gemma), adjacent symbols are merged
//     highest score first, and characters missing from the vocabulary fall
//     back to "<0xHH>" byte tokens.
//   - "gpt2": byte-level BPE over merge ranks. The text is first cut into
//     words by the pre-tokenizer named in tokenizer.ggml.pre (every name
//     llama.cpp c392e50 accepts except deepseek-v3 and jina-v2-*: see
//     docs/tokenizers.md), each word's bytes are mapped to printable code
//     points (the GPT-2 byte-to-unicode table), and merges are applied
//     lowest rank first.
//   - "bert": WordPiece (llama.cpp's WPM): accent-stripped, lower-cased
//     words covered greedily by the longest tokens.
//
// Anything else is refused with an error wrapping engine.ErrUnsupported that
// says "unsupported: NAME". llama.cpp's own tokenizer test set, with more
// cases recorded from llama.cpp, is the oracle (llamacpp_test.go).
//
// The core works on a plain Vocab, so a tokenizer can be built in memory;
// FromGGUF is a thin adapter that fills a Vocab from a GGUF file's
// tokenizer.* metadata.
//
// # Special tokens
//
// Control (type 3), user-defined (type 4) and unknown (type 2) tokens are
// "special". With EncodeOptions.ParseSpecial their text is recognised inside
// the input (longest first) and emitted as the token itself, as llama.cpp's
// parse_special does; user-defined tokens are recognised even without it.
//
// # Decoding
//
// Piece renders one token with special tokens shown (llama.cpp's
// token_to_piece with special=true). Decode is llama_detokenize with
// remove_special=false and unparse_special=false: control and unknown tokens
// render as nothing, and the leading space of the very first piece is dropped
// when the vocabulary adds a space prefix. DecodeWith exposes both switches.
// StreamDecoder is for generated text and keeps that leading space: see its
// documentation.
package tokenizer

package tokenizer

import (
	"fmt"

	"github.com/baton-serving/baton/engine"
	"github.com/baton-serving/baton/engine/gguf"
)

// GGUF metadata keys the tokenizer reads.
const (
	keyModel          = "tokenizer.ggml.model"
	keyPre            = "tokenizer.ggml.pre"
	keyTokens         = "tokenizer.ggml.tokens"
	keyScores         = "tokenizer.ggml.scores"
	keyTokenType      = "tokenizer.ggml.token_type"
	keyMerges         = "tokenizer.ggml.merges"
	keyBOS            = "tokenizer.ggml.bos_token_id"
	keyEOS            = "tokenizer.ggml.eos_token_id"
	keyUNK            = "tokenizer.ggml.unknown_token_id"
	keyPAD            = "tokenizer.ggml.padding_token_id"
	keyEOT            = "tokenizer.ggml.eot_token_id"
	keyEOM            = "tokenizer.ggml.eom_token_id"
	keySEP            = "tokenizer.ggml.seperator_token_id" // sic, as llama.cpp spells it
	keyAddBOS         = "tokenizer.ggml.add_bos_token"
	keyAddEOS         = "tokenizer.ggml.add_eos_token"
	keyAddSpacePrefix = "tokenizer.ggml.add_space_prefix"
	keyChatTemplate   = "tokenizer.chat_template"
	keyName           = "general.name"
)

// FromGGUF builds a Tokenizer from f's tokenizer metadata (VocabFromGGUF,
// then New).
func FromGGUF(f *gguf.File) (*Tokenizer, error) {
	v, err := VocabFromGGUF(f)
	if err != nil {
		return nil, err
	}
	return New(v)
}

// VocabFromGGUF reads the standard tokenizer.* keys into a Vocab, starting
// from DefaultVocab for the file's model and pre-tokenizer so that absent
// keys take llama.cpp's defaults. As llama.cpp does, a default special id
// outside the vocabulary is dropped, and a stored id outside it (such as the
// 0xFFFFFFFF converters write for "none") leaves the default in place.
// Scores may be float32 or int32 arrays and, like token types, may be
// longer than the token list (the excess is ignored). A key of the wrong
// type is an error wrapping engine.ErrInvalidInput.
func VocabFromGGUF(f *gguf.File) (Vocab, error) {
	model, err := ggufString(f, keyModel, true)
	if err != nil {
		return Vocab{}, err
	}
	pre, err := ggufString(f, keyPre, false)
	if err != nil {
		return Vocab{}, err
	}
	v := DefaultVocab(model, pre)

	tokens, ok := f.Strings(keyTokens)
	if !ok {
		return Vocab{}, ggufKeyErr(f, keyTokens, "an array of strings")
	}
	n := len(tokens)
	v.Tokens = tokens

	if _, present := f.Get(keyScores); present {
		scores, ok := f.Float32s(keyScores)
		if !ok {
			ints, isInt := f.Int32s(keyScores)
			if !isInt {
				return Vocab{}, ggufKeyErr(f, keyScores, "an array of float32 or int32")
			}
			scores = make([]float32, len(ints))
			for i, s := range ints {
				scores[i] = float32(s)
			}
		}
		if len(scores) < n {
			return Vocab{}, fmt.Errorf("tokenizer: GGUF %s has %d entries for %d tokens: %w", keyScores, len(scores), n, engine.ErrInvalidInput)
		}
		v.Scores = scores[:n:n]
	}

	if _, present := f.Get(keyTokenType); present {
		raw, ok := f.Int32s(keyTokenType)
		if !ok {
			return Vocab{}, ggufKeyErr(f, keyTokenType, "an array of int32")
		}
		if len(raw) < n {
			return Vocab{}, fmt.Errorf("tokenizer: GGUF %s has %d entries for %d tokens: %w", keyTokenType, len(raw), n, engine.ErrInvalidInput)
		}
		v.Types = make([]TokenType, n)
		for i := range v.Types {
			v.Types[i] = TokenType(raw[i])
		}
	}

	if model == ModelGPT2 {
		merges, ok := f.Strings(keyMerges)
		if !ok {
			return Vocab{}, ggufKeyErr(f, keyMerges, "an array of strings")
		}
		v.Merges = merges
	}

	for _, s := range []struct {
		key string
		id  *int32
	}{{keyBOS, &v.BOS}, {keyEOS, &v.EOS}, {keyUNK, &v.UNK}, {keyPAD, &v.PAD}, {keyEOT, &v.EOT}, {keyEOM, &v.EOM}, {keySEP, &v.SEP}} {
		if *s.id != NoToken && int(*s.id) >= n {
			*s.id = NoToken
		}
		if _, present := f.Get(s.key); !present {
			continue
		}
		id, ok := f.Uint(s.key)
		if !ok {
			if signed, isInt := f.Int(s.key); isInt && signed < 0 {
				continue // a negative id means "none", like 0xFFFFFFFF
			}
			return Vocab{}, ggufKeyErr(f, s.key, "an unsigned integer")
		}
		if id < uint64(n) {
			*s.id = int32(id)
		}
	}

	for _, b := range []struct {
		key string
		dst *bool
	}{{keyAddBOS, &v.AddBOS}, {keyAddEOS, &v.AddEOS}, {keyAddSpacePrefix, &v.AddSpacePrefix}} {
		if _, present := f.Get(b.key); !present {
			continue
		}
		val, ok := f.Bool(b.key)
		if !ok {
			return Vocab{}, ggufKeyErr(f, b.key, "a bool")
		}
		*b.dst = val
	}

	if v.ChatTemplate, err = ggufString(f, keyChatTemplate, false); err != nil {
		return Vocab{}, err
	}
	if v.Name, err = ggufString(f, keyName, false); err != nil {
		return Vocab{}, err
	}
	return v, nil
}

// ggufString reads a string key; an absent optional key gives "".
func ggufString(f *gguf.File, key string, required bool) (string, error) {
	if _, present := f.Get(key); !present && !required {
		return "", nil
	}
	s, ok := f.String(key)
	if !ok {
		return "", ggufKeyErr(f, key, "a string")
	}
	return s, nil
}

// ggufKeyErr reports a key that is missing or of the wrong type.
func ggufKeyErr(f *gguf.File, key, want string) error {
	v, present := f.Get(key)
	if !present {
		return fmt.Errorf("tokenizer: GGUF has no %s (want %s): %w", key, want, engine.ErrInvalidInput)
	}
	typ := v.Type().String()
	if et, ok := v.ElemType(); ok {
		typ = "array of " + et.String()
	}
	return fmt.Errorf("tokenizer: GGUF %s is %s, want %s: %w", key, typ, want, engine.ErrInvalidInput)
}

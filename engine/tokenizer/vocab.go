package tokenizer

import (
	"fmt"
	"strconv"

	"github.com/baton-serving/baton/engine"
)

// Tokenizer model names, spelled as tokenizer.ggml.model spells them.
const (
	// ModelLlama is SentencePiece-style BPE with scores and byte fallback.
	ModelLlama = "llama"
	// ModelGPT2 is byte-level BPE with merge ranks and a pre-tokenizer.
	ModelGPT2 = "gpt2"
)

// NoToken marks a special token id as absent (llama.cpp's LLAMA_TOKEN_NULL).
const NoToken int32 = -1

// TokenType is a token's type as stored in tokenizer.ggml.token_type.
type TokenType int32

// The token types GGUF defines; the numbering is part of the format.
const (
	TypeUndefined   TokenType = 0
	TypeNormal      TokenType = 1
	TypeUnknown     TokenType = 2
	TypeControl     TokenType = 3
	TypeUserDefined TokenType = 4
	TypeUnused      TokenType = 5
	TypeByte        TokenType = 6
)

func (t TokenType) String() string {
	switch t {
	case TypeUndefined:
		return "undefined"
	case TypeNormal:
		return "normal"
	case TypeUnknown:
		return "unknown"
	case TypeControl:
		return "control"
	case TypeUserDefined:
		return "user-defined"
	case TypeUnused:
		return "unused"
	case TypeByte:
		return "byte"
	}
	return "TokenType(" + strconv.Itoa(int(t)) + ")"
}

// Vocab is everything a Tokenizer is built from. Start from DefaultVocab to
// get llama.cpp's defaults for the special ids and flags, then fill in the
// token lists.
type Vocab struct {
	// Model is ModelLlama or ModelGPT2.
	Model string
	// Pre names the pre-tokenizer of a ModelGPT2 vocabulary
	// (tokenizer.ggml.pre); "" means "default". Ignored for ModelLlama.
	Pre string

	// Tokens holds each token's text, indexed by id. For ModelLlama spaces
	// are written "▁"; for ModelGPT2 the text is byte-level encoded.
	Tokens []string
	// Scores holds each token's merge score (ModelLlama); nil means all 0.
	Scores []float32
	// Types holds each token's type; nil means all TypeNormal.
	Types []TokenType
	// Merges holds the ModelGPT2 merges, "left right", best first.
	Merges []string

	// Special token ids; NoToken when absent. SEP is BERT's [SEP], which
	// Encode with AddSpecial appends for ModelBERT.
	BOS, EOS, UNK, PAD, EOT, EOM, SEP int32
	// EOG lists further end-of-generation ids besides EOS, EOT and EOM.
	EOG []int32

	// AddBOS and AddEOS say whether Encode with AddSpecial adds BOS / EOS.
	AddBOS, AddEOS bool
	// AddSpacePrefix adds the SentencePiece dummy-prefix space when
	// encoding (ModelLlama only) and makes Decode drop the first piece's
	// leading space (both models, as in llama.cpp).
	AddSpacePrefix bool

	// ChatTemplate is tokenizer.chat_template, kept verbatim.
	ChatTemplate string

	// Name is general.name. As llama.cpp does, New gives the special tokens
	// of a model named like Phi-3 the "rstrip" attribute (white space after
	// them in the input is dropped when they are recognised).
	Name string
}

// DefaultVocab returns a Vocab with no tokens and the special ids and flags
// llama.cpp assumes for the given model and pre-tokenizer when the GGUF file
// does not set them: for "llama" BOS 1, EOS 2, UNK 0, add BOS and a space
// prefix; for "gpt2" BOS = EOS = 11 (llama.cpp's historical default, which
// FromGGUF drops when the vocabulary is smaller), no UNK, and add BOS only for
// the pre-tokenizers that llama.cpp turns it on for (the Llama 3 family).
// An unknown model gets no special ids and all flags off.
func DefaultVocab(model, pre string) Vocab {
	v := Vocab{
		Model: model,
		Pre:   pre,
		BOS:   NoToken, EOS: NoToken, UNK: NoToken, PAD: NoToken, EOT: NoToken, EOM: NoToken, SEP: NoToken,
	}
	switch model {
	case ModelLlama:
		v.BOS, v.EOS, v.UNK = 1, 2, 0
		v.AddBOS = true
		v.AddSpacePrefix = true
	case ModelBERT:
		v.BOS, v.UNK, v.SEP, v.PAD = 101, 100, 102, 0
		v.AddBOS = true
	case ModelGPT2:
		v.BOS, v.EOS = 11, 11
		if cfg, ok := preTokenizers[normPre(pre)]; ok {
			v.AddBOS = cfg.addBOS
			if cfg.noBOS {
				v.BOS = NoToken
			}
		}
	}
	return v
}

// validate checks the Vocab's internal consistency and returns an error
// naming the offending field.
func (v *Vocab) validate() error {
	n := len(v.Tokens)
	if n == 0 {
		return fmt.Errorf("tokenizer: Vocab.Tokens is empty: %w", engine.ErrInvalidInput)
	}
	if int64(n) > int64(1)<<31-1 {
		return fmt.Errorf("tokenizer: Vocab.Tokens has %d entries, more than int32 ids can address: %w", n, engine.ErrInvalidInput)
	}
	if v.Scores != nil && len(v.Scores) != n {
		return fmt.Errorf("tokenizer: Vocab.Scores has %d entries, want one per token (%d): %w", len(v.Scores), n, engine.ErrInvalidInput)
	}
	if v.Types != nil && len(v.Types) != n {
		return fmt.Errorf("tokenizer: Vocab.Types has %d entries, want one per token (%d): %w", len(v.Types), n, engine.ErrInvalidInput)
	}
	for _, s := range []struct {
		name string
		id   int32
	}{{"BOS", v.BOS}, {"EOS", v.EOS}, {"UNK", v.UNK}, {"PAD", v.PAD}, {"EOT", v.EOT}, {"EOM", v.EOM}, {"SEP", v.SEP}} {
		if s.id != NoToken && (s.id < 0 || int(s.id) >= n) {
			return fmt.Errorf("tokenizer: Vocab.%s = %d is outside the vocabulary [0, %d): %w", s.name, s.id, n, engine.ErrInvalidInput)
		}
	}
	for i, id := range v.EOG {
		if id < 0 || int(id) >= n {
			return fmt.Errorf("tokenizer: Vocab.EOG[%d] = %d is outside the vocabulary [0, %d): %w", i, id, n, engine.ErrInvalidInput)
		}
	}
	if v.AddBOS && v.BOS == NoToken {
		return fmt.Errorf("tokenizer: Vocab.AddBOS is set but Vocab.BOS is NoToken: %w", engine.ErrInvalidInput)
	}
	if v.AddEOS && v.EOS == NoToken {
		return fmt.Errorf("tokenizer: Vocab.AddEOS is set but Vocab.EOS is NoToken: %w", engine.ErrInvalidInput)
	}
	switch v.Model {
	case ModelLlama, ModelBERT:
	case ModelGPT2:
		if _, ok := preTokenizers[normPre(v.Pre)]; !ok {
			return fmt.Errorf("tokenizer: %w: %s (Vocab.Pre %q, tokenizer.ggml.pre: a pre-tokenizer this package does not implement; docs/tokenizers.md lists those it does)", engine.ErrUnsupported, v.Pre, v.Pre)
		}
	default:
		return fmt.Errorf("tokenizer: %w: %s (Vocab.Model %q, tokenizer.ggml.model: a tokenizer model this package does not implement; docs/tokenizers.md lists those it does)", engine.ErrUnsupported, v.Model, v.Model)
	}
	return nil
}

package tokenizer

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/baton-serving/baton/engine"
)

// Tokenizer encodes text to token ids and decodes ids to text. It is
// immutable after New and safe for concurrent use.
type Tokenizer struct {
	model  string
	tokens []string
	scores []float32
	types  []TokenType
	toID   map[string]int32
	pieces []string // token_to_piece with special tokens shown

	bos, eos, unk, pad, eot, eom int32
	sep                          int32 // ModelBERT: ends the text with AddSpecial
	eog                          map[int32]struct{}
	maxTokenLen                  int // longest token text in bytes (ModelBERT)

	addBOS, addEOS, addSpacePrefix bool

	// specials are the control, user-defined and unknown tokens, longest
	// text first: the order in which their text is looked for in the input.
	specials []int32
	// lstrip and rstrip mark specials that, when recognised in the input,
	// swallow the ASCII white space before / after them (llama.cpp's
	// LLAMA_TOKEN_ATTR_LSTRIP / _RSTRIP, which it sets by model name).
	lstrip, rstrip map[int32]bool
	// specialStart marks the first bytes of the specials' texts, so that
	// text that cannot contain one skips the search.
	specialStart [256]bool
	// byteIDs are the SentencePiece byte-fallback tokens (NoToken if none).
	byteIDs [256]int32

	preName string    // ModelGPT2 only
	pre     preConfig // ModelGPT2 only
	ranks   map[mergePair]int32

	chatTemplate string
}

// EncodeOptions control Encode.
type EncodeOptions struct {
	// AddSpecial adds BOS and/or EOS as the vocabulary's AddBOS / AddEOS
	// flags say (llama.cpp's add_special).
	AddSpecial bool
	// ParseSpecial recognises the text of control and unknown tokens (for
	// example "<s>") in the input and emits the token itself (llama.cpp's
	// parse_special). User-defined tokens are recognised either way.
	ParseSpecial bool
}

// eogTexts are token texts that end generation whatever the metadata says,
// the list llama.cpp keeps (minus model-specific exceptions it undoes again).
var eogTexts = []string{
	"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
	"<|eom_id|>", "<EOT>", "_<EOT>", "<|end_of_text|>", "<｜end▁of▁sentence｜>",
}

// eotTexts and eomTexts are looked for, in this order, when the vocabulary
// has no EOT / EOM id.
var (
	eotTexts = []string{
		"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
		"<EOT>", "_<EOT>", "<｜end▁of▁sentence｜>",
	}
	eomTexts = []string{"<|eom_id|>"}
)

// New builds a Tokenizer from v after checking it: the vocabulary must be
// non-empty with unique token texts, Scores and Types must have one entry
// per token (or be nil), special ids must lie inside the vocabulary, and a
// flag that adds BOS or EOS needs that id. Errors wrap
// engine.ErrInvalidInput, or engine.ErrUnsupported for an unknown model or
// pre-tokenizer.
//
// As llama.cpp does, New treats empty token texts as "[EMPTY_<id>]", finds
// EOT / EOM by their usual texts when v does not name them, and makes the
// tokens with end-of-generation texts (eogTexts) control tokens.
func New(v Vocab) (*Tokenizer, error) {
	if err := v.validate(); err != nil {
		return nil, err
	}
	n := len(v.Tokens)
	t := &Tokenizer{
		model:          v.Model,
		tokens:         make([]string, n),
		scores:         slices.Clone(v.Scores),
		types:          make([]TokenType, n),
		toID:           make(map[string]int32, n),
		bos:            v.BOS,
		eos:            v.EOS,
		unk:            v.UNK,
		pad:            v.PAD,
		sep:            v.SEP,
		eot:            v.EOT,
		eom:            v.EOM,
		eog:            make(map[int32]struct{}),
		addBOS:         v.AddBOS,
		addEOS:         v.AddEOS,
		addSpacePrefix: v.AddSpacePrefix,
		chatTemplate:   v.ChatTemplate,
	}
	for i, text := range v.Tokens {
		if text == "" {
			text = "[EMPTY_" + strconv.Itoa(i) + "]"
		}
		if j, dup := t.toID[text]; dup {
			return nil, fmt.Errorf("tokenizer: Vocab.Tokens[%d] %q repeats Vocab.Tokens[%d]: %w", i, text, j, engine.ErrInvalidInput)
		}
		t.tokens[i] = text
		t.toID[text] = int32(i)
		t.maxTokenLen = max(t.maxTokenLen, len(text))
		t.types[i] = TypeNormal
		if v.Types != nil {
			t.types[i] = v.Types[i]
		}
	}

	t.findEOG(v.EOG)

	for id, typ := range t.types {
		if typ == TypeControl || typ == TypeUserDefined || typ == TypeUnknown {
			t.specials = append(t.specials, int32(id))
			t.specialStart[t.tokens[id][0]] = true
		}
	}
	slices.SortStableFunc(t.specials, func(a, b int32) int {
		return len(t.tokens[b]) - len(t.tokens[a])
	})
	t.setStripAttrs(v)

	const hex = "0123456789ABCDEF"
	for b := range 256 {
		t.byteIDs[b] = NoToken
		if id, ok := t.toID["<0x"+string([]byte{hex[b>>4], hex[b&15]})+">"]; ok {
			t.byteIDs[b] = id
		} else if id, ok := t.toID[string([]byte{byte(b)})]; ok {
			t.byteIDs[b] = id
		}
	}

	if v.Model == ModelBERT {
		t.pre = preConfig{cleanSpaces: true} // llama.cpp cleans spaces for WPM
	}
	if v.Model == ModelGPT2 {
		t.preName = normPre(v.Pre)
		t.pre = preTokenizers[t.preName]
		t.ranks = make(map[mergePair]int32, len(v.Merges))
		for rank, m := range v.Merges {
			// Split at the first space after the first byte, as llama.cpp
			// does; a line without one can never match and is skipped.
			k := strings.IndexByte(m[min(1, len(m)):], ' ')
			if k < 0 {
				continue
			}
			k += min(1, len(m))
			p := mergePair{m[:k], m[k+1:]}
			if _, seen := t.ranks[p]; !seen {
				t.ranks[p] = int32(rank)
			}
		}
	}

	t.pieces = make([]string, n)
	for id := range t.pieces {
		t.pieces[id] = t.renderPiece(int32(id))
	}
	return t, nil
}

// setStripAttrs gives tokens the strip attributes llama.cpp gives them by
// model name: for a model whose general.name contains "phi-3" or "phi3",
// every special token and "</s>" strip to their right, except <unk>, <s>
// and <|endoftext|>. (llama.cpp also gives jina-v2-de/-es/-code's <mask>
// lstrip; those pre-tokenizers are refused, so lstrip stays unused.)
func (t *Tokenizer) setStripAttrs(v Vocab) {
	t.lstrip, t.rstrip = map[int32]bool{}, map[int32]bool{}
	name := strings.ToLower(v.Name)
	switch {
	case strings.Contains(name, "phi-3") || strings.Contains(name, "phi3"):
		for _, id := range t.specials {
			t.rstrip[id] = true
		}
		if id, ok := t.toID["</s>"]; ok {
			t.rstrip[id] = true
		}
		for _, s := range []string{"<unk>", "<s>", "<|endoftext|>"} {
			if id, ok := t.toID[s]; ok {
				delete(t.rstrip, id)
			}
		}
	}
}

// findEOG builds the end-of-generation set from EOS, EOT, EOM, extra and the
// tokens whose text says so, filling in EOT and EOM when they are unset.
func (t *Tokenizer) findEOG(extra []int32) {
	byText := func(texts []string) int32 {
		for _, s := range texts {
			if id, ok := t.toID[s]; ok {
				return id
			}
		}
		return NoToken
	}
	if t.eot == NoToken {
		if t.eot = byText(eotTexts); t.eot != NoToken {
			t.forceControl(t.eot)
		}
	}
	if t.eom == NoToken {
		if t.eom = byText(eomTexts); t.eom != NoToken {
			t.forceControl(t.eom)
		}
	}
	for _, s := range eogTexts {
		if id, ok := t.toID[s]; ok {
			t.eog[id] = struct{}{}
			t.forceControl(id)
		}
	}
	for _, id := range append([]int32{t.eos, t.eot, t.eom}, extra...) {
		if id != NoToken {
			t.eog[id] = struct{}{}
		}
	}
}

// forceControl marks a token control, as llama.cpp does for tokens whose
// text makes them end-of-turn markers whatever their stored type.
func (t *Tokenizer) forceControl(id int32) {
	switch t.types[id] {
	case TypeControl, TypeUnknown, TypeUserDefined:
	default:
		t.types[id] = TypeControl
	}
}

// Encode tokenizes text. It never fails: characters the vocabulary lacks
// become byte-fallback tokens (llama) or the unknown token, if any.
func (t *Tokenizer) Encode(text string, opts EncodeOptions) []int32 {
	frags := t.partition(text, opts.ParseSpecial)
	out := make([]int32, 0, len(text)/3+2)
	if t.model == ModelBERT {
		// llama.cpp's WPM add_special is always [CLS] text [SEP].
		if opts.AddSpecial && t.bos != NoToken {
			out = append(out, t.bos)
		}
		out = t.encodeWPM(frags, out)
		if opts.AddSpecial && t.sep != NoToken {
			out = append(out, t.sep)
		}
		return out
	}
	if opts.AddSpecial && t.addBOS {
		out = append(out, t.bos)
	}
	if t.model == ModelLlama {
		out = t.encodeSPM(frags, out)
	} else {
		out = t.encodeBPE(frags, out)
	}
	if opts.AddSpecial && t.addEOS {
		out = append(out, t.eos)
	}
	return out
}

// fragment is a piece of the input: raw text, or a special token found in
// it (id != NoToken).
type fragment struct {
	text string
	id   int32
}

// partition cuts text around the special tokens it contains, longest token
// text first, as llama.cpp's tokenizer_st_partition does. Control and
// unknown tokens count only when parseSpecial is set.
func (t *Tokenizer) partition(text string, parseSpecial bool) []fragment {
	if text == "" {
		return nil
	}
	frags := []fragment{{text: text, id: NoToken}}
	if !t.mayHoldSpecial(text) {
		return frags
	}
	for _, id := range t.specials {
		typ := t.types[id]
		if !parseSpecial && (typ == TypeControl || typ == TypeUnknown) {
			continue
		}
		tok := t.tokens[id]
		var next []fragment
		for i, f := range frags {
			if f.id != NoToken || !strings.Contains(f.text, tok) {
				if next != nil {
					next = append(next, f)
				}
				continue
			}
			if next == nil {
				next = append(make([]fragment, 0, len(frags)+4), frags[:i]...)
			}
			rest := f.text
			for {
				k := strings.Index(rest, tok)
				if k < 0 {
					break
				}
				left := rest[:k]
				if t.lstrip[id] {
					left = strings.TrimRight(left, asciiSpace)
				}
				if left != "" {
					next = append(next, fragment{text: left, id: NoToken})
				}
				next = append(next, fragment{id: id})
				rest = rest[k+len(tok):]
				if t.rstrip[id] {
					rest = strings.TrimLeft(rest, asciiSpace)
				}
			}
			if rest != "" {
				next = append(next, fragment{text: rest, id: NoToken})
			}
		}
		if next != nil {
			frags = next
		}
	}
	return frags
}

// asciiSpace is what C's isspace accepts, which llama.cpp strips with.
const asciiSpace = " \t\n\v\f\r"

func (t *Tokenizer) mayHoldSpecial(text string) bool {
	for i := 0; i < len(text); i++ {
		if t.specialStart[text[i]] {
			return true
		}
	}
	return false
}

func (t *Tokenizer) score(id int32) float32 {
	if t.scores == nil {
		return 0
	}
	return t.scores[id]
}

func (t *Tokenizer) valid(id int32) bool { return id >= 0 && int(id) < len(t.tokens) }

// VocabSize returns the number of tokens.
func (t *Tokenizer) VocabSize() int { return len(t.tokens) }

// Model returns the tokenizer model: ModelLlama, ModelGPT2 or ModelBERT.
func (t *Tokenizer) Model() string { return t.model }

// Pre returns the pre-tokenizer name of a ModelGPT2 tokenizer ("default"
// when the vocabulary named none), and "" for ModelLlama.
func (t *Tokenizer) Pre() string { return t.preName }

// BOS returns the beginning-of-sequence id, or NoToken.
func (t *Tokenizer) BOS() int32 { return t.bos }

// EOS returns the end-of-sequence id, or NoToken.
func (t *Tokenizer) EOS() int32 { return t.eos }

// EOT returns the end-of-turn id, or NoToken.
func (t *Tokenizer) EOT() int32 { return t.eot }

// UNK returns the unknown-token id, or NoToken.
func (t *Tokenizer) UNK() int32 { return t.unk }

// SEP returns the separator id (BERT's [SEP]), or NoToken.
func (t *Tokenizer) SEP() int32 { return t.sep }

// PAD returns the padding id, or NoToken.
func (t *Tokenizer) PAD() int32 { return t.pad }

// AddBOS reports whether Encode with AddSpecial prepends BOS.
func (t *Tokenizer) AddBOS() bool { return t.addBOS }

// AddEOS reports whether Encode with AddSpecial appends EOS.
func (t *Tokenizer) AddEOS() bool { return t.addEOS }

// IsEOG reports whether id ends generation: EOS, EOT, EOM, the ids
// Vocab.EOG lists, and the tokens with end-of-turn texts such as
// "<|eot_id|>" or "<|im_end|>".
func (t *Tokenizer) IsEOG(id int32) bool {
	_, ok := t.eog[id]
	return ok
}

// EOGs returns the end-of-generation ids in increasing order.
func (t *Tokenizer) EOGs() []int32 {
	ids := make([]int32, 0, len(t.eog))
	for id := range t.eog {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// Special reports whether id is a control, unknown or user-defined token:
// one whose text is matched literally in the input rather than tokenized.
func (t *Tokenizer) Special(id int32) bool {
	if !t.valid(id) {
		return false
	}
	switch t.types[id] {
	case TypeControl, TypeUnknown, TypeUserDefined:
		return true
	}
	return false
}

// Type returns id's token type (after New's adjustments), or
// TypeUndefined for an id outside the vocabulary.
func (t *Tokenizer) Type(id int32) TokenType {
	if !t.valid(id) {
		return TypeUndefined
	}
	return t.types[id]
}

// Token returns id's raw vocabulary text ("▁Once", "<0x0A>", "Ġthe"), or ""
// for an id outside the vocabulary.
func (t *Tokenizer) Token(id int32) string {
	if !t.valid(id) {
		return ""
	}
	return t.tokens[id]
}

// TokenID looks a token up by its raw vocabulary text.
func (t *Tokenizer) TokenID(text string) (int32, bool) {
	id, ok := t.toID[text]
	return id, ok
}

// ChatTemplate returns tokenizer.chat_template verbatim ("" if none).
func (t *Tokenizer) ChatTemplate() string { return t.chatTemplate }

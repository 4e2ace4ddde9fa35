package tokenizer

import (
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/baton-serving/baton/engine/gguf"
	"github.com/baton-serving/baton/engine/refdata"
)

// piece is a golden piece: a JSON string, or an array of byte values for a
// piece that is not valid UTF-8 on its own.
type piece string

func (p *piece) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err == nil {
		*p = piece(s)
		return nil
	}
	var bytes []byte
	var ints []int
	if err := json.Unmarshal(b, &ints); err != nil {
		return fmt.Errorf("piece %s is neither a string nor a byte array: %w", b, err)
	}
	for _, v := range ints {
		if v < 0 || v > 255 {
			return fmt.Errorf("piece %s has a byte out of range", b)
		}
		bytes = append(bytes, byte(v))
	}
	*p = piece(bytes)
	return nil
}

type goldenFile struct {
	Schema       map[string]string `json:"schema"`
	Tokenization []struct {
		Text              string  `json:"text"`
		IDsWithBOS        []int32 `json:"ids_with_bos"`
		IDsNoBOS          []int32 `json:"ids_no_bos"`
		IDsNoParseSpecial []int32 `json:"ids_with_bos_no_parse_special"`
		Pieces            []piece `json:"pieces"`
		DetokenizedNoBOS  string  `json:"detokenized_no_bos"`
		Llama2cRunCIDs    []int32 `json:"llama2c_run_c_ids"`
	} `json:"tokenization"`
	Generations []struct {
		Prompt        string  `json:"prompt"`
		PromptIDs     []int32 `json:"prompt_ids"`
		PromptPieces  []piece `json:"prompt_pieces"`
		GeneratedIDs  []int32 `json:"generated_ids"`
		GeneratedText string  `json:"generated_text"`
	} `json:"generations"`
}

func loadGolden(t testing.TB) (*Tokenizer, *goldenFile) {
	t.Helper()
	f, err := gguf.Open(refdata.Model(t))
	if err != nil {
		refdata.Missing(t, "%v", err)
	}
	defer f.Close()
	tok, err := FromGGUF(f)
	if err != nil {
		t.Fatalf("FromGGUF: %v", err)
	}
	raw, err := os.ReadFile(refdata.Golden(t))
	if err != nil {
		refdata.Missing(t, "%v", err)
	}
	var g goldenFile
	if err := json.Unmarshal(raw, &g); err != nil {
		t.Fatalf("golden JSON: %v", err)
	}
	for _, k := range []string{"tokenization[]", "generations[].generated_text", "generations[].prompt_ids"} {
		if g.Schema[k] == "" {
			t.Fatalf("golden schema lacks %q: the file's layout changed", k)
		}
	}
	if len(g.Tokenization) == 0 || len(g.Generations) == 0 {
		t.Fatal("golden file has no tokenization or generation cases")
	}
	return tok, &g
}

func TestGoldenVocab(t *testing.T) {
	tok, _ := loadGolden(t)
	if got := tok.VocabSize(); got != 512 {
		t.Errorf("VocabSize = %d, want 512", got)
	}
	if tok.BOS() != 1 || tok.EOS() != 2 || tok.UNK() != 0 || tok.PAD() != NoToken {
		t.Errorf("BOS/EOS/UNK/PAD = %d/%d/%d/%d, want 1/2/0/none", tok.BOS(), tok.EOS(), tok.UNK(), tok.PAD())
	}
	if !tok.AddBOS() || tok.AddEOS() {
		t.Errorf("AddBOS/AddEOS = %v/%v, want true/false", tok.AddBOS(), tok.AddEOS())
	}
	if got := tok.EOGs(); !slices.Equal(got, []int32{2}) {
		t.Errorf("EOGs = %v, want [2] (llama.cpp does not stop on BOS)", got)
	}
	for _, c := range []struct {
		id      int32
		typ     TokenType
		special bool
		piece   string
	}{
		{0, TypeUnknown, true, "<unk>"},
		{1, TypeControl, true, "<s>"},
		{2, TypeControl, true, "</s>"},
		{13, TypeByte, false, "\n"},
		{3 + 0xE6, TypeByte, false, "\xE6"},
		{403, TypeNormal, false, " Once"},
		{-1, TypeUndefined, false, ""},
		{512, TypeUndefined, false, ""},
	} {
		if got := tok.Type(c.id); got != c.typ {
			t.Errorf("Type(%d) = %v, want %v", c.id, got, c.typ)
		}
		if got := tok.Special(c.id); got != c.special {
			t.Errorf("Special(%d) = %v, want %v", c.id, got, c.special)
		}
		if got := tok.Piece(c.id); got != c.piece {
			t.Errorf("Piece(%d) = %q, want %q", c.id, got, c.piece)
		}
	}
}

func TestGoldenTokenization(t *testing.T) {
	tok, g := loadGolden(t)
	for _, c := range g.Tokenization {
		t.Run(c.Text, func(t *testing.T) {
			withBOS := tok.Encode(c.Text, EncodeOptions{AddSpecial: true, ParseSpecial: true})
			if !slices.Equal(withBOS, c.IDsWithBOS) {
				t.Errorf("ids with BOS = %v, want %v", withBOS, c.IDsWithBOS)
			}
			noBOS := tok.Encode(c.Text, EncodeOptions{ParseSpecial: true})
			if !slices.Equal(noBOS, c.IDsNoBOS) {
				t.Errorf("ids without BOS = %v, want %v", noBOS, c.IDsNoBOS)
			}
			// Where the golden file has no separate no-parse-special ids
			// they equal the parse-special ones, and run.c (which knows
			// no special tokens) agrees with them.
			wantNoParse := c.IDsNoParseSpecial
			if wantNoParse == nil {
				wantNoParse = c.IDsWithBOS
			}
			noParse := tok.Encode(c.Text, EncodeOptions{AddSpecial: true})
			if !slices.Equal(noParse, wantNoParse) {
				t.Errorf("ids with BOS, no parse-special = %v, want %v", noParse, wantNoParse)
			}
			if !slices.Equal(noParse, c.Llama2cRunCIDs) {
				t.Errorf("ids without parse-special = %v, llama2.c run.c gives %v", noParse, c.Llama2cRunCIDs)
			}

			if len(c.Pieces) != len(c.IDsWithBOS) {
				t.Fatalf("golden case has %d pieces for %d ids", len(c.Pieces), len(c.IDsWithBOS))
			}
			var joined strings.Builder
			for i, id := range c.IDsWithBOS {
				if got := tok.Piece(id); got != string(c.Pieces[i]) {
					t.Errorf("Piece(%d) = %q, want %q", id, got, c.Pieces[i])
				}
				if i > 0 {
					joined.WriteString(tok.Piece(id))
				}
			}

			// llama-server's /detokenize joins the pieces with special
			// tokens shown and keeps the leading space ...
			if got := joined.String(); got != c.DetokenizedNoBOS {
				t.Errorf("joined pieces of ids without BOS = %q, want %q", got, c.DetokenizedNoBOS)
			}
			// ... which is llama_detokenize(unparse_special) except for the
			// space prefix that llama_detokenize strips from the first piece.
			want := c.DetokenizedNoBOS
			if len(c.IDsNoBOS) > 0 && strings.HasPrefix(tok.Piece(c.IDsNoBOS[0]), " ") {
				want = want[1:]
			}
			if got := tok.DecodeWith(c.IDsNoBOS, DecodeOptions{UnparseSpecial: true}); got != want {
				t.Errorf("DecodeWith(ids without BOS, unparse special) = %q, want %q", got, want)
			}
			// With BOS first nothing is stripped: BOS renders as nothing and
			// uses up the first-token rule, as in llama.cpp.
			wantPlain := strings.ReplaceAll(c.DetokenizedNoBOS, "<s>", "")
			if got := tok.Decode(c.IDsWithBOS); got != wantPlain {
				t.Errorf("Decode(ids with BOS) = %q, want %q", got, wantPlain)
			}
			if got := tok.DecodeWith(c.IDsWithBOS, DecodeOptions{RemoveSpecial: true, UnparseSpecial: true}); got != c.DetokenizedNoBOS {
				t.Errorf("DecodeWith(ids with BOS, remove special) = %q, want %q", got, c.DetokenizedNoBOS)
			}
		})
	}
}

func TestGoldenGenerations(t *testing.T) {
	tok, g := loadGolden(t)
	for _, c := range g.Generations {
		t.Run(c.Prompt, func(t *testing.T) {
			ids := tok.Encode(c.Prompt, EncodeOptions{AddSpecial: true, ParseSpecial: true})
			if !slices.Equal(ids, c.PromptIDs) {
				t.Errorf("prompt ids = %v, want %v", ids, c.PromptIDs)
			}
			for i, id := range c.PromptIDs {
				if i < len(c.PromptPieces) && tok.Piece(id) != string(c.PromptPieces[i]) {
					t.Errorf("Piece(%d) = %q, want %q", id, tok.Piece(id), c.PromptPieces[i])
				}
			}

			d := tok.NewStreamDecoder()
			var streamed strings.Builder
			for _, id := range c.GeneratedIDs {
				streamed.WriteString(d.Next(id))
			}
			streamed.WriteString(d.Flush())
			if got := streamed.String(); got != c.GeneratedText {
				t.Errorf("streamed text = %q, want %q", got, c.GeneratedText)
			}

			// Decode treats the ids as a whole text and so drops the first
			// piece's space, which generated text keeps.
			if got, want := tok.Decode(c.GeneratedIDs), strings.TrimPrefix(c.GeneratedText, " "); got != want {
				t.Errorf("Decode(generated ids) = %q, want %q", got, want)
			}
			// The prompt followed by its continuation decodes to the prompt
			// and the generated text. BOS comes first and renders as
			// nothing, so (as in llama.cpp) the prompt's space prefix stays.
			all := append(slices.Clone(c.PromptIDs), c.GeneratedIDs...)
			want := c.GeneratedText
			if c.Prompt != "" {
				want = " " + c.Prompt + c.GeneratedText
			}
			if got := tok.Decode(all); got != want {
				t.Errorf("Decode(prompt + generated ids) = %q, want %q", got, want)
			}
		})
	}
}

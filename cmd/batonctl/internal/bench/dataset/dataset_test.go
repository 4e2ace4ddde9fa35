package dataset

import (
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/baton-serving/baton/engine/gguf"
	"github.com/baton-serving/baton/engine/refdata"
	"github.com/baton-serving/baton/engine/tokenizer"
)

// fakeVocab has 10 tokens: 0 unknown, 1 BOS, 2 EOS, 3-4 bytes, 5-9 normal.
// Encode makes one token per word.
type fakeVocab struct{ noBOS bool }

func (fakeVocab) VocabSize() int { return 10 }
func (fakeVocab) Type(id int32) tokenizer.TokenType {
	switch {
	case id == 0:
		return tokenizer.TypeUnknown
	case id <= 2:
		return tokenizer.TypeControl
	case id <= 4:
		return tokenizer.TypeByte
	}
	return tokenizer.TypeNormal
}
func (f fakeVocab) AddBOS() bool { return !f.noBOS }
func (fakeVocab) BOS() int32     { return 1 }
func (f fakeVocab) Encode(text string, o tokenizer.EncodeOptions) []int32 {
	var ids []int32
	if o.AddSpecial && f.AddBOS() {
		ids = append(ids, 1)
	}
	for _, w := range strings.Fields(text) {
		ids = append(ids, 5+int32(len(w)%5))
	}
	return ids
}

func checkNormal(t *testing.T, ids []int32, from int) {
	t.Helper()
	for _, id := range ids[from:] {
		if id < 5 || id > 9 {
			t.Fatalf("id %d in %v is not a normal token", id, ids)
		}
	}
}

func TestRandom(t *testing.T) {
	ps, err := Random(fakeVocab{}, RandomOptions{N: 50, InputLen: 7, OutputLen: 3, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int32]bool{}
	for _, p := range ps {
		if len(p.IDs) != 7 || p.OutputLen != 3 || p.IDs[0] != 1 {
			t.Fatalf("prompt %v output %d: want 7 ids starting with BOS and 3 outputs", p.IDs, p.OutputLen)
		}
		checkNormal(t, p.IDs, 1)
		for _, id := range p.IDs[1:] {
			seen[id] = true
		}
	}
	if len(seen) != 5 {
		t.Errorf("drew %d distinct normal tokens of 5 in 300 draws", len(seen))
	}
	again, _ := Random(fakeVocab{}, RandomOptions{N: 50, InputLen: 7, OutputLen: 3, Seed: 1})
	if !reflect.DeepEqual(ps, again) {
		t.Error("the same seed gave different prompts")
	}
	other, _ := Random(fakeVocab{}, RandomOptions{N: 50, InputLen: 7, OutputLen: 3, Seed: 2})
	if reflect.DeepEqual(ps, other) {
		t.Error("different seeds gave the same prompts")
	}
	noBOS, _ := Random(fakeVocab{noBOS: true}, RandomOptions{N: 5, InputLen: 4, OutputLen: 1})
	for _, p := range noBOS {
		checkNormal(t, p.IDs, 0)
	}
}

func TestRandomRange(t *testing.T) {
	ps, err := Random(fakeVocab{}, RandomOptions{N: 400, InputLen: 10, OutputLen: 20, RangeRatio: 0.5, Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	in, out := map[int]bool{}, map[int]bool{}
	for _, p := range ps {
		in[len(p.IDs)], out[p.OutputLen] = true, true
		if len(p.IDs) < 5 || len(p.IDs) > 15 || p.OutputLen < 10 || p.OutputLen > 30 {
			t.Fatalf("lengths %d/%d outside [5,15]/[10,30]", len(p.IDs), p.OutputLen)
		}
	}
	if !in[5] || !in[15] || !out[10] || !out[30] {
		t.Errorf("range ends never drawn: inputs %v outputs %v", in, out)
	}
}

func TestLengthRange(t *testing.T) {
	for _, tc := range []struct {
		mean   int
		r      float64
		lo, hi int
	}{
		{128, 0, 128, 128}, {10, 0.5, 5, 15}, {1, 0.9, 1, 1}, {3, 0.5, 1, 4},
	} {
		if lo, hi := LengthRange(tc.mean, tc.r); lo != tc.lo || hi != tc.hi {
			t.Errorf("LengthRange(%d, %v) = %d, %d; want %d, %d", tc.mean, tc.r, lo, hi, tc.lo, tc.hi)
		}
	}
}

func TestBadOptions(t *testing.T) {
	for name, f := range map[string]func() error{
		"input 0": func() error {
			_, err := Random(fakeVocab{}, RandomOptions{N: 1, InputLen: 0, OutputLen: 1})
			return err
		},
		"output 0": func() error {
			_, err := Random(fakeVocab{}, RandomOptions{N: 1, InputLen: 1, OutputLen: 0})
			return err
		},
		"ratio 1": func() error {
			_, err := Random(fakeVocab{}, RandomOptions{N: 1, InputLen: 1, OutputLen: 1, RangeRatio: 1})
			return err
		},
		"groups 0": func() error {
			_, err := SharedPrefix(fakeVocab{}, SharedPrefixOptions{N: 1, PrefixLen: 1, SuffixLen: 1, OutputLen: 1})
			return err
		},
		"prefix 0": func() error {
			_, err := SharedPrefix(fakeVocab{}, SharedPrefixOptions{N: 1, Groups: 1, SuffixLen: 1, OutputLen: 1})
			return err
		},
		"no normals": func() error {
			_, err := Random(onlySpecial{}, RandomOptions{N: 1, InputLen: 1, OutputLen: 1})
			return err
		},
	} {
		if f() == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

type onlySpecial struct{ fakeVocab }

func (onlySpecial) Type(int32) tokenizer.TokenType { return tokenizer.TypeControl }

func TestSharedPrefix(t *testing.T) {
	ps, err := SharedPrefix(fakeVocab{}, SharedPrefixOptions{N: 12, Groups: 3, PrefixLen: 20, SuffixLen: 4, OutputLen: 2, Seed: 4})
	if err != nil {
		t.Fatal(err)
	}
	groups := map[string]int{}
	for _, p := range ps {
		if len(p.IDs) != 24 || p.OutputLen != 2 || p.IDs[0] != 1 {
			t.Fatalf("prompt %v: want 24 ids starting with BOS", p.IDs)
		}
		checkNormal(t, p.IDs, 1)
		groups[string(fmtIDs(p.IDs[:20]))]++
	}
	if len(groups) != 3 {
		t.Fatalf("%d distinct prefixes, want 3", len(groups))
	}
	for _, n := range groups {
		if n != 4 {
			t.Errorf("group sizes %v, want 4 each", groups)
		}
	}
	// Unshuffled, prompt i and i+3 would always share their prefix.
	periodic := true
	for i := 0; i+3 < len(ps); i++ {
		periodic = periodic && fmtIDs(ps[i].IDs[:20]) == fmtIDs(ps[i+3].IDs[:20])
	}
	if periodic {
		t.Error("prompts are in group order, not shuffled")
	}
}

func fmtIDs(ids []int32) string {
	var b strings.Builder
	for _, id := range ids {
		b.WriteByte(byte('0' + id))
	}
	return b.String()
}

func writeFile(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "sg.json")
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

const shareGPT = `[
 {"id": "a", "conversations": [{"from": "human", "value": "one two three four five"}, {"from": "gpt", "value": "a b c d e f"}]},
 {"id": "b", "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello there how are you"}]},
 {"id": "c", "conversations": [{"from": "gpt", "value": "starts with the model"}, {"from": "human", "value": "x y z w"}]},
 {"id": "d", "conversations": [{"from": "human", "value": "only one turn here"}]},
 {"id": "e", "messages": [{"role": "user", "content": "w w w w w w w w"}, {"role": "assistant", "content": "v v v v v"}]}
]`

func TestShareGPT(t *testing.T) {
	path := writeFile(t, shareGPT)
	ps, err := ShareGPT(fakeVocab{}, path, ShareGPTOptions{N: 2, Seed: 5})
	if err != nil {
		t.Fatal(err)
	}
	// Usable: "a" (5 words + BOS, 6 answer tokens) and "e" (8 + BOS, 5).
	var got [][2]int
	for _, p := range ps {
		got = append(got, [2]int{len(p.IDs), p.OutputLen})
	}
	slices.SortFunc(got, func(a, b [2]int) int { return a[0] - b[0] })
	if want := [][2]int{{6, 6}, {9, 5}}; !reflect.DeepEqual(got, want) {
		t.Errorf("prompt/output lengths %v, want %v", got, want)
	}
	fixed, err := ShareGPT(fakeVocab{}, path, ShareGPTOptions{N: 2, OutputLen: 64})
	if err != nil || fixed[0].OutputLen != 64 || fixed[1].OutputLen != 64 {
		t.Errorf("fixed output length: %v, %v", fixed, err)
	}
	if _, err := ShareGPT(fakeVocab{}, path, ShareGPTOptions{N: 3}); err == nil || !strings.Contains(err.Error(), "only 2 of 3") {
		t.Errorf("too few usable conversations: error %v", err)
	}
	if _, err := ShareGPT(fakeVocab{}, path, ShareGPTOptions{N: 1, ContextLen: 12}); err != nil {
		t.Errorf("context 12 fits conversation a: %v", err)
	}
	if _, err := ShareGPT(fakeVocab{}, path, ShareGPTOptions{N: 1, ContextLen: 11}); err == nil {
		t.Error("context 11 fits no conversation, yet no error")
	}
}

func TestShareGPTBadFiles(t *testing.T) {
	for name, body := range map[string]string{
		"not JSON":      "hello",
		"object":        `{"conversations": []}`,
		"bad element":   `[{"conversations": 5}]`,
		"unterminated":  `[{"conversations": []}`,
		"missing comma": `[{"conversations": []} {"conversations": []}]`,
	} {
		if _, err := ShareGPT(fakeVocab{}, writeFile(t, body), ShareGPTOptions{N: 1}); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	if _, err := ShareGPT(fakeVocab{}, filepath.Join(t.TempDir(), "absent.json"), ShareGPTOptions{N: 1}); err == nil {
		t.Error("missing file: no error")
	}
}

func TestFit(t *testing.T) {
	ps := []Prompt{{IDs: make([]int32, 10), OutputLen: 6}, {IDs: make([]int32, 20), OutputLen: 8}}
	if err := Fit(ps, 28); err != nil {
		t.Errorf("Fit 28: %v", err)
	}
	if err := Fit(ps, 27); err == nil || !strings.Contains(err.Error(), "prompt 1") {
		t.Errorf("Fit 27: %v, want an error naming prompt 1", err)
	}
	if err := Fit(ps, 0); err != nil {
		t.Errorf("Fit without a window: %v", err)
	}
}

func TestRandomRealVocabulary(t *testing.T) {
	f, err := gguf.Open(refdata.Model(t))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tok, err := tokenizer.FromGGUF(f)
	if err != nil {
		t.Fatal(err)
	}
	ps, err := Random(tok, RandomOptions{N: 20, InputLen: 16, OutputLen: 8, Seed: 9})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ps {
		if len(p.IDs) != 16 || p.IDs[0] != tok.BOS() {
			t.Fatalf("prompt %v: want 16 ids, BOS first", p.IDs)
		}
		for _, id := range p.IDs[1:] {
			// stories260K: ids 0-2 special, 3-258 bytes, 259-511 normal.
			if id < 259 || id > 511 || tok.Type(id) != tokenizer.TypeNormal {
				t.Fatalf("id %d (%v) drawn", id, tok.Type(id))
			}
		}
	}
}

// TestMultiTurn: turn t of conversation c is request t·C+c; its prompt
// starts with the previous turn's prompt followed by an answer of that
// turn's output length, then a new user message; it waits for that turn.
func TestMultiTurn(t *testing.T) {
	o := MultiTurnOptions{Conversations: 3, Turns: 4, SystemLen: 20, UserLen: 6, OutputLen: 5, RangeRatio: 0.5, Seed: 9}
	ps, err := MultiTurn(fakeVocab{}, o)
	if err != nil {
		t.Fatal(err)
	}
	if len(ps) != 12 {
		t.Fatalf("%d prompts, want 12", len(ps))
	}
	after := Dependencies(ps)
	for i, p := range ps {
		c, turn := i%3, i/3
		if p.Conversation != c || p.Turn != turn {
			t.Fatalf("prompt %d is conversation %d turn %d, want %d, %d", i, p.Conversation, p.Turn, c, turn)
		}
		if p.IDs[0] != 1 {
			t.Errorf("prompt %d does not start with BOS", i)
		}
		checkNormal(t, p.IDs, 1)
		if turn == 0 {
			if after[i] != -1 || len(p.IDs) < 20+3 || len(p.IDs) > 20+9 {
				t.Errorf("first turn %d: after %d, %d tokens", i, after[i], len(p.IDs))
			}
			continue
		}
		prev := ps[i-3]
		if after[i] != i-3 {
			t.Errorf("turn %d waits for %d, want %d", i, after[i], i-3)
		}
		if !slices.Equal(p.IDs[:len(prev.IDs)], prev.IDs) {
			t.Errorf("prompt %d does not start with its previous turn's", i)
		}
		if added := len(p.IDs) - len(prev.IDs) - prev.OutputLen; added < 3 || added > 9 {
			t.Errorf("prompt %d adds a %d-token message after the answer", i, added)
		}
	}
	if slices.Equal(ps[0].IDs[:20], ps[1].IDs[:20]) {
		t.Error("two conversations share a system prompt")
	}
	again, _ := MultiTurn(fakeVocab{}, o)
	if !slices.EqualFunc(ps, again, func(a, b Prompt) bool { return slices.Equal(a.IDs, b.IDs) && a.OutputLen == b.OutputLen }) {
		t.Error("the same seed made other conversations")
	}
	if Dependencies([]Prompt{{IDs: []int32{1}}}) != nil {
		t.Error("a single-turn data set has dependencies")
	}
	for _, bad := range []MultiTurnOptions{
		{Conversations: 0, Turns: 1, SystemLen: 1, UserLen: 1, OutputLen: 1},
		{Conversations: 1, Turns: 0, SystemLen: 1, UserLen: 1, OutputLen: 1},
		{Conversations: 1, Turns: 1, SystemLen: 0, UserLen: 1, OutputLen: 1},
		{Conversations: 1, Turns: 1, SystemLen: 1, UserLen: 0, OutputLen: 1},
	} {
		if _, err := MultiTurn(fakeVocab{}, bad); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}

package openai

// Rendering tests for logprobs and echo with events built by hand from the
// real stories260K tokenizer: tokens that are parts of a UTF-8 character,
// two ids with one text, and the prompt's logprobs that only the workers'
// echo support produces (the end-to-end proof is the router tests and
// tests/sdk once they do).

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/baton-serving/baton/engine/tokenizer"
	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
)

func tokID(t *testing.T, tok *tokenizer.Tokenizer, text string) uint32 {
	t.Helper()
	id, ok := tok.TokenID(text)
	if !ok {
		t.Fatalf("stories260K has no token %q", text)
	}
	return uint32(id)
}

// renderJSON marshals v and decodes it generically, as a client sees it.
func renderJSON(t *testing.T, v any) map[string]any {
	t.Helper()
	b, err := marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	return m
}

// partialEvents are the events of a generation of "東" spelled by three
// byte tokens, then " a": texts as the streaming decoder releases them.
func partialEvents(t *testing.T, tok *tokenizer.Tokenizer) []*batonv1.GenerateEvent {
	ids := []uint32{tokID(t, tok, "<0xE6>"), tokID(t, tok, "<0x9D>"), tokID(t, tok, "<0xB1>"), tokID(t, tok, "▁a")}
	dup := tokID(t, tok, "<0x61>") // shows as "a", like the normal token "a"
	dec := tok.NewStreamDecoder()
	var evs []*batonv1.GenerateEvent
	for i, id := range ids {
		lp := &batonv1.TokenLogprob{TokenId: id, Logprob: -float32(i + 1), TopLogprobs: []*batonv1.TopLogprob{
			{TokenId: id, Logprob: -float32(i + 1)}, {TokenId: tokID(t, tok, "a"), Logprob: -5}, {TokenId: dup, Logprob: -6}}}
		evs = append(evs, &batonv1.GenerateEvent{TokenIds: []uint32{id}, Text: dec.Next(int32(id)), Logprobs: []*batonv1.TokenLogprob{lp}})
	}
	evs = append(evs, &batonv1.GenerateEvent{FinishReason: batonv1.FinishReason_FINISH_REASON_LENGTH,
		Usage: &batonv1.Usage{PromptTokens: 2, CompletionTokens: 4}})
	return evs
}

func TestChatLogprobsPartialUTF8(t *testing.T) {
	tok := storiesTokenizer(t)
	h := &Handler{model: Model{ID: "m", Tokenizer: tok}}
	j := &job{req: &batonv1.GenerateRequest{RequestId: "r"}}
	f := &chatFormat{h: h, j: j, logprobs: true}
	o := &output{}
	for _, ev := range partialEvents(t, tok) {
		o.add(ev)
	}
	m := renderJSON(t, f.whole(o))
	c := m["choices"].([]any)[0].(map[string]any)
	content := c["message"].(map[string]any)["content"].(string)
	var joined []byte
	var names []string
	for _, e := range c["logprobs"].(map[string]any)["content"].([]any) {
		e := e.(map[string]any)
		names = append(names, e["token"].(string))
		for _, b := range e["bytes"].([]any) {
			joined = append(joined, byte(b.(float64)))
		}
		if top := e["top_logprobs"].([]any); len(top) != 3 || top[1].(map[string]any)["token"] != "a" || top[2].(map[string]any)["token"] != "a" {
			t.Errorf("top_logprobs %v: want 3 entries, two of them \"a\"", top)
		}
	}
	if want := []string{`\xe6`, `\x9d`, `\xb1`, " a"}; !reflect.DeepEqual(names, want) {
		t.Errorf("tokens %q, want %q", names, want)
	}
	if content != "東 a" || string(joined) != content {
		t.Errorf("content %q, bytes join to %q", content, joined)
	}
}

func TestCompletionLogprobsPartialUTF8(t *testing.T) {
	tok := storiesTokenizer(t)
	h := &Handler{model: Model{ID: "m", Tokenizer: tok}}
	prompt := tok.Encode("Hi 東", tokenizer.EncodeOptions{AddSpecial: true})
	j := &job{req: &batonv1.GenerateRequest{RequestId: "r", PromptTokenIds: wireIDs(prompt)}}
	for _, stream := range []bool{false, true} {
		f := &completionFormat{h: h, j: j, logprobs: true}
		var text strings.Builder
		lp := newCompletionLogprobs()
		if !stream {
			o := &output{}
			for _, ev := range partialEvents(t, tok) {
				o.add(ev)
			}
			c := f.whole(o).(*completionObject).Choices[0]
			text.WriteString(c.Text)
			lp = c.Logprobs
		} else {
			for _, ev := range partialEvents(t, tok) {
				for _, ch := range f.chunks(ev) {
					c := ch.(*completionObject).Choices[0]
					text.WriteString(c.Text)
					lp.join(c.Logprobs)
				}
			}
		}
		if text.String() != "東 a" {
			t.Errorf("stream %v: text %q", stream, text.String())
		}
		if want := []string{`bytes:\xe6`, `bytes:\x9d`, `bytes:\xb1`, " a"}; !reflect.DeepEqual(lp.Tokens, want) {
			t.Errorf("stream %v: tokens %q, want %q", stream, lp.Tokens, want)
		}
		// "Hi 東" is 4 characters: the bytes of 東 start at 4, the next
		// character at 5.
		if want := []int{4, 4, 4, 5}; !reflect.DeepEqual(lp.TextOffset, want) {
			t.Errorf("stream %v: text_offset %v, want %v", stream, lp.TextOffset, want)
		}
		for i, top := range lp.TopLogprobs {
			// The chosen token, and "a" once: the byte token <0x61> shows
			// as "a" too, and the map keeps the more likely (-5).
			if len(top) != 2 || top["a"] != -5 || top[lp.Tokens[i]] != *lp.TokenLogprobs[i] {
				t.Errorf("stream %v: top_logprobs[%d] = %v", stream, i, top)
			}
		}
	}
}

func wireIDs(ids []int32) []uint32 {
	out := make([]uint32, len(ids))
	for i, id := range ids {
		out[i] = uint32(id)
	}
	return out
}

// echoEvents are a worker's events for prompt with echo: the first with the
// prompt's ids and logprobs (one per token after the first), then one
// generated token, then the end.
func echoEvents(t *testing.T, tok *tokenizer.Tokenizer, prompt []int32) []*batonv1.GenerateEvent {
	first := &batonv1.GenerateEvent{PromptTokenIds: wireIDs(prompt)}
	for i, id := range prompt[1:] {
		first.PromptLogprobs = append(first.PromptLogprobs, &batonv1.TokenLogprob{TokenId: uint32(id), Logprob: -float32(i + 1),
			TopLogprobs: []*batonv1.TopLogprob{{TokenId: uint32(id), Logprob: -float32(i + 1)}}})
	}
	gen := tokID(t, tok, "▁time")
	return []*batonv1.GenerateEvent{first,
		{TokenIds: []uint32{gen}, Text: " time", Logprobs: []*batonv1.TokenLogprob{{TokenId: gen, Logprob: -0.5,
			TopLogprobs: []*batonv1.TopLogprob{{TokenId: gen, Logprob: -0.5}}}}},
		{FinishReason: batonv1.FinishReason_FINISH_REASON_STOP, Usage: &batonv1.Usage{PromptTokens: uint32(len(prompt)), CompletionTokens: 1}}}
}

func TestEchoRendering(t *testing.T) {
	tok := storiesTokenizer(t)
	h := &Handler{model: Model{ID: "m", Tokenizer: tok}}
	const promptText = "Once upon a"
	prompt := tok.Encode(promptText, tokenizer.EncodeOptions{AddSpecial: true})
	if tok.Piece(prompt[0]) != "<s>" || len(prompt) < 3 {
		t.Fatalf("prompt %v does not start with BOS", prompt)
	}
	for _, promptOnly := range []bool{false, true} {
		for _, stream := range []bool{false, true} {
			j := &job{req: &batonv1.GenerateRequest{RequestId: "r", PromptTokenIds: wireIDs(prompt)}, echo: true, promptOnly: promptOnly}
			f := &completionFormat{h: h, j: j, logprobs: true}
			var text strings.Builder
			var finish *string
			var chunks int
			lp := newCompletionLogprobs()
			var usage *usageObject
			if !stream {
				o := &output{}
				for _, ev := range echoEvents(t, tok, prompt) {
					o.add(ev)
				}
				obj := f.whole(o).(*completionObject)
				c := obj.Choices[0]
				text.WriteString(c.Text)
				lp, finish, usage = c.Logprobs, c.FinishReason, obj.Usage.(*usageObject)
			} else {
				for i, ev := range echoEvents(t, tok, prompt) {
					for _, ch := range f.chunks(ev) {
						c := ch.(*completionObject).Choices[0]
						if chunks == 0 && (i != 0 || !strings.HasPrefix(c.Text, promptText)) {
							t.Errorf("promptOnly %v: first chunk (event %d) %q, want the prompt", promptOnly, i, c.Text)
						}
						chunks++
						text.WriteString(c.Text)
						lp.join(c.Logprobs)
						if c.FinishReason != nil {
							finish = c.FinishReason
						}
					}
				}
				usage = f.usage(&usageObject{PromptTokens: len(prompt), CompletionTokens: 1, TotalTokens: len(prompt) + 1}).(*completionObject).Usage.(*usageObject)
			}
			want, wantTokens, wantFinish, wantCompletion := promptText+" time", len(prompt)+1, "stop", 1
			if promptOnly {
				want, wantTokens, wantFinish, wantCompletion = promptText, len(prompt), "length", 0
			}
			what := map[bool]string{false: "whole", true: "stream"}[stream]
			if promptOnly {
				what += " promptOnly"
			}
			if text.String() != want || finish == nil || *finish != wantFinish {
				t.Errorf("%s: text %q finish %v, want %q %s", what, text.String(), finish, want, wantFinish)
			}
			if usage.CompletionTokens != wantCompletion || usage.TotalTokens != len(prompt)+wantCompletion {
				t.Errorf("%s: usage %+v", what, usage)
			}
			if len(lp.Tokens) != wantTokens || len(lp.TokenLogprobs) != wantTokens || len(lp.TopLogprobs) != wantTokens || len(lp.TextOffset) != wantTokens {
				t.Fatalf("%s: %d tokens, want %d: %+v", what, len(lp.Tokens), wantTokens, lp)
			}
			// BOS: shown by its name, no logprob, no text.
			if lp.Tokens[0] != "<s>" || lp.TokenLogprobs[0] != nil || lp.TopLogprobs[0] != nil || lp.TextOffset[0] != 0 {
				t.Errorf("%s: first token %q %v %v at %d", what, lp.Tokens[0], lp.TokenLogprobs[0], lp.TopLogprobs[0], lp.TextOffset[0])
			}
			joined := ""
			for i := 1; i < wantTokens; i++ {
				if lp.TextOffset[i] != len(joined) {
					t.Errorf("%s: text_offset[%d] = %d, want %d", what, i, lp.TextOffset[i], len(joined))
				}
				joined += lp.Tokens[i]
				if i < len(prompt) && (lp.TokenLogprobs[i] == nil || *lp.TokenLogprobs[i] != -float64(i)) {
					t.Errorf("%s: prompt token %d logprob %v, want %d", what, i, lp.TokenLogprobs[i], -i)
				}
			}
			if joined != want {
				t.Errorf("%s: tokens join to %q, text %q", what, joined, want)
			}
		}
	}
}

// The native API's text: U+FFFD for a partial character (bytes exact), a
// control token by name with no bytes, the prompt's logprobs too.
func TestFillTokenText(t *testing.T) {
	tok := storiesTokenizer(t)
	e6, a, eos := tokID(t, tok, "<0xE6>"), tokID(t, tok, "▁a"), uint32(tok.EOS())
	ev := &batonv1.GenerateEvent{
		Logprobs:       []*batonv1.TokenLogprob{{TokenId: e6, TopLogprobs: []*batonv1.TopLogprob{{TokenId: e6}, {TokenId: eos}, {TokenId: 1 << 31}}}},
		PromptLogprobs: []*batonv1.TokenLogprob{{TokenId: a}},
	}
	FillTokenText(tok, ev)
	lp := ev.Logprobs[0]
	if lp.Token != "\uFFFD" || string(lp.Bytes) != "\xe6" {
		t.Errorf("<0xE6>: %q %q", lp.Token, lp.Bytes)
	}
	if top := lp.TopLogprobs[1]; top.Token != "</s>" || top.Bytes != nil {
		t.Errorf("EOS: %q %q", top.Token, top.Bytes)
	}
	if top := lp.TopLogprobs[2]; top.Token != "" || top.Bytes != nil {
		t.Errorf("out of range: %q %q", top.Token, top.Bytes)
	}
	if p := ev.PromptLogprobs[0]; p.Token != " a" || string(p.Bytes) != " a" {
		t.Errorf("prompt ▁a: %q %q", p.Token, p.Bytes)
	}
}

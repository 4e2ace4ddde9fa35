package dataset

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/baton-serving/baton/engine/tokenizer"
)

// ShareGPTOptions configure ShareGPT.
type ShareGPTOptions struct {
	N int
	// OutputLen, when positive, replaces every conversation's answer length.
	OutputLen int
	// ContextLen drops conversations whose prompt and answer do not fit
	// (0: no limit).
	ContextLen int
	Seed       uint64
}

// turn is one message of a ShareGPT conversation; files spell it either
// {"from","value"} or {"role","content"}.
type turn struct {
	From    string `json:"from"`
	Value   string `json:"value"`
	Role    string `json:"role"`
	Content string `json:"content"`
}

func (t turn) speaker() string {
	if t.From != "" {
		return t.From
	}
	return t.Role
}

func (t turn) text() string {
	if t.Value != "" {
		return t.Value
	}
	return t.Content
}

type conversation struct {
	Conversations []turn `json:"conversations"`
	Conversation  []turn `json:"conversation"`
	Messages      []turn `json:"messages"`
}

// exchange is a conversation's opening question and its answer.
type exchange struct{ prompt, answer string }

// minLen is the shortest prompt or answer kept, as vLLM's benchmark filters
// ShareGPT: shorter ones are mostly greetings that say nothing about load.
const minLen = 4

// ShareGPT makes N prompts from the ShareGPT-format JSON file at path: an
// array of conversations whose first two turns are a user's question (the
// prompt) and the assistant's answer (its length, in tokens, is the
// request's output length). Conversations are shuffled with the seed, and
// those with a prompt or answer under 4 tokens, or not fitting the context
// window, are skipped.
func ShareGPT(v Vocab, path string, o ShareGPTOptions) ([]Prompt, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("sharegpt: %w", err)
	}
	defer f.Close()
	exs, err := readShareGPT(f)
	if err != nil {
		return nil, fmt.Errorf("sharegpt %s: %w", path, err)
	}
	rng := newRand(o.Seed, 3)
	rng.Shuffle(len(exs), func(i, j int) { exs[i], exs[j] = exs[j], exs[i] })
	ps := make([]Prompt, 0, o.N)
	for _, ex := range exs {
		if len(ps) == o.N {
			break
		}
		ids := v.Encode(ex.prompt, tokenizer.EncodeOptions{AddSpecial: true})
		out := o.OutputLen
		if out <= 0 {
			out = len(v.Encode(ex.answer, tokenizer.EncodeOptions{}))
		}
		if len(ids) < minLen || out < minLen || (o.ContextLen > 0 && len(ids)+out > o.ContextLen) {
			continue
		}
		ps = append(ps, Prompt{IDs: ids, OutputLen: out})
	}
	if len(ps) < o.N {
		return nil, fmt.Errorf("sharegpt %s: only %d of %d conversations usable (%d read; at least %d tokens each way, fitting a context of %d): lower --num-prompts",
			path, len(ps), o.N, len(exs), minLen, o.ContextLen)
	}
	return ps, nil
}

// readShareGPT streams the array so that a large file is never held twice.
func readShareGPT(r io.Reader) ([]exchange, error) {
	dec := json.NewDecoder(r)
	tok, err := dec.Token()
	if err != nil {
		return nil, fmt.Errorf("not JSON: %w", err)
	}
	if d, ok := tok.(json.Delim); !ok || d != '[' {
		return nil, errors.New("want a JSON array of conversations")
	}
	var exs []exchange
	for i := 0; dec.More(); i++ {
		var c conversation
		if err := dec.Decode(&c); err != nil {
			return nil, fmt.Errorf("conversation %d: %w", i, err)
		}
		turns := c.Conversations
		if turns == nil {
			turns = c.Conversation
		}
		if turns == nil {
			turns = c.Messages
		}
		if len(turns) < 2 || !isUser(turns[0].speaker()) || isUser(turns[1].speaker()) {
			continue
		}
		exs = append(exs, exchange{turns[0].text(), turns[1].text()})
	}
	if _, err := dec.Token(); err != nil {
		return nil, fmt.Errorf("unterminated array: %w", err)
	}
	return exs, nil
}

func isUser(speaker string) bool { return speaker == "human" || speaker == "user" }

// Package dataset makes the prompts of a serving benchmark: random token
// sequences of chosen lengths, conversations from a ShareGPT file, groups
// of prompts sharing a long prefix, or multi-turn conversations replayed
// turn by turn. Prompts are token ids, so their lengths
// are exact whatever the tokenizer would make of decoded text.
package dataset

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"

	"github.com/baton-serving/baton/engine/tokenizer"
)

// Prompt is one request's input.
type Prompt struct {
	// IDs is the prompt, BOS first when the model adds one.
	IDs []int32
	// OutputLen is the number of tokens to generate.
	OutputLen int
	// Conversation and Turn place a multi-turn request (0 elsewhere); a
	// turn after the first waits for request After, its conversation's
	// previous turn, to end before it is sent.
	Conversation, Turn, After int
}

// Dependencies returns, for each prompt, the index of the request that must
// end before it is sent (-1 for none), or nil when none waits (every data
// set but multi-turn).
func Dependencies(ps []Prompt) []int {
	var after []int
	for i, p := range ps {
		if p.Turn == 0 {
			continue
		}
		if after == nil {
			after = make([]int, len(ps))
			for j := range after {
				after[j] = -1
			}
		}
		after[i] = p.After
	}
	return after
}

// Vocab is what the generators need from a tokenizer.
type Vocab interface {
	VocabSize() int
	Type(id int32) tokenizer.TokenType
	AddBOS() bool
	BOS() int32
	Encode(text string, opts tokenizer.EncodeOptions) []int32
}

// newRand is the generators' random source: the same seed gives the same
// prompts.
func newRand(seed uint64, stream uint64) *rand.Rand {
	return rand.New(rand.NewPCG(seed, stream))
}

// ordinary returns the ids of the vocabulary's normal tokens: those a text
// would tokenize to, leaving out control, byte-fallback, unknown and unused
// entries.
func ordinary(v Vocab) ([]int32, error) {
	var ids []int32
	for id := range int32(v.VocabSize()) {
		if v.Type(id) == tokenizer.TypeNormal {
			ids = append(ids, id)
		}
	}
	if len(ids) == 0 {
		return nil, errors.New("the vocabulary has no normal tokens to draw prompts from")
	}
	return ids, nil
}

// LengthRange is the inclusive range of lengths drawn around mean with
// ratio r in [0, 1): [⌊mean·(1−r)⌋, ⌊mean·(1+r)⌋], at least 1 (vLLM's
// convention for its random data set).
func LengthRange(mean int, r float64) (lo, hi int) {
	lo = max(int(math.Floor(float64(mean)*(1-r))), 1)
	hi = max(int(math.Floor(float64(mean)*(1+r))), lo)
	return lo, hi
}

func checkLengths(name string, mean int, r float64) error {
	if mean < 1 {
		return fmt.Errorf("%s %d: want ≥ 1", name, mean)
	}
	if r < 0 || r >= 1 || math.IsNaN(r) {
		return fmt.Errorf("range ratio %v: want 0 ≤ r < 1", r)
	}
	return nil
}

// RandomOptions configure Random.
type RandomOptions struct {
	N                   int
	InputLen, OutputLen int
	// RangeRatio spreads both lengths uniformly over LengthRange.
	RangeRatio float64
	Seed       uint64
}

// Random makes N prompts of random normal tokens. A prompt's length counts
// its BOS token.
func Random(v Vocab, o RandomOptions) ([]Prompt, error) {
	g, err := newGenerator(v, "input length", o.InputLen, o.OutputLen, o.RangeRatio, o.Seed, 1)
	if err != nil {
		return nil, err
	}
	ps := make([]Prompt, o.N)
	for i := range ps {
		ps[i] = Prompt{IDs: g.ids(nil, g.in.draw(g.rng), true), OutputLen: g.out.draw(g.rng)}
	}
	return ps, nil
}

// generator draws the random data sets' prompts: token ids from the
// vocabulary's ordinary tokens, and a prompt part's and the output's lengths.
type generator struct {
	v       Vocab
	pool    []int32
	rng     *rand.Rand
	in, out spread
}

// newGenerator checks the mean lengths (in is named inName in errors) and
// the range ratio, and seeds the generator's own random stream.
func newGenerator(v Vocab, inName string, in, out int, r float64, seed, stream uint64) (*generator, error) {
	if err := checkLengths(inName, in, r); err != nil {
		return nil, err
	}
	if err := checkLengths("output length", out, r); err != nil {
		return nil, err
	}
	pool, err := ordinary(v)
	if err != nil {
		return nil, err
	}
	return &generator{v: v, pool: pool, rng: newRand(seed, stream), in: newSpread(in, r), out: newSpread(out, r)}, nil
}

// ids appends n random tokens to dst (see randomIDs).
func (g *generator) ids(dst []int32, n int, bos bool) []int32 {
	return randomIDs(g.rng, g.v, g.pool, dst, n, bos)
}

// spread is an inclusive range of lengths (LengthRange), drawn uniformly.
type spread struct{ lo, hi int }

func newSpread(mean int, r float64) spread {
	lo, hi := LengthRange(mean, r)
	return spread{lo, hi}
}

func (s spread) draw(rng *rand.Rand) int { return s.lo + rng.IntN(s.hi-s.lo+1) }

// randomIDs appends n tokens to dst: BOS first when bos is set and the
// model adds one, the rest drawn from pool.
func randomIDs(rng *rand.Rand, v Vocab, pool, dst []int32, n int, bos bool) []int32 {
	if bos && v.AddBOS() && v.BOS() != tokenizer.NoToken && n > 0 {
		dst = append(dst, v.BOS())
		n--
	}
	for range n {
		dst = append(dst, pool[rng.IntN(len(pool))])
	}
	return dst
}

// SharedPrefixOptions configure SharedPrefix.
type SharedPrefixOptions struct {
	N int
	// Groups is the number of distinct prefixes; request i uses prefix
	// i mod Groups before the order is shuffled.
	Groups int
	// PrefixLen is the shared prefix's length, BOS included.
	PrefixLen int
	// SuffixLen and OutputLen are the per-request question and answer
	// lengths, spread by RangeRatio as in Random.
	SuffixLen, OutputLen int
	RangeRatio           float64
	Seed                 uint64
}

// SharedPrefix makes N prompts in Groups groups; the prompts of a group
// start with the same PrefixLen tokens (a system prompt or a document) and
// end with their own random suffix. The order is shuffled so that groups
// interleave as independent users' requests would.
func SharedPrefix(v Vocab, o SharedPrefixOptions) ([]Prompt, error) {
	if o.Groups < 1 {
		return nil, fmt.Errorf("groups %d: want ≥ 1", o.Groups)
	}
	if o.PrefixLen < 1 {
		return nil, fmt.Errorf("prefix length %d: want ≥ 1", o.PrefixLen)
	}
	g, err := newGenerator(v, "suffix length", o.SuffixLen, o.OutputLen, o.RangeRatio, o.Seed, 2)
	if err != nil {
		return nil, err
	}
	prefixes := make([][]int32, o.Groups)
	for i := range prefixes {
		prefixes[i] = g.ids(nil, o.PrefixLen, true)
	}
	ps := make([]Prompt, o.N)
	for i := range ps {
		p := prefixes[i%o.Groups]
		n := g.in.draw(g.rng)
		ids := g.ids(append(make([]int32, 0, len(p)+n), p...), n, false)
		ps[i] = Prompt{IDs: ids, OutputLen: g.out.draw(g.rng)}
	}
	g.rng.Shuffle(len(ps), func(i, j int) { ps[i], ps[j] = ps[j], ps[i] })
	return ps, nil
}

// Fit checks that every prompt leaves room for its output in a context
// window of ctxLen tokens, naming the first one that does not.
func Fit(ps []Prompt, ctxLen int) error {
	if ctxLen <= 0 {
		return nil
	}
	for i, p := range ps {
		if len(p.IDs)+p.OutputLen > ctxLen {
			return fmt.Errorf("prompt %d: %d prompt tokens + %d output tokens exceed the model's context window of %d tokens (shorten the lengths)",
				i, len(p.IDs), p.OutputLen, ctxLen)
		}
	}
	return nil
}

// MultiTurnOptions configure MultiTurn.
type MultiTurnOptions struct {
	// Conversations run side by side, each of Turns turns.
	Conversations, Turns int
	// SystemLen is the system prompt's length, BOS included; each
	// conversation has its own.
	SystemLen int
	// UserLen and OutputLen are each turn's new message and answer
	// lengths, spread by RangeRatio as in Random.
	UserLen, OutputLen int
	RangeRatio         float64
	Seed               uint64
}

// MultiTurn makes Conversations × Turns prompts, turn by turn: request
// t·Conversations + c is turn t of conversation c. Turn t's prompt is the
// conversation so far — the system prompt and, for every earlier turn, its
// user message and an answer of that turn's output length — followed by
// the new user message, so each prompt starts with the previous turn's
// prompt, as a chat client resending the history does. The earlier answers
// are drawn, not the server's actual outputs, so that every server and
// configuration sees the same prompts; what a cache can reuse is the
// previous turns' prompts. A turn is sent after its conversation's
// previous turn ends (After).
func MultiTurn(v Vocab, o MultiTurnOptions) ([]Prompt, error) {
	switch {
	case o.Conversations < 1:
		return nil, fmt.Errorf("conversations %d: want ≥ 1", o.Conversations)
	case o.Turns < 1:
		return nil, fmt.Errorf("turns %d: want ≥ 1", o.Turns)
	case o.SystemLen < 1:
		return nil, fmt.Errorf("system prompt length %d: want ≥ 1", o.SystemLen)
	}
	g, err := newGenerator(v, "user message length", o.UserLen, o.OutputLen, o.RangeRatio, o.Seed, 3)
	if err != nil {
		return nil, err
	}
	ps := make([]Prompt, o.Conversations*o.Turns)
	for c := range o.Conversations {
		history := g.ids(nil, o.SystemLen, true)
		for t := range o.Turns {
			history = g.ids(history, g.in.draw(g.rng), false)
			out := g.out.draw(g.rng)
			i := t*o.Conversations + c
			ps[i] = Prompt{IDs: slices.Clone(history), OutputLen: out, Conversation: c, Turn: t, After: i - o.Conversations}
			history = g.ids(history, out, false) // the answer, in the next turn's history
		}
	}
	return ps, nil
}

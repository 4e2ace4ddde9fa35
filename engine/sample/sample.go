// Package sample turns a model's next-token logits into a token: greedy
// decoding, temperature, top-k, top-p and min-p filtering, repetition,
// frequency and presence penalties, a seeded deterministic random source,
// log-probabilities, and the detection of stop strings in streamed text.
//
// The filters run in llama.cpp's default order — penalties, top-k, top-p,
// min-p, temperature, then a random draw — so that a request gives the same
// distribution here as in llama.cpp with the same parameters. A logit bias
// is added before all of them (OpenAI's logit_bias), and a Constraint (a
// grammar) restricts the draw to the tokens it allows.
package sample

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"math"
	"math/bits"
	"math/rand/v2"
	"slices"

	"github.com/baton-serving/baton/engine"
)

// MaxTopLogprobs bounds Params.TopLogprobs (the OpenAI API's limit).
const MaxTopLogprobs = 20

// MaxLogitBias bounds the magnitude of a Params.LogitBias value (OpenAI's
// range: -100 bans a token in effect, +100 forces it).
const MaxLogitBias = 100

// ErrNoAllowedToken: a Constraint allows no token at all where it is not
// complete (a grammar that cannot go on). The request cannot continue; the
// sampler returns this instead of looping.
var ErrNoAllowedToken = errors.New("sample: the grammar allows no next token")

// ErrDiverged: a token chosen elsewhere (the prefill worker's first token)
// does not follow this sampler's constraint: the two workers disagree, the
// peer's data cannot be used (not the client's input).
var ErrDiverged = errors.New("sample: a token chosen elsewhere does not follow the constraint")

// Params configures the sampler of one request. The zero value is not
// usable (TopP 0 is invalid); start from Defaults.
type Params struct {
	// Temperature divides the logits before the draw; 0 selects greedy
	// decoding (the arg-max, lowest id on ties) and skips the filters.
	Temperature float32
	// TopK keeps the K most likely tokens; 0 disables it.
	TopK int
	// TopP keeps the smallest set of most likely tokens whose probability
	// sums to at least TopP; 1 disables it. Must be in (0, 1].
	TopP float32
	// MinP drops tokens whose probability is below MinP times that of the
	// most likely token; 0 disables it. Must be in [0, 1].
	MinP float32
	// RepeatPenalty divides the positive logits and multiplies the negative
	// ones of every token seen in the penalty window (llama.cpp's
	// repeat_penalty); 1 disables it. Must be > 0.
	RepeatPenalty float32
	// FrequencyPenalty is subtracted from a token's logit once per occurrence
	// in the penalty window, PresencePenalty once if it occurs at all (the
	// OpenAI definitions). Each must be in [-2, 2]; 0 disables it.
	FrequencyPenalty float32
	PresencePenalty  float32
	// PenaltyLastN is the size of the penalty window: the last N accepted
	// tokens (prompt and generated alike, as llama.cpp counts them). 0
	// disables the penalties, -1 uses every accepted token.
	PenaltyLastN int
	// Seed seeds the random source; the same seed, parameters and logits give
	// the same tokens on every run and platform.
	Seed uint64
	// Logprobs asks for the chosen token's log-probability; TopLogprobs > 0
	// also asks for that many most likely tokens. Both are computed from the
	// raw logits (before the bias, penalties, filters, temperature and a
	// grammar's mask): the model's own probabilities, as OpenAI reports them.
	Logprobs    bool
	TopLogprobs int
	// LogitBias is added to the logits of its token ids before the
	// penalties and filters (OpenAI's logit_bias). Values must be finite in
	// [-MaxLogitBias, MaxLogitBias]; ids outside the vocabulary are ignored
	// here (the API layer refuses them).
	LogitBias map[int32]float32
}

// Defaults returns parameters that leave the model's distribution unchanged:
// temperature 1, no filters, no penalties (with llama.cpp's 64-token window
// ready for when a penalty is set), seed 0.
func Defaults() Params {
	return Params{Temperature: 1, TopP: 1, RepeatPenalty: 1, PenaltyLastN: 64}
}

// Validate checks every field's range. The error names the field and wraps
// engine.ErrInvalidInput.
func (p Params) Validate() error {
	bad := func(field string, v any, want string) error {
		return fmt.Errorf("sample: %s = %v, want %s: %w", field, v, want, engine.ErrInvalidInput)
	}
	finite := func(f float32) bool { return !math.IsNaN(float64(f)) && !math.IsInf(float64(f), 0) }
	switch {
	case !finite(p.Temperature) || p.Temperature < 0:
		return bad("temperature", p.Temperature, "a finite value ≥ 0")
	case p.TopK < 0:
		return bad("top_k", p.TopK, "≥ 0 (0 disables)")
	case !finite(p.TopP) || p.TopP <= 0 || p.TopP > 1:
		return bad("top_p", p.TopP, "a value in (0, 1] (1 disables)")
	case !finite(p.MinP) || p.MinP < 0 || p.MinP > 1:
		return bad("min_p", p.MinP, "a value in [0, 1] (0 disables)")
	case !finite(p.RepeatPenalty) || p.RepeatPenalty <= 0:
		return bad("repeat_penalty", p.RepeatPenalty, "a finite value > 0 (1 disables)")
	case !finite(p.FrequencyPenalty) || p.FrequencyPenalty < -2 || p.FrequencyPenalty > 2:
		return bad("frequency_penalty", p.FrequencyPenalty, "a value in [-2, 2]")
	case !finite(p.PresencePenalty) || p.PresencePenalty < -2 || p.PresencePenalty > 2:
		return bad("presence_penalty", p.PresencePenalty, "a value in [-2, 2]")
	case p.PenaltyLastN < -1:
		return bad("penalty_last_n", p.PenaltyLastN, "≥ -1 (-1 = all tokens, 0 disables)")
	case p.TopLogprobs < 0 || p.TopLogprobs > MaxTopLogprobs:
		return bad("top_logprobs", p.TopLogprobs, fmt.Sprintf("a value in [0, %d]", MaxTopLogprobs))
	}
	for _, id := range slices.Sorted(maps.Keys(p.LogitBias)) { // the smallest bad id named
		v := p.LogitBias[id]
		if id < 0 {
			return bad(fmt.Sprintf("logit_bias[%d]", id), v, "a token id ≥ 0")
		}
		if !ValidLogitBias(v) {
			return bad(fmt.Sprintf("logit_bias[%d]", id), v, fmt.Sprintf("a value in [-%d, %d]", MaxLogitBias, MaxLogitBias))
		}
	}
	return nil
}

// Constraint restricts which token may come next: a grammar's matcher
// (*grammar.Matcher satisfies it) following one sequence. End-of-generation
// tokens are the sampler's business: they are allowed exactly where
// Complete holds, and chosen at once when Finished does.
type Constraint interface {
	// Allows reports whether Accept(id) would succeed; it must be cheap.
	Allows(id int32) bool
	// FillMask sets bit id of mask ((vocab+63)/64 words) exactly when
	// Allows(id).
	FillMask(mask []uint64)
	// Accept advances past id.
	Accept(id int32) error
	// Complete: the text so far is a whole sentence (EOG allowed).
	Complete() bool
	// Finished: a whole sentence after which nothing can follow.
	Finished() bool
}

// TokenLogprob is a token and its natural-log probability.
type TokenLogprob struct {
	ID      int32
	Logprob float32
}

// Token is a sampled token. Logprob and Top are set only when the Params asked
// for them; Top is ordered from most to least likely (lowest id first on ties).
type Token struct {
	ID      int32
	Logprob float32
	Top     []TokenLogprob
}

// Sampler draws tokens for one sequence. It keeps the sequence's recent
// tokens for the penalties and its own random source, so it is not safe for
// concurrent use; make one per request.
type Sampler struct {
	p   Params
	pcg *rand.PCG
	rng *rand.Rand
	// draws counts the tokens this sampler has chosen or skipped. Each
	// token's random numbers come from a generator seeded by (Seed, draws),
	// so the n-th token of a request is drawn alike by whichever worker
	// samples it: a prefill worker that chose the first token and a decode
	// worker that continues after Skip(1) reproduce a single worker's run.
	draws uint64

	history []int32 // accepted tokens, oldest first; trimmed to the window
	counts  map[int32]int
	work    []float32   // biased, penalized or masked copy of the logits
	cand    []candidate // filter scratch
	weights []float64   // draw's unnormalized probabilities, per candidate

	// c, when set, constrains every token (Constrain); eog are the
	// end-of-generation ids, noEOG forbids them until c is Finished.
	c     Constraint
	eog   []int32
	noEOG bool
	mask  []uint64
}

type candidate struct {
	id    int32
	logit float32
}

// New validates p and returns a sampler seeded with p.Seed.
func New(p Params) (*Sampler, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	// PCG's two words: the seed and a fixed odd stream constant, so that
	// seeds 0 and 1 are as unrelated as any other two.
	pcg := rand.NewPCG(p.Seed, 0)
	return &Sampler{
		p:      p,
		pcg:    pcg,
		rng:    rand.New(pcg),
		counts: make(map[int32]int),
	}, nil
}

// Params returns the sampler's parameters.
func (s *Sampler) Params() Params { return s.p }

// Accept records a token of the sequence (prompt or generated) in the penalty
// window.
func (s *Sampler) Accept(ids ...int32) {
	if s.p.PenaltyLastN == 0 || !s.penalizes() {
		return
	}
	s.history = append(s.history, ids...)
	if n := s.p.PenaltyLastN; n > 0 && len(s.history) > 2*n {
		// Trim lazily so that Accept stays amortized O(1).
		s.history = append(s.history[:0], s.history[len(s.history)-n:]...)
	}
}

// Constrain makes every later token one that c allows. eog are the model's
// end-of-generation ids: one is allowed exactly where c is Complete (never,
// with ignoreEOS, until c is Finished), and the first is chosen at once when
// c is Finished, whatever the logits say. The draw is made as without c; only
// when it picks a token c does not allow are the others masked out (-Inf)
// and the draw repeated, continuing the same position's random stream. For
// greedy decoding this is the arg-max of the allowed tokens; with
// temperature and no filters it is exactly the distribution restricted to
// them (llama.cpp samples grammars the same way). Chosen tokens other than
// EOG are Accepted into c.
func (s *Sampler) Constrain(c Constraint, eog []int32, ignoreEOS bool) {
	s.c, s.eog, s.noEOG = c, slices.Clone(eog), ignoreEOS
}

// Ends reports whether id ends a constrained sequence: an end-of-generation
// id under a Constraint, which ends it even when EOS is otherwise ignored.
func (s *Sampler) Ends(id int32) bool { return s.c != nil && slices.Contains(s.eog, id) }

// Follow advances the sampler past one token chosen elsewhere (the first
// token a prefill worker sampled): like Skip(1), and the constraint Accepts
// it.
//
// It checks the token as a local draw would: an end-of-generation id only
// where Sample could have chosen it (c Complete; with ignore_eos, c
// Finished), any other id only where c allows it. A refusal wraps
// ErrDiverged: the worker that chose it disagrees with this one.
func (s *Sampler) Follow(id int32) error {
	s.draws++
	if s.c == nil {
		return nil
	}
	if slices.Contains(s.eog, id) {
		if s.c.Finished() || !s.noEOG && s.c.Complete() {
			return nil
		}
		return fmt.Errorf("sample: end-of-generation token %d chosen elsewhere where the grammar is not complete (ignore_eos %v): %w", id, s.noEOG, ErrDiverged)
	}
	if err := s.c.Accept(id); err != nil {
		return fmt.Errorf("sample: token %d chosen elsewhere does not follow the grammar: %v: %w", id, err, ErrDiverged)
	}
	return nil
}

// allowed reports whether the constraint lets id come next.
func (s *Sampler) allowed(id int32) bool {
	if slices.Contains(s.eog, id) {
		return !s.noEOG && s.c.Complete()
	}
	return s.c.Allows(id)
}

// masked copies l into s.work (unless inWork: it is s.work already) with
// every token the constraint does not allow at -Inf.
func (s *Sampler) masked(l []float32, inWork bool) []float32 {
	words := (len(l) + 63) / 64
	if cap(s.mask) < words {
		s.mask = make([]uint64, words)
	}
	m := s.mask[:words]
	clear(m)
	s.c.FillMask(m)
	eogOK := !s.noEOG && s.c.Complete()
	for _, id := range s.eog {
		if id >= 0 && int(id) < len(l) {
			if eogOK {
				m[id/64] |= 1 << (id % 64)
			} else {
				m[id/64] &^= 1 << (id % 64)
			}
		}
	}
	if !inWork {
		s.work = append(s.work[:0], l...)
		l = s.work
	}
	inf := float32(math.Inf(-1))
	for w, bits := range m {
		base := w * 64
		if bits == ^uint64(0) {
			continue
		}
		end := min(base+64, len(l))
		for i := base; i < end; i++ {
			if bits&(1<<(i-base)) == 0 {
				l[i] = inf
			}
		}
	}
	return l
}

// maskCount is how many tokens the last masked call allowed.
func (s *Sampler) maskCount() int {
	n := 0
	for _, w := range s.mask {
		n += bits.OnesCount64(w)
	}
	return n
}

func (s *Sampler) penalizes() bool {
	return s.p.RepeatPenalty != 1 || s.p.FrequencyPenalty != 0 || s.p.PresencePenalty != 0
}

// Skip advances the sampler past n tokens chosen elsewhere, so that its next
// draw is the one a single sampler would make after choosing them. Pair it
// with Accept for the skipped tokens' penalties.
func (s *Sampler) Skip(n int) {
	if n > 0 {
		s.draws += uint64(n)
	}
}

// Sample picks the next token from logits (one per vocabulary entry), which it
// does not modify.
func (s *Sampler) Sample(logits []float32) (Token, error) {
	if len(logits) == 0 {
		return Token{}, fmt.Errorf("sample: empty logits: %w", engine.ErrInvalidInput)
	}
	l := logits
	penalize := s.penalizes() && s.p.PenaltyLastN != 0 && len(s.history) > 0
	inWork := len(s.p.LogitBias) > 0 || penalize
	if inWork {
		s.work = append(s.work[:0], logits...)
		for id, b := range s.p.LogitBias {
			if id >= 0 && int(id) < len(s.work) {
				s.work[id] += b
			}
		}
		if penalize {
			s.applyPenalties(s.work)
		}
		l = s.work
	}
	// Seed, stream: the request's seed, and a stream per token position
	// (an odd constant mixed in so that seeds 0 and 1 are as unrelated as
	// any other two).
	s.pcg.Seed(s.p.Seed, s.draws*0x9e3779b97f4a7c15+0x632be59bd9b4e019)
	s.draws++
	var id int32
	switch {
	case s.c != nil && s.c.Finished():
		// Only the end can follow.
		if len(s.eog) == 0 {
			return Token{}, fmt.Errorf("sample: the grammar is finished but the model has no end-of-generation token: %w", ErrNoAllowedToken)
		}
		id = s.eog[0]
	default:
		var err error
		if id, err = s.choose(l); err != nil {
			return Token{}, err
		}
		if id >= 0 && s.c != nil && !s.allowed(id) {
			// Mask and draw again from the same position's stream.
			if id, err = s.choose(s.masked(l, inWork)); err != nil {
				return Token{}, err
			}
			if id < 0 {
				if allowed := s.maskCount(); allowed > 0 {
					// The grammar allows tokens; the model gave none of
					// them a finite logit (NaN or -Inf): not a dead end.
					return Token{}, fmt.Errorf("sample: no finite logit among the %d tokens the grammar allows: %w", allowed, engine.ErrInvalidInput)
				}
				return Token{}, fmt.Errorf("sample: %d tokens, none allowed by the grammar (complete: %v): %w",
					len(logits), s.c.Complete(), ErrNoAllowedToken)
			}
		}
	}
	if id < 0 {
		return Token{}, fmt.Errorf("sample: no finite logit among %d: %w", len(logits), engine.ErrInvalidInput)
	}
	if s.c != nil && !slices.Contains(s.eog, id) {
		if err := s.c.Accept(id); err != nil {
			// An invariant of the Constraint broken: a bug (INTERNAL),
			// neither the client's grammar nor a dead end.
			return Token{}, fmt.Errorf("sample: the grammar refused token %d it allowed: %v", id, err)
		}
	}
	tok := Token{ID: id}
	if s.p.Logprobs || s.p.TopLogprobs > 0 {
		tok.Logprob, tok.Top = Logprobs(logits, id, s.p.TopLogprobs)
	}
	return tok, nil
}

// choose is greedy or a draw, as the temperature says; -1 when no logit is
// finite.
func (s *Sampler) choose(l []float32) (int32, error) {
	if s.p.Temperature == 0 {
		return Greedy(l), nil
	}
	return s.draw(l)
}

func (s *Sampler) applyPenalties(l []float32) {
	window := s.history
	if n := s.p.PenaltyLastN; n > 0 && len(window) > n {
		window = window[len(window)-n:]
	}
	clear(s.counts)
	for _, id := range window {
		if id >= 0 && int(id) < len(l) {
			s.counts[id]++
		}
	}
	for id, c := range s.counts {
		v := l[id]
		if v > 0 {
			v /= s.p.RepeatPenalty
		} else {
			v *= s.p.RepeatPenalty
		}
		v -= float32(c)*s.p.FrequencyPenalty + s.p.PresencePenalty
		l[id] = v
	}
}

// draw applies top-k, top-p, min-p and temperature and draws from what is
// left. It returns -1 when no logit is finite.
func (s *Sampler) draw(l []float32) (int32, error) {
	c := s.cand[:0]
	for i, v := range l {
		if !math.IsNaN(float64(v)) && !math.IsInf(float64(v), -1) {
			c = append(c, candidate{int32(i), v})
		}
	}
	s.cand = c
	if len(c) == 0 {
		return -1, nil
	}
	c = filter(c, s.p)
	// Softmax at temperature T over the survivors; exponents ≤ 0 after
	// subtracting the maximum, sums in float64.
	maxL := c[0].logit
	for _, x := range c[1:] {
		maxL = max(maxL, x.logit)
	}
	if math.IsInf(float64(maxL), 1) {
		// +Inf logits take all the mass, shared evenly.
		c = slices.DeleteFunc(c, func(x candidate) bool { return !math.IsInf(float64(x.logit), 1) })
		return c[s.rng.IntN(len(c))].id, nil
	}
	invT := 1 / float64(s.p.Temperature)
	// Each weight once (math.Exp was a tenth of a serving worker's time
	// when computed for the sum and again for the walk); the same values
	// in the same order, so the same draws.
	w := slices.Grow(s.weights[:0], len(c))[:len(c)]
	s.weights = w
	var sum float64
	for i, x := range c {
		w[i] = math.Exp(float64(x.logit-maxL) * invT)
		sum += w[i]
	}
	u := s.rng.Float64() * sum
	var acc float64
	for i, x := range c {
		acc += w[i]
		if u < acc {
			return x.id, nil
		}
	}
	return c[len(c)-1].id, nil // rounding left u at the very top
}

// byLogitDesc orders candidates from most to least likely, lowest id first
// among equals, so that every filter's cut is deterministic.
func byLogitDesc(a, b candidate) int {
	if a.logit != b.logit {
		return cmp.Compare(b.logit, a.logit)
	}
	return cmp.Compare(a.id, b.id)
}

// filter applies top-k, top-p and min-p (in llama.cpp's order) to a non-empty
// candidate list and returns the survivors; at least one always survives.
func filter(c []candidate, p Params) []candidate {
	sorted := false
	if p.TopK > 0 && p.TopK < len(c) {
		c = selectTop(c, p.TopK)
		sorted = true
	}
	if p.TopP < 1 {
		if !sorted {
			slices.SortFunc(c, byLogitDesc)
			sorted = true
		}
		// Probabilities at temperature 1 over the current candidates, as
		// llama.cpp computes them for this filter.
		maxL := float64(c[0].logit)
		var sum float64
		for _, x := range c {
			sum += math.Exp(float64(x.logit) - maxL)
		}
		var acc float64
		keep := len(c)
		for i, x := range c {
			acc += math.Exp(float64(x.logit)-maxL) / sum
			if acc >= float64(p.TopP) {
				keep = i + 1
				break
			}
		}
		c = c[:keep]
	}
	if p.MinP > 0 {
		maxL := c[0].logit
		if !sorted {
			for _, x := range c[1:] {
				maxL = max(maxL, x.logit)
			}
		}
		// p_i ≥ min_p·p_max  ⇔  logit_i ≥ max + ln(min_p)
		threshold := float64(maxL) + math.Log(float64(p.MinP))
		c = slices.DeleteFunc(c, func(x candidate) bool { return float64(x.logit) < threshold })
	}
	return c
}

// selectTop returns the k best candidates (k < len(c)) sorted best first. It
// sorts only a min-heap of k entries, O(n log k), which matters for 100k+
// vocabularies with small k.
func selectTop(c []candidate, k int) []candidate {
	h := c[:k]
	// worse(a, b): a ranks below b.
	worse := func(a, b candidate) bool { return byLogitDesc(a, b) > 0 }
	down := func(i int) {
		for {
			l := 2*i + 1
			if l >= k {
				return
			}
			m := l
			if r := l + 1; r < k && worse(h[r], h[l]) {
				m = r
			}
			if !worse(h[m], h[i]) {
				return
			}
			h[i], h[m] = h[m], h[i]
			i = m
		}
	}
	for i := k/2 - 1; i >= 0; i-- {
		down(i)
	}
	for _, x := range c[k:] {
		if worse(h[0], x) {
			h[0] = x
			down(0)
		}
	}
	slices.SortFunc(h, byLogitDesc)
	return h
}

// Greedy returns the index of the largest logit, the lowest index among
// equal maxima, or -1 when no logit is a number greater than -Inf.
func Greedy(logits []float32) int32 {
	best := int32(-1)
	bestV := float32(math.Inf(-1))
	for i, v := range logits {
		if v > bestV {
			best, bestV = int32(i), v
		}
	}
	return best
}

// Logprobs returns the log-softmax of logits at chosen and the n most likely
// tokens with their log-probabilities (best first, lowest id first on ties).
// The log-sum-exp is computed in float64 around the maximum.
func Logprobs(logits []float32, chosen int32, n int) (float32, []TokenLogprob) {
	if len(logits) == 0 {
		return float32(math.Inf(-1)), nil
	}
	maxL := float32(math.Inf(-1))
	for _, v := range logits {
		maxL = max(maxL, v)
	}
	var sum float64
	for _, v := range logits {
		sum += math.Exp(float64(v - maxL))
	}
	lse := float64(maxL) + math.Log(sum)
	lp := func(v float32) float32 { return float32(float64(v) - lse) }
	var chosenLP float32
	if chosen >= 0 && int(chosen) < len(logits) {
		chosenLP = lp(logits[chosen])
	} else {
		chosenLP = float32(math.Inf(-1))
	}
	if n <= 0 {
		return chosenLP, nil
	}
	n = min(n, len(logits))
	c := make([]candidate, len(logits))
	for i, v := range logits {
		c[i] = candidate{int32(i), v}
	}
	if n < len(c) {
		c = selectTop(c, n)
	} else {
		slices.SortFunc(c, byLogitDesc)
	}
	top := make([]TokenLogprob, n)
	for i := range top {
		top[i] = TokenLogprob{ID: c[i].id, Logprob: lp(c[i].logit)}
	}
	return chosenLP, top
}

// ValidLogitBias reports whether v is a bias Params.LogitBias may hold: a
// finite value in [-MaxLogitBias, MaxLogitBias]. API layers use it to name
// the offending field in their own terms.
func ValidLogitBias(v float32) bool {
	return !math.IsNaN(float64(v)) && !math.IsInf(float64(v), 0) && v >= -MaxLogitBias && v <= MaxLogitBias
}

// ChoiceSeed is the seed of choice k of a request sampling several
// continuations of one prompt (the OpenAI API's n) with seed seed. Choice
// 0 keeps the request's seed, so that n = 1 draws exactly what it always
// did; choice k > 0 takes SplitMix64's finalizer of seed + k·γ (γ =
// 0x9e3779b97f4a7c15, the golden-ratio increment), which spreads
// neighbouring seeds and neighbouring k over unrelated streams. A request
// with Params.Seed = ChoiceSeed(seed, k) reproduces choice k on its own.
func ChoiceSeed(seed uint64, k int) uint64 {
	if k == 0 {
		return seed
	}
	z := seed + uint64(k)*0x9e3779b97f4a7c15
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return z ^ z>>31
}

package sample_test

import (
	"errors"
	"math"
	"testing"

	"github.com/baton-serving/baton/engine"
	"github.com/baton-serving/baton/engine/grammar"
	"github.com/baton-serving/baton/engine/sample"
)

// The tests here constrain the sampler with the real grammar package over a
// small vocabulary: ids 0-4 are "a", "b", "c", "ab", "{"; 5 is the
// end-of-generation token (a control token: nil bytes).
var (
	pieces = [][]byte{[]byte("a"), []byte("b"), []byte("c"), []byte("ab"), []byte("{"), nil}
	eog    = []int32{5}
)

const eogID = 5

func matcher(t *testing.T, src string) *grammar.Matcher {
	t.Helper()
	g, err := grammar.Parse(src)
	if err != nil {
		t.Fatalf("Parse(%q): %v", src, err)
	}
	return g.NewMatcher(grammar.NewVocab(pieces, eog))
}

func sampler(t *testing.T, temp float32, seed uint64, c sample.Constraint, ignoreEOS bool) *sample.Sampler {
	t.Helper()
	p := sample.Defaults()
	p.Temperature, p.Seed = temp, seed
	p.Logprobs = true
	s, err := sample.New(p)
	if err != nil {
		t.Fatal(err)
	}
	if c != nil {
		s.Constrain(c, eog, ignoreEOS)
	}
	return s
}

func logs(ps ...float64) []float32 {
	l := make([]float32, len(ps))
	for i, p := range ps {
		l[i] = float32(math.Log(p))
	}
	return l
}

var _ sample.Constraint = (*grammar.Matcher)(nil)

// TestConstraintGreedy: greedy decoding under a grammar is the arg-max of
// the allowed tokens, the logprob is the raw one, EOG comes only where the
// grammar is complete, and a finished grammar gives EOG whatever the
// logits.
func TestConstraintGreedy(t *testing.T) {
	s := sampler(t, 0, 0, matcher(t, `root ::= "a" "b"+`), false)
	logits := logs(0.05, 0.1, 0.4, 0.05, 0.1, 0.3) // c, then EOG, are the model's favourites
	// "a" ("a" and "ab" tie: lowest id), then "b" (c never; EOG not before
	// a "b"), then EOG (complete, and favoured over "b").
	want := []int32{0, 1, eogID}
	for i, w := range want {
		tok, err := s.Sample(logits)
		if err != nil {
			t.Fatal(err)
		}
		if tok.ID != w {
			t.Fatalf("token %d: %d, want %d", i, tok.ID, w)
		}
		lp, _ := sample.Logprobs(logits, w, 0)
		if math.Abs(float64(tok.Logprob-lp)) > 1e-5 {
			t.Errorf("token %d: logprob %v, want the raw %v", i, tok.Logprob, lp)
		}
	}
}

// TestConstraintEOG: EOG where complete, refused with ignoreEOS until the
// grammar is finished, chosen at once when finished.
func TestConstraintEOG(t *testing.T) {
	logits := logs(0.1, 0.2, 0.1, 0.1, 0.1, 0.4) // EOG favoured
	s := sampler(t, 0, 0, matcher(t, `root ::= "a" "b"?`), false)
	if tok, _ := s.Sample(logits); tok.ID != 0 {
		t.Fatalf("first token %d, want a", tok.ID)
	}
	if tok, _ := s.Sample(logits); tok.ID != eogID || !s.Ends(tok.ID) {
		t.Fatalf("after a (complete): %d, want EOG", tok.ID)
	}

	s = sampler(t, 0, 0, matcher(t, `root ::= "a" "b"?`), true)
	if tok, _ := s.Sample(logits); tok.ID != 0 {
		t.Fatalf("first token %d, want a", tok.ID)
	}
	if tok, _ := s.Sample(logits); tok.ID != 1 {
		t.Fatalf("ignore_eos, complete but not finished: %d, want b", tok.ID)
	}
	// Finished: EOG at once, even with ignore_eos and a logit of -Inf.
	logits[eogID] = float32(math.Inf(-1))
	if tok, err := s.Sample(logits); err != nil || tok.ID != eogID {
		t.Fatalf("finished grammar: %d, %v; want EOG", tok.ID, err)
	}
}

// TestConstraintDistribution: with temperature 1 and no filters the
// first-try-then-mask draw is exactly the model's distribution restricted
// to the allowed tokens.
func TestConstraintDistribution(t *testing.T) {
	logits := logs(0.1, 0.2, 0.4, 0.1, 0.1, 0.1)
	// Allowed first: "a" (0.1), "b" (0.2), "ab" (0.1); restricted: 0.25, 0.5, 0.25.
	want := map[int32]float64{0: 0.25, 1: 0.5, 3: 0.25}
	const n = 20000
	got := map[int32]float64{}
	g, err := grammar.Parse(`root ::= ("a" | "b") "b"*`)
	if err != nil {
		t.Fatal(err)
	}
	v := grammar.NewVocab(pieces, eog)
	for seed := range uint64(n) {
		s := sampler(t, 1, seed, g.NewMatcher(v), false)
		tok, err := s.Sample(logits)
		if err != nil {
			t.Fatal(err)
		}
		got[tok.ID] += 1.0 / n
	}
	for id, w := range want {
		if math.Abs(got[id]-w) > 0.015 {
			t.Fatalf("token %d: frequency %.4f, want %.4f (all %v)", id, got[id], w, got)
		}
	}
	if len(got) != len(want) {
		t.Fatalf("tokens outside the grammar drawn: %v", got)
	}
}

// TestConstraintDead: a grammar no token can continue (its next character
// is in no token) ends with ErrNoAllowedToken, not a loop.
func TestConstraintDead(t *testing.T) {
	s := sampler(t, 0.8, 1, matcher(t, `root ::= "a" "z"`), false)
	logits := logs(0.1, 0.2, 0.4, 0.1, 0.1, 0.1)
	if tok, err := s.Sample(logits); err != nil || tok.ID != 0 {
		t.Fatalf("first token %d, %v; want a", tok.ID, err)
	}
	_, err := s.Sample(logits)
	if !errors.Is(err, sample.ErrNoAllowedToken) || errors.Is(err, engine.ErrInvalidInput) {
		t.Fatalf("dead grammar: %v, want ErrNoAllowedToken", err)
	}
}

// TestConstraintFollow: a run split after the first token (prefill chose
// it, decode Follows it) gives the same tokens as one sampler, and a first
// token the grammar refuses is invalid input.
func TestConstraintFollow(t *testing.T) {
	const src = `root ::= ("a" | "b" | "c" | "ab")+`
	logits := logs(0.2, 0.2, 0.2, 0.2, 0.1, 0.1)
	one := sampler(t, 1, 99, matcher(t, src), false)
	var want []int32
	for range 20 {
		tok, err := one.Sample(logits)
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, tok.ID)
	}
	first := sampler(t, 1, 99, matcher(t, src), false)
	tok, err := first.Sample(logits)
	if err != nil || tok.ID != want[0] {
		t.Fatalf("prefill's first token %d, %v; want %d", tok.ID, err, want[0])
	}
	rest := sampler(t, 1, 99, matcher(t, src), false)
	if err := rest.Follow(tok.ID); err != nil {
		t.Fatal(err)
	}
	for i := 1; i < len(want); i++ {
		tok, err := rest.Sample(logits)
		if err != nil || tok.ID != want[i] {
			t.Fatalf("token %d after Follow: %d, %v; want %d (run %v)", i, tok.ID, err, want[i], want)
		}
	}
	bad := sampler(t, 1, 99, matcher(t, `root ::= "a"`), false)
	if err := bad.Follow(4); !errors.Is(err, sample.ErrDiverged) {
		t.Fatalf("Follow of a refused token: %v, want ErrDiverged", err)
	}
}

// TestFollowChecks: a first token chosen elsewhere (by the prefill
// worker) is checked as a local draw would be: an end-of-generation id
// only where the grammar is complete (with ignore_eos only where it is
// finished), any other id only where the grammar allows it; a refusal is
// the peer's data disagreeing with ours (ErrDiverged, DATA_LOSS at the
// boundary), not the client's input.
func TestFollowChecks(t *testing.T) {
	for _, c := range []struct {
		name      string
		src       string
		ignoreEOS bool
		id        int32
		ok        bool
	}{
		{"eog before complete", `root ::= "a"`, false, eogID, false},
		{"eog where empty is complete", `root ::= [a-c]*`, false, eogID, true},
		{"eog with ignore_eos before finished", `root ::= [a-c]*`, true, eogID, false},
		{"eog with ignore_eos once finished", `root ::= ""`, true, eogID, true},
		{"allowed token", `root ::= [a-c]*`, false, 0, true},
		{"refused token", `root ::= "b"`, false, 0, false},
	} {
		s := sampler(t, 0, 1, matcher(t, c.src), c.ignoreEOS)
		err := s.Follow(c.id)
		if c.ok != (err == nil) {
			t.Errorf("%s: Follow(%d) = %v, want ok %v", c.name, c.id, err, c.ok)
		}
		if err != nil && (!errors.Is(err, sample.ErrDiverged) || errors.Is(err, engine.ErrInvalidInput)) {
			t.Errorf("%s: %v wraps ErrInvalidInput or not ErrDiverged", c.name, err)
		}
	}
}

// lyingConstraint allows every token and accepts none: a broken
// Constraint, the only way to reach the sampler's invariant check.
type lyingConstraint struct{}

func (lyingConstraint) Allows(int32) bool { return true }
func (lyingConstraint) FillMask(m []uint64) {
	for i := range m {
		m[i] = ^uint64(0)
	}
}
func (lyingConstraint) Accept(id int32) error { return grammar.ErrRejected }
func (lyingConstraint) Complete() bool        { return false }
func (lyingConstraint) Finished() bool        { return false }

// TestConstraintInvariantIsInternal: a constraint refusing the token it
// allowed is a bug in the server, not the client's grammar (INVALID_ARGUMENT
// via ErrRejected) nor a dead end of the grammar (ABORTED via
// ErrNoAllowedToken): the error wraps neither, so it maps to INTERNAL.
func TestConstraintInvariantIsInternal(t *testing.T) {
	s := sampler(t, 0, 1, lyingConstraint{}, false)
	_, err := s.Sample(logs(0.5, 0.2, 0.1, 0.1, 0.05, 0.05))
	if err == nil || errors.Is(err, sample.ErrNoAllowedToken) || errors.Is(err, grammar.ErrRejected) || errors.Is(err, engine.ErrInvalidInput) {
		t.Fatalf("Sample under a lying constraint: %v, want an error wrapping no sentinel", err)
	}
}

// TestNonFiniteLogitsUnderGrammar: when the tokens the grammar allows all
// have NaN or -Inf logits, the error says the logits are at fault
// (ErrInvalidInput), not that the grammar reached a dead end.
func TestNonFiniteLogitsUnderGrammar(t *testing.T) {
	for _, bad := range []float32{float32(math.NaN()), float32(math.Inf(-1))} {
		s := sampler(t, 0, 1, matcher(t, `root ::= "b"`), false)
		l := logs(0.5, 0.2, 0.1, 0.1, 0.05, 0.05)
		l[1] = bad
		_, err := s.Sample(l)
		if !errors.Is(err, engine.ErrInvalidInput) || errors.Is(err, sample.ErrNoAllowedToken) {
			t.Errorf("logit %v for the one allowed token: %v, want ErrInvalidInput, not ErrNoAllowedToken", bad, err)
		}
	}
}

package grammar

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/baton-serving/baton/engine"
)

// ambiguous is the GBNF whose rule aK reaches the end through aK+1 in two
// ways, D levels deep: 2^(D-1) parse paths to the final "z", each a
// different return stack, so a closure that followed them all would cost
// twice as much per level. prefix comes before root's reference to a1.
func ambiguous(d int, prefix string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "root ::= %s a1\n", prefix)
	for k := 1; k < d; k++ {
		fmt.Fprintf(&b, "a%d ::= a%d \"x\" | a%d \"y\"\n", k, k+1, k+1)
	}
	fmt.Fprintf(&b, "a%d ::= \"z\"\n", d)
	return b.String()
}

// TestAmbiguityBudget: a grammar whose start expands to more parse paths
// than one closure may follow is refused by Parse with an *Error naming a
// rule, instead of costing time and memory doubling per level in
// NewMatcher; one of moderate ambiguity still parses and matches.
func TestAmbiguityBudget(t *testing.T) {
	_, err := Parse(ambiguous(20, ""))
	var e *Error
	if !errors.As(err, &e) || !errors.Is(err, engine.ErrInvalidInput) || e.Rule == "" || !strings.Contains(err.Error(), "ambiguous") {
		t.Fatalf("Parse of a 20-level ambiguous grammar: %v, want an *Error naming a rule and saying ambiguous", err)
	}
	g := mustParse(t, ambiguous(8, ""))
	if !g.MatchString("zxyxyxyx") || g.MatchString("zxy") {
		t.Error("the 8-level ambiguous grammar does not match as it should")
	}
}

// TestTransitionBudget: the same blow-up behind a first character is
// reached by a transition, on the scheduler's goroutine: its work is
// bounded (the stack nodes it interns stay within the closure budget) and
// the character is refused, on every worker alike, not half followed.
func TestTransitionBudget(t *testing.T) {
	v, pieces := smallVocab()
	g := mustParse(t, ambiguous(20, `"q"`))
	m := g.NewMatcher(v)
	if err := m.Accept(tokenID(t, pieces, "q")); !errors.Is(err, ErrRejected) {
		t.Fatalf("Accept(q) into a too ambiguous closure: %v, want ErrRejected", err)
	}
	if _, nodes, _, _ := g.CacheStats(); nodes > 2*maxClosureWork {
		t.Fatalf("one transition interned %d stack nodes, want at most %d", nodes, 2*maxClosureWork)
	}
	checkMask(t, m, v)
	// A moderate one behind the same character is followed.
	if g := mustParse(t, ambiguous(8, `"q"`)); !g.MatchString("qzxyxyxyx") {
		t.Error("qzxyxyxyx does not match the 8-level grammar")
	}
}

// TestStackOrderDeterministic: a state's stacks are in an order that
// depends on the stacks alone, not on which states were built first (the
// ids nodes are interned with), so the cut at maxStacks and the closure
// budget keep the same stacks on every worker whatever its cache saw.
func TestStackOrderDeterministic(t *testing.T) {
	v, pieces := smallVocab()
	src := "root ::= \"a\" x | \"b\" y\nx ::= s1 | s2\ny ::= s2 | s1\ns1 ::= \"c\" \"d\"\ns2 ::= \"d\" \"c\""
	order := func(g *Grammar) []int32 {
		m := g.NewMatcher(v)
		if err := m.Accept(tokenID(t, pieces, "a")); err != nil {
			t.Fatal(err)
		}
		var pos []int32
		for _, n := range m.st.stacks {
			pos = append(pos, n.pos)
		}
		return pos
	}
	fresh := order(mustParse(t, src))
	g := mustParse(t, src)
	m := g.NewMatcher(v)
	if err := m.Accept(tokenID(t, pieces, "b")); err != nil {
		t.Fatal(err)
	}
	if got := order(g); fmt.Sprint(got) != fmt.Sprint(fresh) {
		t.Fatalf("stacks after \"a\": %v after visiting \"b\" first, %v fresh", got, fresh)
	}
}

// TestLongCountedRun: a counted repetition longer than a run is followed
// ([a-z]{0,260}: 255 levels and more) is a bounded run, not an unbounded
// one: a token of 261 letters is refused by the mask as by Allows, and
// one of 255 allowed.
func TestLongCountedRun(t *testing.T) {
	_, pieces := smallVocab()
	long := strings.Repeat("a", 261)
	pieces = append(pieces, []byte(long), []byte(long[:255]))
	// The trie's shortcut applies only to big subtrees: pad with letters.
	for i := range 1200 {
		pieces = append(pieces, []byte(fmt.Sprintf("b%c%c", 'a'+i%26, 'a'+i/26%26)))
	}
	v := NewVocab(pieces, []int32{1})
	m := mustParse(t, `root ::= [a-z]{0,260}`).NewMatcher(v)
	mask := checkMask(t, m, v)
	id := int32(len(pieces) - 1202)
	if mask[id>>6]>>(id&63)&1 != 0 || mask[(id+1)>>6]>>((id+1)&63)&1 == 0 {
		t.Fatalf("261 letters allowed %v, 255 allowed %v; want false, true", mask[id>>6]>>(id&63)&1 != 0, mask[(id+1)>>6]>>((id+1)&63)&1 != 0)
	}
}

// TestFillMaskInsideCharacterNoAlloc: a mask inside a multi-byte character
// (never cached) is filled into the caller's slice, not a vocabulary-sized
// one allocated per call.
func TestFillMaskInsideCharacterNoAlloc(t *testing.T) {
	v, pieces := smallVocab()
	m := mustParse(t, `root ::= "é"*`).NewMatcher(v)
	if err := m.Accept(tokenID(t, pieces, "\xc3")); err != nil {
		t.Fatal(err)
	}
	mask := make([]uint64, (v.Size()+63)/64)
	m.FillMask(mask)
	if n := testing.AllocsPerRun(20, func() { m.FillMask(mask) }); n != 0 {
		t.Fatalf("FillMask inside a character: %v allocations per call, want 0", n)
	}
}

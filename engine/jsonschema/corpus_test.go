package jsonschema

import (
	"bufio"
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"

	validator "github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/baton-serving/baton/engine/grammar"
)

type corpusEntry struct {
	name   string
	schema []byte
	g      *grammar.Grammar
	check  *validator.Schema
}

// loadCorpus compiles every schema under testdata/schemas twice: to a
// grammar (ToGrammar, then engine/grammar) and to a validator
// (santhosh-tekuri/jsonschema, formats asserted).
func loadCorpus(t *testing.T) []corpusEntry {
	t.Helper()
	files, err := filepath.Glob("testdata/schemas/*.json")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 15 {
		t.Fatalf("corpus has %d schemas; want at least 15", len(files))
	}
	var out []corpusEntry
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		name := strings.TrimSuffix(filepath.Base(f), ".json")
		doc, err := validator.UnmarshalJSON(bytes.NewReader(data))
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		vc := validator.NewCompiler()
		vc.AssertFormat()
		url := "file:///" + name + ".json"
		if err := vc.AddResource(url, doc); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		check, err := vc.Compile(url)
		if err != nil {
			t.Fatalf("%s: the validator refuses the schema: %v", f, err)
		}
		out = append(out, corpusEntry{name: name, schema: data, g: compile(t, string(data)), check: check})
	}
	return out
}

func (e corpusEntry) validate(text string) error {
	inst, err := validator.UnmarshalJSON(strings.NewReader(text))
	if err != nil {
		return err
	}
	return e.check.Validate(inst)
}

// TestCorpusValidDocuments: hand-written documents that satisfy each schema
// (checked with the validator) are accepted by its grammar fed byte by byte.
// The grammar is not stricter than the schema on such JSON.
func TestCorpusValidDocuments(t *testing.T) {
	bv := newByteVocab()
	for _, e := range loadCorpus(t) {
		f, err := os.Open(filepath.Join("testdata", "valid", e.name+".txt"))
		if err != nil {
			t.Errorf("%s: no valid documents: %v", e.name, err)
			continue
		}
		// A document is one line, or several lines up to a line that
		// closes it (starts with '}' or ']').
		var docs []string
		var cur []string
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			line := sc.Text()
			cur = append(cur, line)
			if len(cur) == 1 && line != "{" && line != "[" || len(cur) > 1 && (strings.HasPrefix(line, "}") || strings.HasPrefix(line, "]")) {
				docs = append(docs, strings.Join(cur, "\n"))
				cur = nil
			}
		}
		f.Close()
		if len(docs) == 0 {
			t.Errorf("%s: no valid documents", e.name)
		}
		for _, d := range docs {
			if err := e.validate(d); err != nil {
				t.Errorf("%s: test document %q does not satisfy the schema: %v", e.name, d, err)
				continue
			}
			if !bv.matches(e.g, d) {
				src, _ := ToGrammar(e.schema)
				t.Errorf("%s: grammar refuses the valid document %q\n%s", e.name, d, src)
			}
		}
	}
}

// structural are the tokens a walk prefers half of the time, so strings and
// containers close within the length cap.
var structural = func() map[int32]bool {
	m := map[int32]bool{}
	for _, b := range []byte(`"{}[],:0123456789-tfn.e `) {
		m[int32(b)] = true
	}
	for i := range multiTokens {
		m[int32(256+i)] = true
	}
	return m
}()

// walk generates one output by a random walk over bv's tokens, masked by the
// grammar: it returns the text and whether it ended properly (EOG taken
// where allowed, or Finished) before the cap.
func walk(rng *rand.Rand, g *grammar.Grammar, bv *byteVocab, maxBytes int) (string, bool) {
	m := g.NewMatcher(bv.v)
	mask := make([]uint64, (bv.v.Size()+63)/64)
	var out []byte
	var allowed, preferred []int32
	for len(out) < maxBytes {
		if m.Finished() {
			return string(out), true
		}
		if m.Complete() && rng.IntN(4) == 0 {
			if !m.Allows(bv.eog) {
				panic("Complete but EOG not allowed")
			}
			return string(out), true
		}
		clear(mask)
		m.FillMask(mask)
		allowed, preferred = allowed[:0], preferred[:0]
		for id := range int32(bv.v.Size()) {
			if mask[id/64]&(1<<(id%64)) == 0 || id == bv.eog {
				continue
			}
			allowed = append(allowed, id)
			if structural[id] {
				preferred = append(preferred, id)
			}
		}
		if len(allowed) == 0 {
			if m.Complete() {
				return string(out), true
			}
			panic(fmt.Sprintf("no token allowed and the text is not complete: %q", out))
		}
		pool := allowed
		if len(preferred) > 0 && rng.IntN(2) == 0 {
			pool = preferred
		}
		id := pool[rng.IntN(len(pool))]
		if err := m.Accept(id); err != nil {
			panic(err)
		}
		out = append(out, bv.pieces[id]...)
	}
	return string(out), false
}

// TestGeneratedOutputsValidate is the schema-coverage acceptance check:
// random walks over a byte-level vocabulary, masked by each corpus schema's
// grammar, produce at least 1,000 outputs; every one must be valid UTF-8
// JSON that the validator accepts against the original schema.
func TestGeneratedOutputsValidate(t *testing.T) {
	corpus := loadCorpus(t)
	bv := newByteVocab()
	rng := rand.New(rand.NewPCG(20, 3))
	perSchema := (1000 + len(corpus) - 1) / len(corpus)
	if testing.Short() {
		perSchema = 10
	}
	total, invalid, restarts := 0, 0, 0
	for _, e := range corpus {
		got := 0
		for tries := 0; got < perSchema; tries++ {
			if tries > perSchema*50 {
				t.Fatalf("%s: only %d of %d walks ended within the cap", e.name, got, tries)
			}
			text, ok := walk(rng, e.g, bv, 2000)
			if !ok {
				restarts++
				continue
			}
			got++
			if !utf8.ValidString(text) {
				invalid++
				t.Errorf("%s: output is not UTF-8: %q", e.name, text)
				continue
			}
			if err := e.validate(text); err != nil {
				invalid++
				t.Errorf("%s: output %q is invalid: %v", e.name, text, err)
			}
		}
		total += got
	}
	t.Logf("%d outputs over %d schemas, %d invalid, %d walks restarted at the cap", total, len(corpus), invalid, restarts)
	if !testing.Short() && total < 1000 {
		t.Errorf("only %d outputs; want at least 1000", total)
	}
}

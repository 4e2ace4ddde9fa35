package sample_test

import (
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/baton-serving/baton/engine/grammar"
	"github.com/baton-serving/baton/engine/jsonschema"
	"github.com/baton-serving/baton/engine/sample"
	"github.com/baton-serving/baton/engine/testmodel"
)

// benchVocab is the 110M shape's 32000-token vocabulary as grammar bytes.
func benchVocab(b *testing.B) *grammar.Vocab {
	b.Helper()
	tokens, _, _ := testmodel.Vocabulary(32000, 1)
	pieces := make([][]byte, len(tokens))
	for i, tok := range tokens {
		switch {
		case i < 3: // <unk>, <s>, </s>
		case strings.HasPrefix(tok, "<0x") && len(tok) == 6:
			v, _ := strconv.ParseUint(tok[3:5], 16, 8)
			pieces[i] = []byte{byte(v)}
		default:
			pieces[i] = []byte(strings.ReplaceAll(tok, "▁", " "))
		}
	}
	return grammar.NewVocab(pieces, []int32{2})
}

// BenchmarkSample measures one token's sampling on a 32000-entry
// vocabulary, greedy and at temperature 1, without and with the schema of
// docs/benchmarks/constrained-schema.json: the mask's cost per token, to
// set beside a forward pass's.
func BenchmarkSample(b *testing.B) {
	schema, err := os.ReadFile("../../docs/benchmarks/constrained-schema.json")
	if err != nil {
		b.Fatal(err)
	}
	src, err := jsonschema.ToGrammar(schema)
	if err != nil {
		b.Fatal(err)
	}
	g, err := grammar.Parse(src)
	if err != nil {
		b.Fatal(err)
	}
	v := benchVocab(b)
	rng := rand.New(rand.NewPCG(1, 2))
	logits := make([][]float32, 16)
	for i := range logits {
		logits[i] = make([]float32, 32000)
		for j := range logits[i] {
			logits[i][j] = float32(rng.NormFloat64() * 3)
		}
	}
	for _, temp := range []float32{0, 1} {
		for _, constrained := range []bool{false, true} {
			name := "T=" + strconv.FormatFloat(float64(temp), 'g', -1, 32)
			if constrained {
				name += "/schema"
			}
			b.Run(name, func(b *testing.B) {
				p := sample.Defaults()
				p.Temperature = temp
				var s *sample.Sampler
				n := 0
				restart := func() {
					s, _ = sample.New(p)
					if constrained {
						s.Constrain(g.NewMatcher(v), []int32{2}, true)
					}
					n = 0
				}
				restart()
				for i := 0; b.Loop(); i++ {
					tok, err := s.Sample(logits[i%len(logits)])
					if err != nil {
						b.Fatal(err)
					}
					if n++; n == 256 || s.Ends(tok.ID) {
						restart()
					}
				}
			})
		}
	}
}

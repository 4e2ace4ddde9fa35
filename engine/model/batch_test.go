package model

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/baton-serving/baton/engine"
	"github.com/baton-serving/baton/engine/kvcache"
	"github.com/baton-serving/baton/kernels/quant"
)

// refLogits returns, for every prefix length L = 1…len(tokens), the logits
// after tokens[:L], fed one token at a time through Forward on a contiguous
// cache: the single-sequence reference.
func refLogits(t *testing.T, m Model, tokens []int32) [][]float32 {
	t.Helper()
	cache, err := NewContiguousCache(m.Config(), len(tokens))
	if err != nil {
		t.Fatal(err)
	}
	out := make([][]float32, len(tokens)+1)
	for i, id := range tokens {
		out[i+1] = make([]float32, m.Config().Vocab)
		if err := m.Forward([]int32{id}, i, cache, out[i+1]); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

type batchSeq struct {
	tokens []int32
	done   int // positions computed
	start  int // step at which the sequence joins
	table  *kvcache.BlockTable
}

// TestForwardBatchMatchesForward runs several sequences through randomly
// composed batched steps — prompt chunks of random sizes next to single
// decode tokens at other positions, sequences joining late — and checks
// every requested logit vector bit for bit against the sequence run alone.
func TestForwardBatchMatchesForward(t *testing.T) {
	f := writeModel(t, tinySpec())
	// Pages of 3 positions put four consecutive keys on two pages, which
	// attention then scores from scratch space rather than in place.
	for _, tc := range []struct{ threads, pageSize int }{{1, 4}, {3, 4}, {3, 3}} {
		threads := tc.threads
		t.Run(fmt.Sprint("threads", threads, "/page", tc.pageSize), func(t *testing.T) {
			m := load(t, f, Options{Threads: threads})
			cfg := m.Config()
			rng := rand.New(rand.NewPCG(7, uint64(threads)))
			pool, err := kvcache.New(cfg.KVLayout(tc.pageSize, quant.F32), 96)
			if err != nil {
				t.Fatal(err)
			}
			var seqs []*batchSeq
			var refs [][][]float32
			for i := range 6 {
				n := 5 + rng.IntN(30)
				toks := make([]int32, n)
				for j := range toks {
					toks[j] = int32(rng.IntN(cfg.Vocab))
				}
				seqs = append(seqs, &batchSeq{tokens: toks, start: rng.IntN(4) * i / 2, table: pool.NewTable()})
				refs = append(refs, refLogits(t, m, toks))
			}
			checked := 0
			for step := 0; ; step++ {
				var batch []Chunk
				var who []int
				for i, sq := range seqs {
					if step < sq.start || sq.done == len(sq.tokens) || rng.IntN(4) == 0 {
						continue
					}
					n := 1
					if sq.done < 10 { // still "prefilling": a chunk
						n = min(1+rng.IntN(8), len(sq.tokens)-sq.done)
					}
					if err := sq.table.Grow(sq.done + n); err != nil {
						t.Fatal(err)
					}
					ch := Chunk{Tokens: sq.tokens[sq.done : sq.done+n], Pos: sq.done, Pages: sq.table.Pages()}
					if rng.IntN(3) > 0 {
						ch.Logits = make([]float32, cfg.Vocab)
					}
					batch = append(batch, ch)
					who = append(who, i)
				}
				if len(batch) == 0 {
					if slices.IndexFunc(seqs, func(s *batchSeq) bool { return s.done < len(s.tokens) }) < 0 {
						break
					}
					continue
				}
				if err := m.ForwardBatch(pool, batch); err != nil {
					t.Fatal(err)
				}
				for k, ch := range batch {
					sq := seqs[who[k]]
					sq.done += len(ch.Tokens)
					if ch.Logits == nil {
						continue
					}
					if !slices.Equal(ch.Logits, refs[who[k]][sq.done]) {
						t.Fatalf("step %d: sequence %d after %d tokens (batch of %d chunks): logits differ from the sequence run alone",
							step, who[k], sq.done, len(batch))
					}
					checked++
				}
			}
			if checked < 20 {
				t.Fatalf("only %d logit vectors checked", checked)
			}
			for _, sq := range seqs {
				if err := sq.table.Release(); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// TestForwardBatchF16 checks that an F16 cache stays close to F32 (it rounds
// the stored keys and values to about 3 decimal digits) and that its results
// do not depend on the batch either.
func TestForwardBatchF16(t *testing.T) {
	m := load(t, writeModel(t, tinySpec()), Options{Threads: 2})
	cfg := m.Config()
	prompt := []int32{1, 300, 301, 302, 450, 12, 77, 260, 5, 9, 30}
	run := func(dtype quant.Type, other bool) []float32 {
		pool, err := kvcache.New(cfg.KVLayout(4, dtype), 16)
		if err != nil {
			t.Fatal(err)
		}
		a, b := pool.NewTable(), pool.NewTable()
		if err := a.Grow(len(prompt)); err != nil {
			t.Fatal(err)
		}
		logits := make([]float32, cfg.Vocab)
		batch := []Chunk{{Tokens: prompt, Pages: a.Pages(), Logits: logits}}
		if other {
			if err := b.Grow(3); err != nil {
				t.Fatal(err)
			}
			batch = append([]Chunk{{Tokens: []int32{4, 5, 6}, Pages: b.Pages(), Logits: make([]float32, cfg.Vocab)}}, batch...)
		}
		if err := m.ForwardBatch(pool, batch); err != nil {
			t.Fatal(err)
		}
		return logits
	}
	f32, f16 := run(quant.F32, false), run(quant.F16, false)
	if slices.Equal(f32, f16) {
		t.Error("F16 and F32 caches gave identical logits: is the F16 path used?")
	}
	if e := relLogitErr(f32, f16); e > 1e-2 {
		t.Errorf("F16 cache: max logit error %.2g of the logits' spread, want ≤ 1e-2", e)
	}
	if !slices.Equal(f16, run(quant.F16, true)) {
		t.Error("F16 logits depend on the other sequence in the batch")
	}
}

func TestForwardBatchErrors(t *testing.T) {
	m := load(t, writeModel(t, tinySpec()), Options{Threads: 2})
	cfg := m.Config()
	pool, err := kvcache.New(cfg.KVLayout(4, quant.F32), 4)
	if err != nil {
		t.Fatal(err)
	}
	other := cfg
	other.Layers++
	wrong, err := kvcache.New(other.KVLayout(4, quant.F32), 4)
	if err != nil {
		t.Fatal(err)
	}
	pages := []kvcache.PageID{0, 1}
	tests := []struct {
		name  string
		pool  *kvcache.Pool
		batch []Chunk
		want  error
	}{
		{"nil pool", nil, []Chunk{{Tokens: []int32{1}, Pages: pages}}, engine.ErrInvalidInput},
		{"empty batch", pool, nil, engine.ErrInvalidInput},
		{"layout", wrong, []Chunk{{Tokens: []int32{1}, Pages: pages}}, engine.ErrInvalidInput},
		{"no tokens", pool, []Chunk{{Pages: pages}}, engine.ErrInvalidInput},
		{"negative position", pool, []Chunk{{Tokens: []int32{1}, Pos: -1, Pages: pages}}, engine.ErrInvalidInput},
		{"logits length", pool, []Chunk{{Tokens: []int32{1}, Pages: pages, Logits: make([]float32, 3)}}, engine.ErrInvalidInput},
		{"context", pool, []Chunk{{Tokens: []int32{1, 2}, Pos: cfg.ContextLength - 1, Pages: pages}}, engine.ErrContextOverflow},
		{"pages too few", pool, []Chunk{{Tokens: []int32{1}, Pos: 8, Pages: pages}}, engine.ErrInvalidInput},
		{"page out of range", pool, []Chunk{{Tokens: []int32{1}, Pages: []kvcache.PageID{4}}}, engine.ErrInvalidInput},
		{"token", pool, []Chunk{{Tokens: []int32{int32(cfg.Vocab)}, Pages: pages}}, engine.ErrInvalidInput},
	}
	for _, tc := range tests {
		if err := m.ForwardBatch(tc.pool, tc.batch); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if err := m.ForwardBatch(pool, []Chunk{{Tokens: []int32{1}, Pages: pages}}); !errors.Is(err, ErrClosed) {
		t.Errorf("after Close: %v", err)
	}
}

package model

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/baton-serving/baton/engine/kvcache"
	"github.com/baton-serving/baton/kernels/quant"
)

// TestForwardBatchRowLogits computes a prompt in chunks — one longer than
// headGroupRows, so that the output head runs it in several groups — with
// Chunk.RowLogits, next to other sequences that want only their last
// row's logits (or none), and checks every row's logits bit for bit
// against the prompt fed one token at a time through Forward; the chunk's
// Logits, set too, must hold its last row's; the other sequences' logits
// must be those they get without the echo chunk beside them.
func TestForwardBatchRowLogits(t *testing.T) {
	f := writeModel(t, tinySpec())
	for _, threads := range []int{1, 3} {
		t.Run(fmt.Sprint("threads", threads), func(t *testing.T) {
			m := load(t, f, Options{Threads: threads})
			cfg := m.Config()
			rng := rand.New(rand.NewPCG(11, uint64(threads)))
			prompt := make([]int32, 2*headGroupRows+headGroupRows/2+3)
			for i := range prompt {
				prompt[i] = int32(rng.IntN(cfg.Vocab))
			}
			ref := refLogits(t, m, prompt)
			other := []int32{5, 9, 300, 12, 44, 2, 7}
			otherRef := refLogits(t, m, other)

			pool, err := kvcache.New(cfg.KVLayout(4, quant.F32), 64)
			if err != nil {
				t.Fatal(err)
			}
			echo, side := pool.NewTable(), pool.NewTable()
			defer func() {
				for _, tb := range []*kvcache.BlockTable{echo, side} {
					if err := tb.Release(); err != nil {
						t.Error(err)
					}
				}
			}()
			// Chunks: 1 token, then more than a group, then the rest in two.
			sizes := []int{1, headGroupRows + 7, 20}
			sizes = append(sizes, len(prompt)-1-(headGroupRows+7)-20) // the prompt exactly
			done, sideDone := 0, 0
			seen := 0
			for step, n := range sizes {
				if err := echo.Grow(done + n); err != nil {
					t.Fatal(err)
				}
				pos := done
				last := make([]float32, cfg.Vocab)
				want := pos // the next row the callback must report
				ch := Chunk{Tokens: prompt[pos : pos+n], Pos: pos, Pages: echo.Pages(), Logits: last,
					RowLogits: func(i int, lg []float32) {
						if pos+i != want {
							t.Fatalf("step %d: row %d reported, want row %d (in order)", step, pos+i, want-pos)
						}
						want++
						if len(lg) != cfg.Vocab {
							t.Fatalf("step %d: row %d: %d logits, want %d", step, i, len(lg), cfg.Vocab)
						}
						if !slices.Equal(lg, ref[pos+i+1]) {
							t.Fatalf("step %d: position %d: logits differ from Forward one token at a time", step, pos+i)
						}
						seen++
					}}
				batch := []Chunk{ch}
				var sideLogits []float32
				if sideDone < len(other) {
					k := min(1+step, len(other)-sideDone)
					if err := side.Grow(sideDone + k); err != nil {
						t.Fatal(err)
					}
					sideLogits = make([]float32, cfg.Vocab)
					sc := Chunk{Tokens: other[sideDone : sideDone+k], Pos: sideDone, Pages: side.Pages(), Logits: sideLogits}
					if step%2 == 1 {
						batch = append([]Chunk{sc}, batch...)
					} else {
						batch = append(batch, sc)
					}
					sideDone += k
				}
				if err := m.ForwardBatch(pool, batch); err != nil {
					t.Fatal(err)
				}
				if want != pos+n {
					t.Fatalf("step %d: %d rows reported, want %d", step, want-pos, n)
				}
				if !slices.Equal(last, ref[pos+n]) {
					t.Fatalf("step %d: Logits is not the last row's", step)
				}
				if sideLogits != nil && !slices.Equal(sideLogits, otherRef[sideDone]) {
					t.Fatalf("step %d: the other sequence's logits changed beside a RowLogits chunk", step)
				}
				done += n
			}
			if seen != len(prompt) {
				t.Fatalf("%d rows checked, want %d", seen, len(prompt))
			}
		})
	}
}

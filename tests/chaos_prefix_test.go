//go:build e2e && chaos

package tests

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// streamIDs runs a Generate stream to its end and returns its token ids.
func streamIDs(ctx context.Context, client batonv1.RouterServiceClient, req *batonv1.GenerateRequest) ([]uint32, error) {
	s, err := client.Generate(ctx, req)
	if err != nil {
		return nil, err
	}
	var ids []uint32
	for {
		resp, err := s.Recv()
		if errors.Is(err, io.EOF) {
			return ids, nil
		}
		if err != nil {
			return ids, err
		}
		ids = append(ids, resp.GetEvent().GetTokenIds()...)
	}
}

// chaosEvictUnderTransfers: multi-turn conversations through PD on a
// decode worker whose pool holds a few requests' pages, so that its prefix
// cache evicts all the time while transfers write into reserved pages and
// hold the cached prefix pages their handshakes named; a quarter of the
// requests are cancelled at random moments. A page evicted while a
// request held it, or written while shared, would change some completed
// request's greedy output from its reference; nothing may hang or leak
// (settle: no page used but the evictable cache, the auditor clean).
func chaosEvictUnderTransfers(t *testing.T, row *chaosRow) {
	// About 100 pages of 16 tokens on the reference model: three of the
	// longest prompts.
	f := startChaosFleet(t, chaosSpec{prefills: 1, decodes: 1, decode: []string{"--kv-cache-bytes", "1MiB"}})
	client := f.client(t)

	// 12 conversations of 8 turns in 4 groups sharing a 96-token system
	// prompt; each turn adds 24 tokens.
	rng := rand.New(rand.NewPCG(21, 8))
	tokens := func(n int) []uint32 {
		ids := make([]uint32, n)
		for i := range ids {
			ids[i] = uint32(3 + rng.IntN(500))
		}
		return ids
	}
	systems := [][]uint32{tokens(96), tokens(96), tokens(96), tokens(96)}
	var prompts [][]uint32
	for c := range 12 {
		conv := slices.Clone(systems[c%4])
		for range 8 {
			conv = append(conv, tokens(24)...)
			prompts = append(prompts, slices.Clone(conv))
		}
	}
	req := func(id string, p []uint32) *batonv1.GenerateRequest {
		return &batonv1.GenerateRequest{RequestId: id, PromptTokenIds: p, Sampling: &batonv1.SamplingParams{
			Temperature: proto.Float32(0), MaxNewTokens: 16, IgnoreEos: true}}
	}

	// References, one request at a time.
	want := make([][]uint32, len(prompts))
	var took []time.Duration
	for i, p := range prompts {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		start := time.Now()
		ids, err := streamIDs(ctx, client, req(fmt.Sprintf("ref-%d", i), p))
		cancel()
		if err != nil || len(ids) != 16 {
			t.Fatalf("reference %d: %d tokens, %v", i, len(ids), err)
		}
		want[i], took = ids, append(took, time.Since(start))
	}
	life := percentile(took, 0.5)
	before, err := chaosMetrics(f.decodes[0].http)
	if err != nil {
		t.Fatal(err)
	}

	tr := startReleaseTracker(f.all()...)
	var out outcomes
	var mismatched atomic.Int32
	sem := make(chan struct{}, 16)
	var wg sync.WaitGroup
	for i := range 600 {
		k := rng.IntN(len(prompts))
		cancelAfter := time.Duration(-1)
		if i%4 == 0 {
			cancelAfter = time.Duration(rng.Int64N(int64(8 * life)))
		}
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			hard, stop := context.WithTimeout(context.Background(), 30*time.Second)
			defer stop()
			ctx, cancel := context.WithCancel(hard)
			defer cancel()
			var cancelledAt atomic.Int64
			if cancelAfter >= 0 {
				timer := time.AfterFunc(cancelAfter, func() { cancelledAt.Store(time.Now().UnixNano()); cancel() })
				defer timer.Stop()
			}
			id := fmt.Sprintf("evict-%d", i)
			ids, err := streamIDs(ctx, client, req(id, prompts[k]))
			out.add(err, hard.Err() != nil)
			switch {
			case err == nil:
				if !slices.Equal(ids, want[k]) {
					mismatched.Add(1)
					t.Errorf("%s (prompt %d): %v, alone %v", id, k, ids, want[k])
				}
			case cancelledAt.Load() != 0 && status.Code(err) == codes.Canceled:
				tr.aborted(id, time.Unix(0, cancelledAt.Load()))
			default:
				tr.aborted(id, time.Now())
			}
		}()
	}
	wg.Wait()
	defer tr.logLate(t)
	released, held := tr.finish(releaseBound + time.Second)
	out.fill(row)
	row.release = released
	t.Logf("outcomes: %s; %d outputs differed from their reference", &out, mismatched.Load())
	if len(held) > 0 {
		t.Errorf("%d aborted requests still held after the storm: %v", len(held), held[:min(10, len(held))])
	}
	if out.errors > 0 || out.ok < 300 {
		t.Errorf("want ≥ 300 completed and no errors but cancels: %s", &out)
	}
	after, err := chaosMetrics(f.decodes[0].http)
	if err != nil {
		t.Fatal(err)
	}
	evicted := after["baton_prefix_cache_evictions_total"] - before["baton_prefix_cache_evictions_total"]
	t.Logf("decode: %v pages evicted during the storm, %v KV bytes received, cache hit rate %v", evicted,
		after["baton:kv_transfer_bytes_total"]-before["baton:kv_transfer_bytes_total"], after["baton:cache_hit_rate"])
	if evicted == 0 {
		t.Error("decode's cache evicted nothing: the pool was not under pressure")
	}
	if after["baton:cache_hit_rate"] == 0 {
		t.Error("decode held no cached page for any transfer")
	}
	row.diagnose = "healthy after"
	row.leaks = f.settle(t)
	f.diagnoseHealthy(t)
}

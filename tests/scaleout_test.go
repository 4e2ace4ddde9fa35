//go:build e2e

package tests

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// scaleOutFlags are the fleet tests' flags: small KV caches, and a canary
// quick enough that a restarted worker is probed and back within seconds.
var scaleOutFlags = map[string][]string{
	"prefill": {"--kv-cache-bytes", "64MiB"},
	"decode":  {"--kv-cache-bytes", "64MiB"},
	"router":  {"--canary-interval", "1s", "--canary-timeout", "3s"},
}

// TestScaleOutSpread: with 2 prefill and 2 decode workers behind one
// router, requests spread over all four workers (their own counters say
// so), every output is llama.cpp's, every (prefill, decode) pair produces
// the golden output, and afterwards every gauge reads 0.
func TestScaleOutSpread(t *testing.T) {
	g := loadGolden(t)
	f := startFleet(t, 2, 2, scaleOutFlags)
	client := f.client(t)
	before := map[*node]float64{}
	for _, n := range f.workers() {
		before[n] = finished(t, n)
	}
	const requests, concurrency = 24, 4
	var wg sync.WaitGroup
	errs := make(chan error, requests)
	sem := make(chan struct{}, concurrency)
	for i := range requests {
		gen := g.Generations[i%len(g.Generations)]
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			resp, err := complete(ctx, client, greedy(gen.Prompt, uint32(len(gen.GeneratedIDs))))
			switch {
			case err != nil:
				errs <- fmt.Errorf("request %d: %v", i, err)
			case !slices.Equal(resp.GetTokenIds(), u32s(gen.GeneratedIDs)):
				errs <- fmt.Errorf("request %d (%q): tokens %v, want %v", i, gen.Prompt, resp.GetTokenIds(), gen.GeneratedIDs)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	spread := map[string]float64{}
	for _, n := range f.workers() {
		d := finished(t, n) - before[n]
		spread[n.name+" "+n.grpc] = d
		if d == 0 {
			t.Errorf("%s %s served none of %d requests", n.name, n.grpc, requests)
		}
	}
	t.Logf("requests finished per worker: %v", spread)
	v := f.view(t)
	for _, w := range append(v.Prefill.Workers, v.Decode.Workers...) {
		if w.RoutedTotal == 0 || !w.Routable {
			t.Errorf("/debug/workers: %+v", w)
		}
		// The workers run with the default --device auto: on this
		// default build (no cuda tag) that is the CPU, and the router
		// shows it.
		if !strings.HasPrefix(w.Device, "cpu (") {
			t.Errorf("/debug/workers: %s's device = %q, want cpu (…)", w.Address, w.Device)
		}
	}

	// Every pair, asked directly, is golden: decode pulls the prompt's KV
	// cache from the prefill worker it is told to use.
	for _, d := range f.decodes {
		dc := batonv1.NewDecodeServiceClient(dial(t, d.grpc))
		for _, p := range f.prefills {
			for gi, gen := range g.Generations[:min(3, len(g.Generations))] {
				ids, err := pairGenerate(t, dc, p.grpc, fmt.Sprintf("pair-%s-%s-%d", p.grpc, d.grpc, gi), gen.PromptIDs, len(gen.GeneratedIDs))
				if err != nil {
					t.Errorf("prefill %s -> decode %s: %v", p.grpc, d.grpc, err)
				} else if !slices.Equal(ids, u32s(gen.GeneratedIDs)) {
					t.Errorf("prefill %s -> decode %s, %q: tokens %v, want %v", p.grpc, d.grpc, gen.Prompt, ids, gen.GeneratedIDs)
				}
			}
		}
	}
	f.waitIdle(t, f.workers(), 2*time.Second)
}

// pairGenerate runs one greedy request on decode worker dc with its KV
// cache from prefill worker prefill, as the router would route it.
func pairGenerate(t *testing.T, dc batonv1.DecodeServiceClient, prefill, id string, prompt []int32, n int) ([]uint32, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream, err := dc.Generate(ctx, &batonv1.DecodeServiceGenerateRequest{PrefillEndpoint: prefill,
		Request: &batonv1.GenerateRequest{RequestId: strings.NewReplacer(":", "-", ".", "-").Replace(id), PromptTokenIds: u32s(prompt),
			Sampling: &batonv1.SamplingParams{Temperature: proto.Float32(0), Seed: proto.Uint64(1), MaxNewTokens: uint32(n)}}})
	if err != nil {
		return nil, err
	}
	return tokenIDs(stream.Recv)
}

// outcome is one request of a load run.
type outcome struct {
	start, end time.Time
	tokens     int
	err        error
}

// TestScaleOutKillDecode: kill -9 of one of two decode workers under load.
// Its in-flight requests fail fast with UNAVAILABLE naming it (those that
// had no token yet are retried on the other pair), nothing hangs, new
// requests go to the survivor, every gauge on the survivors returns to 0,
// and the worker, restarted on its ports, rejoins after its canary passes
// and gets traffic again.
func TestScaleOutKillDecode(t *testing.T) {
	g := loadGolden(t)
	f := startFleet(t, 2, 2, scaleOutFlags)
	client := f.client(t)
	victim, survivor := f.decodes[0], f.decodes[1]

	const clients = 6
	var mu sync.Mutex
	var outs []outcome
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := range clients {
		wg.Go(func() {
			for j := 0; ; j++ {
				select {
				case <-stop:
					return
				default:
				}
				gen := g.Generations[(i+j)%len(g.Generations)]
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				o := outcome{start: time.Now()}
				ids, err := generate(ctx, client, greedy(gen.Prompt, 300))
				cancel()
				o.end, o.tokens, o.err = time.Now(), len(ids), err
				mu.Lock()
				outs = append(outs, o)
				mu.Unlock()
			}
		})
	}
	time.Sleep(1500 * time.Millisecond)
	survivorBefore := finished(t, survivor)
	killAt := f.kill9(t, victim)

	// The router stops routing to it at once.
	deadline := time.Now().Add(2 * time.Second)
	for {
		if w, ok := f.view(t).worker(victim.grpc); ok && !w.Routable && !w.Ready {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the killed decode is still routable 2s after the kill: %+v", f.view(t).Decode.Workers)
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(2 * time.Second)
	close(stop)
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(40 * time.Second):
		t.Fatal("load clients still running 40s after the load stopped: a request hangs")
	}

	var failed, after, okAfter int
	var slowest time.Duration
	codesSeen := map[codes.Code]int{}
	for _, o := range outs {
		codesSeen[status.Code(o.err)]++
		if o.start.After(killAt) {
			after++
		}
		if o.err == nil {
			if o.start.After(killAt) {
				okAfter++
			}
			continue
		}
		if failed++; failed == 1 {
			t.Logf("a request on the killed worker: %v", o.err)
		}
		// A request that failed was on the killed worker when it died: it
		// says so, and soon.
		if status.Code(o.err) != codes.Unavailable || !strings.Contains(o.err.Error(), victim.grpc) {
			t.Errorf("failed request: %v; want UNAVAILABLE naming %s", o.err, victim.grpc)
		}
		if o.start.After(killAt) {
			t.Errorf("a request started %v after the kill failed: %v", o.start.Sub(killAt).Round(time.Millisecond), o.err)
		}
		if took := o.end.Sub(killAt); took > slowest {
			slowest = took
		}
	}
	t.Logf("%d requests (%d after the kill): outcomes %v; the last failure ended %v after the kill",
		len(outs), after, codesSeen, slowest.Round(time.Millisecond))
	if slowest > 3*time.Second {
		t.Errorf("a request on the killed worker took %v after the kill to fail, want fast", slowest)
	}
	if after == 0 || okAfter != after {
		t.Errorf("%d of %d requests started after the kill succeeded", okAfter, after)
	}
	if got := finished(t, survivor); got <= survivorBefore {
		t.Errorf("the surviving decode finished no request after the kill (%v before, %v now)", survivorBefore, got)
	}
	took := f.waitIdle(t, []*node{f.prefills[0], f.prefills[1], survivor}, 3*time.Second)
	t.Logf("survivors idle %v after the load", took.Round(time.Millisecond))

	// Restarted on its ports, it rejoins once its canary passes and takes
	// requests again.
	f.restart(t, victim)
	for i := range 8 {
		gen := g.Generations[i%len(g.Generations)]
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		resp, err := complete(ctx, client, greedy(gen.Prompt, uint32(len(gen.GeneratedIDs))))
		cancel()
		if err != nil {
			t.Fatalf("after the restart: %v", err)
		}
		if !slices.Equal(resp.GetTokenIds(), u32s(gen.GeneratedIDs)) {
			t.Errorf("after the restart, %q: tokens %v, want %v", gen.Prompt, resp.GetTokenIds(), gen.GeneratedIDs)
		}
	}
	if n := finished(t, victim); n == 0 {
		t.Error("the restarted decode got none of 8 requests")
	} else {
		t.Logf("the restarted decode served %v of 8 requests", n)
	}
	f.waitIdle(t, f.workers(), 2*time.Second)
}

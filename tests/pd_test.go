//go:build e2e

package tests

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
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

var workerFlags = map[string][]string{
	"prefill": {"--kv-cache-bytes", "64MiB"},
	"decode":  {"--kv-cache-bytes", "64MiB"},
}

func u32s(ids []int32) []uint32 {
	out := make([]uint32, len(ids))
	for i, id := range ids {
		out[i] = uint32(id)
	}
	return out
}

func httpGet(t testing.TB, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

func greedy(prompt string, n uint32) *batonv1.GenerateRequest {
	return &batonv1.GenerateRequest{Prompt: prompt, Sampling: &batonv1.SamplingParams{
		Temperature: proto.Float32(0), MaxNewTokens: n}}
}

// TestPDGolden: greedy generations through the router's gRPC API, with the
// KV cache computed by prefill and streamed to decode, equal llama.cpp's.
func TestPDGolden(t *testing.T) {
	g := loadGolden(t)
	c := startCluster(t, workerFlags)
	client := c.client(t, c.router)
	for _, gen := range g.Generations {
		t.Run(fmt.Sprintf("%q", gen.Prompt), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			resp, err := complete(ctx, client, greedy(gen.Prompt, uint32(len(gen.GeneratedIDs))))
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(resp.GetPromptTokenIds(), u32s(gen.PromptIDs)) {
				t.Errorf("prompt ids %v, want %v", resp.GetPromptTokenIds(), gen.PromptIDs)
			}
			if !slices.Equal(resp.GetTokenIds(), u32s(gen.GeneratedIDs)) {
				t.Errorf("generated ids %v\nwant %v", resp.GetTokenIds(), gen.GeneratedIDs)
			}
			if resp.GetFinishReason() != batonv1.FinishReason_FINISH_REASON_LENGTH || resp.GetUsage().GetCompletionTokens() != uint32(len(gen.GeneratedIDs)) {
				t.Errorf("finish %v usage %v", resp.GetFinishReason(), resp.GetUsage())
			}
		})
	}
	c.waitIdle(t, 2*time.Second)
}

// TestPDEqualsColocated: with seeded sampling, a request whose prompt is
// computed by prefill and decoded elsewhere produces exactly the tokens of
// the same request computed and decoded in one process.
func TestPDEqualsColocated(t *testing.T) {
	c := startCluster(t, workerFlags)
	pd, colo := c.client(t, c.router), c.client(t, c.colocated)
	subjects := []string{"Once upon a time", "The cat", "Lily and Tom went to the park", "One day, a little boy named Tim",
		"The sun was", "A big dog", "Sam had a red ball", "There was a tree", "The bird sang", "Mom said",
		"It was a rainy day", "Ben and Mia", "The little fish", "In the garden", "The king", "A girl named Sue",
		"The car was fast", "Tom found a box", "The moon", "They ate cake"}
	for i, prompt := range subjects {
		req := &batonv1.GenerateRequest{Prompt: prompt, Sampling: &batonv1.SamplingParams{
			Temperature: proto.Float32(0.8), TopP: proto.Float32(0.9), Seed: proto.Uint64(uint64(1000 + i)), MaxNewTokens: 48}}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		a, err := complete(ctx, pd, req)
		if err != nil {
			t.Fatalf("PD %q: %v", prompt, err)
		}
		b, err := complete(ctx, colo, req)
		cancel()
		if err != nil {
			t.Fatalf("colocated %q: %v", prompt, err)
		}
		if !slices.Equal(a.GetTokenIds(), b.GetTokenIds()) {
			t.Errorf("%q: PD %v\ncolocated %v", prompt, a.GetTokenIds(), b.GetTokenIds())
		}
	}
	c.waitIdle(t, 2*time.Second)
}

// TestPDConcurrent: 32 requests at once all return their golden output, and
// afterwards every queue gauge on every service reads 0 and no page leaked.
func TestPDConcurrent(t *testing.T) {
	g := loadGolden(t)
	c := startCluster(t, workerFlags)
	client := c.client(t, c.router)
	var wg sync.WaitGroup
	errs := make(chan error, 32)
	for i := range 32 {
		gen := g.Generations[i%len(g.Generations)]
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			resp, err := complete(ctx, client, greedy(gen.Prompt, uint32(len(gen.GeneratedIDs))))
			switch {
			case err != nil:
				errs <- fmt.Errorf("request %d: %v", i, err)
			case !slices.Equal(resp.GetTokenIds(), u32s(gen.GeneratedIDs)):
				errs <- fmt.Errorf("request %d (%q): wrong tokens %v", i, gen.Prompt, resp.GetTokenIds())
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	c.waitIdle(t, 2*time.Second)
}

// TestPDCancellation cancels 200 requests at random moments — before the
// handshake, in the queues, mid-transfer, mid-decode — and checks that within
// 2 s every gauge is back to 0, no page leaked, the services' goroutines are
// back to their idle count, and a following request is still correct.
func TestPDCancellation(t *testing.T) {
	g := loadGolden(t)
	c := startCluster(t, workerFlags)
	client := c.client(t, c.router)
	// Warm up, then take the idle goroutine counts.
	if _, err := complete(context.Background(), client, greedy("Once upon a time", 8)); err != nil {
		t.Fatal(err)
	}
	c.waitIdle(t, 2*time.Second)
	idle := map[string]float64{}
	for _, n := range c.all() {
		idle[n.http] = metrics(t, n.http)["go_goroutines"]
	}

	rng := rand.New(rand.NewPCG(1, 2))
	var wg sync.WaitGroup
	var mu sync.Mutex
	outcomes := map[codes.Code]int{}
	sem := make(chan struct{}, 16)
	for i := range 200 {
		gen := g.Generations[i%len(g.Generations)]
		delay := time.Duration(rng.IntN(30000)) * time.Microsecond
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			ctx, cancel := context.WithCancel(context.Background())
			time.AfterFunc(delay, cancel)
			stream, err := client.Generate(ctx, greedy(gen.Prompt, 64))
			for err == nil {
				_, err = stream.Recv()
			}
			cancel()
			mu.Lock()
			outcomes[status.Code(err)]++
			mu.Unlock()
		}()
	}
	wg.Wait()
	took := c.waitIdle(t, 2*time.Second)
	t.Logf("200 requests cancelled at random moments: outcomes %v; idle %v after the last", outcomes, took)
	for code := range outcomes {
		if code != codes.Canceled && code != codes.Unknown && code != codes.OK {
			t.Errorf("unexpected outcome %v (%d times)", code, outcomes[code])
		}
	}
	deadline := time.Now().Add(2 * time.Second)
	for _, n := range c.all() {
		for {
			now := metrics(t, n.http)["go_goroutines"]
			if now <= idle[n.http]+2 {
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("%s %s: %v goroutines, %v when idle", n.name, n.http, now, idle[n.http])
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	gen := g.Generations[0]
	resp, err := complete(context.Background(), client, greedy(gen.Prompt, uint32(len(gen.GeneratedIDs))))
	if err != nil || !slices.Equal(resp.GetTokenIds(), u32s(gen.GeneratedIDs)) {
		t.Errorf("after the storm: %v, %v", resp.GetTokenIds(), err)
	}
}

// TestRequestErrors: invalid requests are refused with the right code and a
// message naming the field; a duplicate in-flight id is ALREADY_EXISTS.
func TestRequestErrors(t *testing.T) {
	c := startCluster(t, workerFlags)
	client := c.client(t, c.router)
	cases := []struct {
		req  *batonv1.GenerateRequest
		code codes.Code
		want string
	}{
		{&batonv1.GenerateRequest{Prompt: "x", Sampling: &batonv1.SamplingParams{Temperature: proto.Float32(-1)}}, codes.InvalidArgument, "sampling.temperature"},
		{&batonv1.GenerateRequest{Prompt: "x", Model: "nope"}, codes.NotFound, `model "nope"`},
		{&batonv1.GenerateRequest{PromptTokenIds: []uint32{1, 100000}}, codes.InvalidArgument, "prompt_token_ids[1]"},
		{&batonv1.GenerateRequest{Prompt: "x", Sampling: &batonv1.SamplingParams{MaxNewTokens: 100000}}, codes.InvalidArgument, "sampling.max_new_tokens"},
	}
	for _, cs := range cases {
		_, err := complete(context.Background(), client, cs.req)
		if status.Code(err) != cs.code || !strings.Contains(status.Convert(err).Message(), cs.want) {
			t.Errorf("%v: got %v, want %v naming %s", cs.req, err, cs.code, cs.want)
		}
	}
	// A duplicate id while the first is in flight.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	first, err := client.Generate(ctx, &batonv1.GenerateRequest{RequestId: "dup-1", Prompt: "Once upon a time",
		Sampling: &batonv1.SamplingParams{Temperature: proto.Float32(0), MaxNewTokens: 400}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := first.Recv(); err != nil {
		t.Fatal(err)
	}
	_, err = complete(context.Background(), client, &batonv1.GenerateRequest{RequestId: "dup-1", Prompt: "x"})
	if status.Code(err) != codes.AlreadyExists {
		t.Errorf("duplicate id: %v, want ALREADY_EXISTS", err)
	}
	// ListRequests shows it; Abort ends it.
	list, err := client.ListRequests(context.Background(), &batonv1.ListRequestsRequest{})
	if err != nil || len(list.GetRequests()) != 1 || list.GetRequests()[0].GetRequestId() != "dup-1" {
		t.Errorf("ListRequests = %v, %v", list, err)
	}
	// /debug/requests on the router and the decode worker show it too.
	for _, n := range []node{c.router, c.decode} {
		body := httpGet(t, "http://"+adminOf(n.http)+"/debug/requests")
		if !strings.Contains(body, `"request_id":"dup-1"`) {
			t.Errorf("%s /debug/requests lacks dup-1: %s", n.name, body)
		}
	}
	if _, err := client.Abort(context.Background(), &batonv1.AbortRequest{RequestId: "dup-1", Reason: "test"}); err != nil {
		t.Errorf("Abort: %v", err)
	}
	for err == nil {
		_, err = first.Recv()
	}
	if status.Code(err) != codes.Aborted {
		t.Errorf("aborted stream ended with %v, want ABORTED", err)
	}
	c.waitIdle(t, 2*time.Second)
}

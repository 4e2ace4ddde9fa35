//go:build e2e

package tests

import (
	"context"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/baton-serving/baton/engine/refdata"
	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
)

// TestCUDAEmulated serves through the CUDA backend where there is no GPU:
// cuda-tagged prefill-svc and decode-svc (built by scripts/cuda-check.sh
// into $BATON_CUDA_BIN_DIR) run with --device cuda on the emulated driver
// (kernels/cuda/emu, $BATON_CUDA_EMU_DIR/libcuda.so.1), which executes
// kernels.cu on the CPU. Their model weights and KV pages are device
// memory; the prompt's KV cache leaves prefill's device pages, crosses a
// real gRPC stream and lands in decode's. Greedy output must equal
// llama.cpp's. Then a cuda-tagged decode-svc serves with --device cpu on
// a machine whose driver sees no GPU ($BATON_CUDA_NOGPU_DIR holds a
// libcuda.so.1 that has none: the toolkit's stub or the driver library
// without a GPU). Skipped without those variables: the default suite has
// no cuda-tagged binaries.
func TestCUDAEmulated(t *testing.T) {
	cudaBin, emu := os.Getenv("BATON_CUDA_BIN_DIR"), os.Getenv("BATON_CUDA_EMU_DIR")
	if cudaBin == "" || emu == "" {
		t.Skip("BATON_CUDA_BIN_DIR and BATON_CUDA_EMU_DIR unset: run scripts/cuda-check.sh")
	}
	g := loadGolden(t)
	model := refdata.Model(t)
	ports := freePorts(t, 8)
	addr := func(i int) string { return "127.0.0.1:" + strconv.Itoa(ports[i]) }
	prefill := node{name: "prefill-svc", grpc: addr(0), http: addr(1)}
	decode := node{name: "decode-svc", grpc: addr(2), http: addr(3)}
	router := node{name: "router-svc", grpc: addr(4), http: addr(5)}
	common := []string{"--model", model, "--shutdown-timeout", "5s", "--log-level", "warn"}
	gpuEnv := []string{"LD_LIBRARY_PATH=" + emu}
	worker := func(n *node, env []string, args ...string) {
		args = append(append([]string{"--grpc-addr", n.grpc, "--http-addr", n.http, "--kv-cache-bytes", "64MiB", "--stall-timeout", "60s"}, common...), args...)
		n.p = startProcIn(t, cudaBin, n.name, env, args...)
	}
	worker(&prefill, gpuEnv, "--device", "cuda")
	worker(&decode, gpuEnv, "--device", "cuda:0")
	// The emulation runs a thread per CUDA thread: a token takes about a
	// second, so the canary and the self-probe (whose deadlines are meant
	// for real devices) are off and the request has room.
	router.p = startProc(t, router.name, append([]string{"--grpc-addr", router.grpc, "--http-addr", router.http,
		"--prefill", prefill.grpc, "--decode", decode.grpc, "--load-interval", "100ms", "--canary-interval", "0", "--self-probe-interval", "0"}, common...)...)
	for _, n := range []*node{&prefill, &decode, &router} {
		waitHTTP(t, n.p, "http://"+n.http+"/health/ready", 3*time.Minute)
	}
	for _, n := range []node{prefill, decode} {
		m := metrics(t, n.http)
		if m["baton_device_memory_bytes"] <= 0 {
			t.Errorf("%s: baton_device_memory_bytes = %v, want the weights and KV pages on the device", n.name, m["baton_device_memory_bytes"])
		}
	}
	f := &fleet{router: &router}
	for _, w := range append(f.view(t).Prefill.Workers, f.view(t).Decode.Workers...) {
		if !strings.HasPrefix(w.Device, "cuda:0 (") {
			t.Errorf("/debug/workers: %s's device = %q, want cuda:0 (…)", w.Address, w.Device)
		}
	}

	const n = 8 // greedy: the first n of llama.cpp's tokens
	gen := g.Generations[1]
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	start := time.Now()
	resp, err := complete(ctx, batonv1.NewRouterServiceClient(dial(t, router.grpc)), greedy(gen.Prompt, n))
	if err != nil {
		t.Fatalf("PD on the emulated GPU: %v\nprefill: %s\ndecode: %s", err, prefill.p.Stderr(), decode.p.Stderr())
	}
	t.Logf("PD request on the emulated GPU: %d prompt tokens, %d generated, %v", len(gen.PromptIDs), n, time.Since(start).Round(time.Millisecond))
	if !slices.Equal(resp.GetTokenIds(), u32s(gen.GeneratedIDs[:n])) {
		t.Errorf("generated ids %v, want llama.cpp's %v", resp.GetTokenIds(), gen.GeneratedIDs[:n])
	}
	// Every device page is back in the pools.
	c := &cluster{prefill: prefill, decode: decode, router: router, colocated: router}
	c.waitIdle(t, 30*time.Second)

	// A small cancel storm over device pages: four requests at once, three
	// cancelled at moments spread over the life of the one above (in the
	// prefill's prompt, in the transfer, in decode), one left to finish;
	// then every page is back on both devices and none leaked.
	life := time.Since(start)
	client := batonv1.NewRouterServiceClient(dial(t, router.grpc))
	type result struct {
		i   int
		err error
	}
	results := make(chan result)
	for i := range 4 {
		go func() {
			rctx, rcancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer rcancel()
			if i < 3 {
				timer := time.AfterFunc(life*time.Duration(1+3*i)/10, rcancel)
				defer timer.Stop()
			}
			_, err := complete(rctx, client, greedy(g.Generations[i%len(g.Generations)].Prompt, n))
			results <- result{i, err}
		}()
	}
	for range 4 {
		r := <-results
		switch {
		case r.i == 3 && r.err != nil:
			t.Errorf("storm: the request left to finish: %v", r.err)
		case r.i < 3 && r.err == nil:
			t.Logf("storm: request %d ended before its cancel", r.i)
		}
	}
	t.Logf("storm over device pages: 4 requests, 3 cancelled within %v", life)
	c.waitIdle(t, time.Minute)

	// A cuda-tagged decode worker on a machine without a GPU, asked for the
	// CPU, serves colocated and golden.
	if nogpu := os.Getenv("BATON_CUDA_NOGPU_DIR"); nogpu != "" {
		cpu := node{name: "decode-svc", grpc: addr(6), http: addr(7)}
		worker(&cpu, []string{"LD_LIBRARY_PATH=" + nogpu}, "--device", "cpu")
		waitHTTP(t, cpu.p, "http://"+cpu.http+"/health/ready", time.Minute)
		colo := node{name: "router-svc"}
		more := freePorts(t, 2)
		colo.grpc, colo.http = "127.0.0.1:"+strconv.Itoa(more[0]), "127.0.0.1:"+strconv.Itoa(more[1])
		colo.p = startProc(t, colo.name, append([]string{"--grpc-addr", colo.grpc, "--http-addr", colo.http,
			"--prefill", "local", "--decode", cpu.grpc, "--load-interval", "100ms"}, common...)...)
		waitHTTP(t, colo.p, "http://"+colo.http+"/health/ready", 30*time.Second)
		for _, gen := range g.Generations {
			resp, err := complete(ctx, batonv1.NewRouterServiceClient(dial(t, colo.grpc)), greedy(gen.Prompt, uint32(len(gen.GeneratedIDs))))
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(resp.GetTokenIds(), u32s(gen.GeneratedIDs)) {
				t.Errorf("%q with --device cpu: %v, want %v", gen.Prompt, resp.GetTokenIds(), gen.GeneratedIDs)
			}
		}
		if dev := (&fleet{router: &colo}).view(t).Decode.Workers; len(dev) != 1 || !strings.HasPrefix(dev[0].Device, "cpu (") {
			t.Errorf("/debug/workers: %+v, want one worker on the CPU", dev)
		}
	}
}

//go:build e2e

package tests

import (
	"context"
	"net"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/baton-serving/baton/engine/refdata"
	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
)

// TestBatonctlUpMultiWorker runs `batonctl up --prefill-workers 2
// --decode-workers 2` as an operator would: five processes on the documented
// port layout, the router given all four workers, requests served by every
// worker with the golden output, and Ctrl-C stopping every process.
func TestBatonctlUpMultiWorker(t *testing.T) {
	model := refdata.Model(t)
	g := loadGolden(t)
	const ports = 15 // router 2 + 2 prefill × 2 + 2 decode × 2, then 5 admin
	base := consecutiveFreePorts(t, ports)
	// Worker flags travel in the environment (the router ignores theirs);
	// round-robin spreads sequential requests over the workers quickly.
	env := []string{"BATON_KV_CACHE_BYTES=64MiB", "BATON_THREADS=1",
		"BATON_PREFILL_POLICY=round-robin", "BATON_DECODE_POLICY=round-robin"}
	p, logDir := startUp(t, 60*time.Second, env, "--port-base", strconv.Itoa(base),
		"--prefill-workers", "2", "--decode-workers", "2", "--model", model)
	addr := func(off int) string { return "127.0.0.1:" + strconv.Itoa(base+off) }
	// The layout: router P, P+1; first prefill P+2, P+3; first decode P+4,
	// P+5; second prefill P+6, P+7; second decode P+8, P+9.
	type worker struct {
		label, service string
		grpc, http     int // offsets from the base port
	}
	workers := []worker{
		{"prefill#1", "baton.v1.PrefillService", 2, 3},
		{"decode#1", "baton.v1.DecodeService", 4, 5},
		{"prefill#2", "baton.v1.PrefillService", 6, 7},
		{"decode#2", "baton.v1.DecodeService", 8, 9},
	}
	for _, w := range workers {
		want := []string{w.label, "gRPC", addr(w.grpc), "HTTP", "http://" + addr(w.http)}
		if !slices.ContainsFunc(strings.Split(p.Stdout(), "\n"), func(l string) bool { return slices.Equal(strings.Fields(l), want) }) {
			t.Errorf("the banner has no line %q:\n%s", strings.Join(want, " "), p.Stdout())
		}
		waitServing(t, dial(t, addr(w.grpc)), w.service)
	}
	waitServing(t, dial(t, addr(1)), "baton.v1.RouterService")

	finished := func(off int) float64 { return metrics(t, addr(off))["baton_requests_finished_total"] }
	before := map[string]float64{}
	for _, w := range workers {
		before[w.label] = finished(w.http)
	}
	// A worker gets traffic once the router's canary has passed through it,
	// which the router's readiness does not wait for (one passing pair is
	// enough): keep sending until every worker has served requests.
	client := batonv1.NewRouterServiceClient(dial(t, addr(1)))
	gen := g.Generations[0]
	idle := slices.Clone(workers)
	sent := 0
	for end := time.Now().Add(45 * time.Second); len(idle) > 0 && time.Now().Before(end); sent++ {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		resp, err := complete(ctx, client, greedy(gen.Prompt, uint32(len(gen.GeneratedIDs))))
		cancel()
		if err != nil {
			t.Fatalf("request %d: %v", sent, err)
		}
		if !slices.Equal(resp.GetTokenIds(), u32s(gen.GeneratedIDs)) {
			t.Errorf("request %d: tokens %v, want %v", sent, resp.GetTokenIds(), gen.GeneratedIDs)
		}
		idle = slices.DeleteFunc(idle, func(w worker) bool { return finished(w.http) > before[w.label] })
		if sent%4 == 3 {
			time.Sleep(250 * time.Millisecond)
		}
	}
	for _, w := range idle {
		t.Errorf("%s served none of %d requests: the router does not use it", w.label, sent)
	}
	var total float64
	for _, w := range workers {
		if strings.HasPrefix(w.label, "decode") {
			total += finished(w.http) - before[w.label]
		}
	}
	if total < float64(sent) {
		t.Errorf("the decode workers finished %v requests, want at least the %d sent", total, sent)
	}
	t.Logf("%d requests until every worker had served one", sent)

	p.signal(t, syscall.SIGINT) // Ctrl-C
	if code := p.wait(t, 30*time.Second); code != 0 {
		t.Errorf("batonctl up exit code = %d, want 0\n%s", code, p.Stderr())
	}
	if n := strings.Count(upLogs(t, logDir), `"msg":"stopped"`); n != 5 {
		t.Errorf("%d services logged a clean stop, want 5:\n%s", n, upLogs(t, logDir))
	}
	for i := range ports {
		if c, err := net.DialTimeout("tcp", addr(i), 200*time.Millisecond); err == nil {
			c.Close()
			t.Errorf("port %d still accepts connections after batonctl up stopped", base+i)
		}
	}
}

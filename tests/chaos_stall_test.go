//go:build e2e && chaos

package tests

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"google.golang.org/protobuf/proto"
)

// chaosStalledScheduler freezes workers' forward loops with the debug hook,
// in two phases.
//
// The watchdog: decode-0 (--stall-timeout 1s) is frozen while it decodes.
// Its readiness turns NOT_SERVING within the stall timeout, the router
// stops routing to it, the other pair serves every request, and diagnose
// names decode-0 and its running batch; after the thaw the held requests
// finish and readiness comes back.
//
// The canary: decode-1 (--stall-timeout 60s, so its watchdog stays quiet)
// is frozen while idle. Only a real request shows the stall: the router's
// canary times out through decode-1's pairs and quarantines them, traffic
// flows to decode-0, and diagnose, finding the workers through the router,
// names decode-1 quarantined with the canary's request stuck.
func chaosStalledScheduler(t *testing.T, row *chaosRow) {
	f := startChaosFleet(t, chaosSpec{prefills: 2, decodes: 2,
		router:  []string{"--canary-interval", "1s", "--canary-timeout", "3s"},
		prefill: []string{"--stall-timeout", "1s"},
		perDecode: func(i int) []string {
			return [][]string{{"--stall-timeout", "1s"}, {"--stall-timeout", "60s"}}[i]
		}})
	flipped := chaosWatchdogPhase(t, f, row)
	quarantinedAfter := chaosCanaryPhase(t, f, row)
	row.diagnose += fmt.Sprintf(" (readiness flipped after %.1f s; canary quarantined the idle frozen decode-1 after %.1f s)",
		flipped.Seconds(), quarantinedAfter.Seconds())
	row.leaks = f.settle(t)
	f.diagnoseHealthy(t)
}

func chaosWatchdogPhase(t *testing.T, f *chaosFleet, row *chaosRow) time.Duration {
	victim, other := f.decodes[0], f.decodes[1]
	// Requests decoding on the victim, sent to it directly.
	decode := batonv1.NewDecodeServiceClient(dial(t, victim.grpc))
	var wg sync.WaitGroup
	var mu sync.Mutex
	var held []error
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			s, err := decode.Generate(ctx, &batonv1.DecodeServiceGenerateRequest{PrefillEndpoint: f.prefills[0].grpc,
				Request: &batonv1.GenerateRequest{RequestId: fmt.Sprintf("frozen-%d", i), PromptTokenIds: longPrompt(f.golden, 20),
					Sampling: &batonv1.SamplingParams{Temperature: proto.Float32(0), Seed: proto.Uint64(1), MaxNewTokens: 480, IgnoreEos: true}}})
			for err == nil {
				_, err = s.Recv()
			}
			if errors.Is(err, io.EOF) {
				err = nil
			}
			mu.Lock()
			held = append(held, err)
			mu.Unlock()
		}()
	}
	waitListed(t, victim, batonv1.RequestState_REQUEST_STATE_RUNNING, 4, 15*time.Second)
	frozenAt := freeze(t, victim)

	// Readiness flips by itself.
	for !notReady(victim) {
		if time.Since(frozenAt) > 5*time.Second {
			t.Fatalf("decode-0 still ready %v into the freeze", time.Since(frozenAt))
		}
		time.Sleep(20 * time.Millisecond)
	}
	flipped := time.Since(frozenAt)
	t.Logf("readiness flipped %v after the freeze (--stall-timeout 1s)", flipped.Round(10*time.Millisecond))
	if m, _ := chaosMetrics(victim.http); m["baton_scheduler_stalled"] != 1 {
		t.Errorf("baton_scheduler_stalled = %v on the frozen worker, want 1", m["baton_scheduler_stalled"])
	}
	// The router learns of it from the load stream and routes around it.
	waitRouterSees(t, f, victim, func(w map[string]any) bool { return w["routable"] == false })
	waitRouterSees(t, f, other, func(w map[string]any) bool { return w["routable"] == true })
	chaosServeGolden(t, f, row, other, 10)

	d := f.diagnose(t)
	dv := d.service(t, "decode-0")
	row.diagnose = fmt.Sprintf("%s: decode-0 %s", d.Status, dv.Stage)
	if d.Status != "degraded" || !dv.Stalled || dv.Ready || dv.Stage != "running batch" || len(dv.Stuck) < 4 {
		t.Errorf("diagnose with decode-0 frozen: %s; want degraded, decode-0 stalled in the running batch with 4 requests", d.Summary)
	}
	for _, s := range dv.Stuck {
		if !strings.HasPrefix(s.ID, "frozen-") || len(s.TraceID) != 32 {
			t.Errorf("diagnose names stuck request %q with trace id %q; want the frozen-N requests with their trace ids", s.ID, s.TraceID)
		}
	}
	if !d.service(t, "decode-1").Healthy || d.Probe == nil || !d.Probe.OK {
		t.Errorf("diagnose: decode-1 or the probe not healthy: %s", d.Summary)
	}

	thaw(t, victim)
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("the requests held by the frozen scheduler did not finish after the thaw")
	}
	for _, err := range held {
		row.requests++
		if err != nil {
			row.errors++
			t.Errorf("a request held through the freeze failed: %v", err)
		} else {
			row.ok++
		}
	}
	waitHTTP(t, victim.p, "http://"+victim.http+"/health/ready", 5*time.Second)
	waitRouterSees(t, f, victim, func(w map[string]any) bool { return w["routable"] == true })
	return flipped
}

func chaosCanaryPhase(t *testing.T, f *chaosFleet, row *chaosRow) time.Duration {
	victim, other := f.decodes[1], f.decodes[0]
	frozenAt := freeze(t, victim)
	// One canary interval (1 s) and one canary deadline (3 s), with slack.
	if !routerSees(t, f, victim, 7*time.Second, func(w map[string]any) bool { return w["quarantined"] == true }) {
		thaw(t, victim)
		t.Fatalf("the canary did not quarantine decode-1 (%s), whose forward loop is frozen, within 7 s. "+
			"(A canary asking for one token is served from prefill's first token at activation, without a decode step, "+
			"so it cannot see a stalled decode loop.)", victim.grpc)
	}
	quarantined := time.Since(frozenAt)
	t.Logf("the canary quarantined decode-1 %v after the freeze", quarantined.Round(10*time.Millisecond))
	if notReady(victim) {
		t.Errorf("decode-1's own readiness failed: this phase is for a stall only the canary sees")
	}
	waitRouterSees(t, f, other, func(w map[string]any) bool { return w["routable"] == true })
	chaosServeGolden(t, f, row, other, 10)

	// Diagnose finds the workers through the router (gRPC addresses only).
	d := runDiagnose(t, "diagnose", "--json", "--router", "http://"+f.router.http, "--router-admin", "http://"+adminOf(f.router.http), "--samples", "2", "--interval", "300ms",
		"--stuck-after", "1s", "--probe-timeout", "3s")
	found := false
	for _, s := range d.Services {
		if s.GRPC != victim.grpc {
			continue
		}
		found = true
		quarantine := slices.ContainsFunc(s.Problems, func(p string) bool { return strings.Contains(p, "quarantined by the router's canary") })
		if !quarantine || !s.Stalled || len(s.Stuck) == 0 || !strings.HasPrefix(s.Stuck[0].ID, "canary-") {
			t.Errorf("diagnose --router: %s is %+v; want it quarantined, stalled, with the canary's request stuck", s.Name, s)
		}
		row.diagnose += fmt.Sprintf("; %s: %s %s quarantined", d.Status, s.Name, s.Stage)
	}
	if !found || d.Status != "degraded" {
		t.Errorf("diagnose --router with decode-1 frozen: %s; want degraded naming %s", d.Summary, victim.grpc)
	}
	thaw(t, victim)
	waitRouterSees(t, f, victim, func(w map[string]any) bool { return w["quarantined"] == false && w["routable"] == true })
	return quarantined
}

// chaosServeGolden sends n golden requests through the router and checks
// that all are right and that the given decode worker served them.
func chaosServeGolden(t *testing.T, f *chaosFleet, row *chaosRow, server *node, n int) {
	t.Helper()
	before, _ := chaosMetrics(server.http)
	for i := range n {
		gen := f.golden.Generations[i%len(f.golden.Generations)]
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		resp, err := complete(ctx, f.client(t), greedy(gen.Prompt, uint32(len(gen.GeneratedIDs))))
		cancel()
		row.requests++
		switch {
		case err != nil:
			row.errors++
			t.Errorf("request %d with a worker frozen: %v", i, err)
		case !slices.Equal(resp.GetTokenIds(), u32s(gen.GeneratedIDs)):
			row.errors++
			t.Errorf("request %d with a worker frozen: wrong tokens", i)
		default:
			row.ok++
		}
	}
	after, _ := chaosMetrics(server.http)
	if served := after["baton_requests_finished_total"] - before["baton_requests_finished_total"]; served < float64(n) {
		t.Errorf("%s finished %v requests while the other decode was frozen, want all %d", server.http, served, n)
	}
}

func freeze(t *testing.T, n *node) time.Time {
	t.Helper()
	resp, err := chaosHTTP().Post("http://"+adminOf(n.http)+"/debug/freeze?for=60s", "", nil)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("freeze %s: %v %v", n.http, resp, err)
	}
	resp.Body.Close()
	return time.Now()
}

func thaw(t *testing.T, n *node) {
	t.Helper()
	resp, err := chaosHTTP().Post("http://"+adminOf(n.http)+"/debug/unfreeze", "", nil)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("unfreeze %s: %v %v", n.http, resp, err)
	}
	resp.Body.Close()
}

func notReady(n *node) bool {
	r, err := chaosHTTP().Get("http://" + n.http + "/health/ready")
	if err != nil {
		return false
	}
	r.Body.Close()
	return r.StatusCode == http.StatusServiceUnavailable
}

// waitRouterSees polls the router's /debug/workers until the entry of
// worker n satisfies ok (10 s at most).
func waitRouterSees(t *testing.T, f *chaosFleet, n *node, ok func(w map[string]any) bool) {
	t.Helper()
	if !routerSees(t, f, n, 10*time.Second, ok) {
		v, _ := routerWorkers(t, f)
		t.Fatalf("the router's view of %s did not change as expected within 10 s: %v", n.grpc, workerEntry(v, n.grpc))
	}
}

// routerSees polls the router's /debug/workers until the entry of worker n
// satisfies ok, for at most within.
func routerSees(t *testing.T, f *chaosFleet, n *node, within time.Duration, ok func(w map[string]any) bool) bool {
	t.Helper()
	return routerSeesAddr(t, f, n.grpc, within, ok)
}

// routerSeesAddr is routerSees for the worker the router knows at addr.
func routerSeesAddr(t *testing.T, f *chaosFleet, addr string, within time.Duration, ok func(w map[string]any) bool) bool {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		v, served := routerWorkers(t, f)
		if !served {
			t.Fatal("the router serves no /debug/workers")
		}
		if w := workerEntry(v, addr); w != nil && ok(w) {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// workerEntry finds the object of the worker at addr in the router's view.
func workerEntry(v any, addr string) map[string]any {
	switch x := v.(type) {
	case []any:
		for _, e := range x {
			if w := workerEntry(e, addr); w != nil {
				return w
			}
		}
	case map[string]any:
		if x["address"] == addr {
			return x
		}
		for _, e := range x {
			if w := workerEntry(e, addr); w != nil {
				return w
			}
		}
	}
	return nil
}

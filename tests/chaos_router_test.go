//go:build e2e && chaos

package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// chaosRouterWedge wedges the router's own request path with its
// --debug-hooks wedge: every request that reaches admission waits there,
// holding its limiter slot, while every worker stays healthy and the canary
// (which calls the workers directly) keeps passing. Only the router's
// self-probe, which takes a client's path, sees it: readiness (HTTP and
// gRPC health) must drop within 15 s naming the stage, and batonctl
// diagnose must name the router's stage. Requests aborted while wedged
// release their slots within the bound; when the wedge ends the held
// requests are served, readiness returns, and nothing leaks. The self-probe
// runs with its defaults (--self-probe-interval 5s, --self-probe-timeout 5s).
func chaosRouterWedge(t *testing.T, row *chaosRow) {
	f := startChaosFleet(t, chaosSpec{prefills: 1, decodes: 1,
		router: []string{"--debug-hooks", "--max-concurrent-requests", "8", "--canary-interval", "1s"}})
	gen := f.golden.Generations[0]
	wedgeRouter(t, f, "stage=admission&for=60s")
	wedgedAt := time.Now()

	// Clients arrive while wedged; they wait in admission.
	var wg sync.WaitGroup
	var mu sync.Mutex
	var held []error
	for range 3 {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			resp, err := complete(ctx, f.client(t), greedy(gen.Prompt, uint32(len(gen.GeneratedIDs))))
			if err == nil && !slices.Equal(resp.GetTokenIds(), u32s(gen.GeneratedIDs)) {
				err = fmt.Errorf("wrong tokens")
			}
			mu.Lock()
			held = append(held, err)
			mu.Unlock()
		})
	}

	// Readiness drops by itself, on both surfaces.
	var failing string
	for {
		if ok, why := routerReady(f); !ok {
			failing = why
			break
		}
		if time.Since(wedgedAt) > 15*time.Second {
			unwedgeRouter(t, f)
			t.Fatalf("router still ready %v into a wedge of its request path", time.Since(wedgedAt).Round(time.Second))
		}
		time.Sleep(100 * time.Millisecond)
	}
	flipped := time.Since(wedgedAt)
	t.Logf("router readiness flipped %v after the wedge: %s", flipped.Round(10*time.Millisecond), failing)
	if !strings.Contains(failing, "request-path") || !strings.Contains(failing, "stuck at admission") {
		t.Errorf("router not ready for %q; want check request-path naming stage admission", failing)
	}
	for deadline := time.Now().Add(3 * time.Second); healthStatus(t, f.routerConn, "") != healthpb.HealthCheckResponse_NOT_SERVING; {
		if time.Now().After(deadline) {
			t.Errorf("gRPC health still %v 3 s after /health/ready turned NOT_SERVING", healthStatus(t, f.routerConn, ""))
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, w := range f.workers() {
		if notReady(w) {
			t.Errorf("%s not ready while only the router is wedged", w.http)
		}
	}

	// Diagnose names the router and its stage.
	d := f.diagnose(t)
	rv := d.service(t, "router")
	row.diagnose = fmt.Sprintf("%s: router %s (readiness flipped after %.1f s)", d.Status, rv.Stage, flipped.Seconds())
	if d.Status != "wedged" || rv.Ready || rv.Stage != "admission" ||
		!slices.ContainsFunc(rv.Problems, func(p string) bool { return strings.Contains(p, "request path stuck at admission") }) {
		t.Errorf("diagnose with the router wedged: %s; want wedged, the router not ready with its request path stuck at admission", d.Summary)
	}

	// Requests aborted in the wedge give their slots back within the bound.
	for i := range 3 {
		before := routerFinished(t, f)
		ctx, cancel := context.WithCancel(context.Background())
		errc := make(chan error, 1)
		go func() {
			_, err := complete(ctx, f.client(t), greedy(gen.Prompt, 4))
			errc <- err
		}()
		time.Sleep(300 * time.Millisecond) // into the wedge
		cancel()
		abortedAt := time.Now()
		if err := <-errc; status.Code(err) != codes.Canceled {
			t.Errorf("aborted request %d: %v, want CANCELED", i, err)
		}
		for routerFinished(t, f) <= before {
			if time.Since(abortedAt) > 5*time.Second {
				t.Errorf("aborted request %d still held by the router 5 s after its client cancelled", i)
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		row.release = append(row.release, time.Since(abortedAt))
		row.requests++
		row.canceled++
	}

	unwedgeRouter(t, f)
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the requests held in the wedge did not finish after it ended")
	}
	for _, err := range held {
		row.requests++
		if err != nil {
			row.errors++
			t.Errorf("a request held in the wedge failed: %v", err)
		} else {
			row.ok++
		}
	}
	for start := time.Now(); ; time.Sleep(100 * time.Millisecond) {
		if ok, _ := routerReady(f); ok {
			row.diagnose += fmt.Sprintf("; ready again %.1f s after the wedge ended", time.Since(start).Seconds())
			break
		}
		if time.Since(start) > 15*time.Second {
			_, why := routerReady(f)
			t.Fatalf("router not ready 15 s after the wedge ended: %s", why)
		}
	}
	row.leaks = f.settle(t)
	f.diagnoseHealthy(t)
}

func wedgeRouter(t *testing.T, f *chaosFleet, query string) {
	t.Helper()
	resp, err := chaosHTTP().Post("http://"+adminOf(f.router.http)+"/debug/wedge?"+query, "", nil)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("wedge the router: %v %v (does it run with --debug-hooks?)", resp, err)
	}
	resp.Body.Close()
}

func unwedgeRouter(t *testing.T, f *chaosFleet) {
	t.Helper()
	resp, err := chaosHTTP().Post("http://"+adminOf(f.router.http)+"/debug/unwedge", "", nil)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("unwedge the router: %v %v", resp, err)
	}
	resp.Body.Close()
}

// routerReady reads the router's /health/ready: whether it is ready and,
// when not, its failing checks.
func routerReady(f *chaosFleet) (bool, string) {
	resp, err := chaosHTTP().Get("http://" + f.router.http + "/health/ready")
	if err != nil {
		return false, "GET /health/ready: " + err.Error()
	}
	defer resp.Body.Close()
	var body struct {
		Failing map[string]string `json:"failing"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&body)
	var why []string
	for k, v := range body.Failing {
		why = append(why, k+": "+v)
	}
	slices.Sort(why)
	return resp.StatusCode == http.StatusOK, strings.Join(why, "; ")
}

// routerFinished is how many client requests the router has finished
// (baton_router_requests_total over every code).
func routerFinished(t *testing.T, f *chaosFleet) float64 {
	t.Helper()
	m, err := chaosMetrics(f.router.http)
	if err != nil {
		t.Fatalf("router metrics: %v", err)
	}
	return m["baton_router_requests_total"]
}

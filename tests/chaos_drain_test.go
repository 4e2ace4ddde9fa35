//go:build e2e && chaos

package tests

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// drainTimeout is the router's --shutdown-timeout in chaosRouterDrain.
const drainTimeout = 2 * time.Second

// chaosRouterDrain: SIGTERM to the router (--shutdown-timeout 2s) with
// gRPC streams in the middle of their generation and requests still
// waiting for their first token — the decode worker is frozen, so nothing
// finishes by itself. No stream may end silently or hang: the waiting
// requests are refused at once (UNAVAILABLE, nothing reached their
// clients), the streams are ended by the router before its timeout with
// UNAVAILABLE saying it is shutting down, the router's log names the drain
// as what ended them, and the router exits 0 within the timeout. Once the
// decode worker thaws (the release is timed from then: a frozen scheduler
// releases nothing) the workers let go of everything; the router restarted
// serves.
func chaosRouterDrain(t *testing.T, row *chaosRow) {
	f := startChaosFleet(t, chaosSpec{prefills: 1, decodes: 1,
		decode: []string{"--stall-timeout", "10s"}, // the freeze outlasts the drain without tripping the watchdog
		router: []string{"--shutdown-timeout", drainTimeout.String()}})
	decode := f.decodes[0]
	load := startLoad(f.client(t), 8, func(n int) *batonv1.GenerateRequest {
		return longRequest(f.golden, fmt.Sprintf("drain-run-%d", n), 40, 440)
	})
	waitListed(t, decode, batonv1.RequestState_REQUEST_STATE_RUNNING, 8, 15*time.Second)
	load.halt()
	resp, err := chaosHTTP().Post("http://"+adminOf(decode.http)+"/debug/freeze?for=60s", "", nil)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("freeze %s: %v %v", decode.http, resp, err)
	}
	resp.Body.Close()
	thaw := func() time.Time {
		resp, err := chaosHTTP().Post("http://"+adminOf(decode.http)+"/debug/unfreeze", "", nil)
		if err == nil {
			resp.Body.Close()
		}
		return time.Now()
	}
	defer thaw()

	// Requests that arrive now wait for their first token.
	var wg sync.WaitGroup
	waiting := make([]*loadReq, 4)
	for i := range waiting {
		r := &loadReq{id: fmt.Sprintf("drain-wait-%d", i), start: time.Now()}
		waiting[i] = r
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			r.err = stream(ctx, f.client(t), longRequest(f.golden, r.id, 40, 440), nil)
			r.hung = ctx.Err() != nil
			r.end = time.Now()
			r.done.Store(true)
		})
	}
	waitListed(t, f.router, batonv1.RequestState_REQUEST_STATE_PREALLOC, len(waiting), 10*time.Second)
	inflight := listed(t, f.router)

	tr := startReleaseTracker(f.prefills[0], decode)
	defer tr.logLate(t)
	termAt := time.Now()
	f.router.p.signal(t, syscall.SIGTERM)
	code := f.router.p.wait(t, drainTimeout+exitSlack+10*time.Second)
	exited := time.Since(termAt)
	if exited > drainTimeout+exitSlack || code != 0 {
		t.Errorf("the router exited %v after SIGTERM with code %d; want 0 within --shutdown-timeout %v + %v", exited, code, drainTimeout, exitSlack)
	}
	reqs := load.finish(t, 10*time.Second)
	wg.Wait()
	thawAt := thaw()

	reqs = append(reqs, waiting...)
	failAfter, byCode := tally(row, reqs, termAt)
	row.told = failAfter
	for _, r := range reqs {
		if r.err == nil {
			continue
		}
		tr.aborted(r.id, thawAt)
		st := status.Convert(r.err)
		switch {
		case st.Code() != codes.Unavailable || !strings.Contains(st.Message(), "shutting down"):
			t.Errorf("%s ended with %v; want UNAVAILABLE saying the router is shutting down", r.id, r.err)
		case strings.HasPrefix(r.id, "drain-wait-") && r.end.Sub(termAt) >= drainTimeout:
			t.Errorf("%s, waiting for its first token, was answered %v after SIGTERM: cut at the end, not refused at the start", r.id, r.end.Sub(termAt))
		}
	}
	for _, r := range waiting {
		if r.err == nil {
			t.Errorf("%s completed: the freeze did not hold it", r.id)
		}
	}
	logs := f.router.p.Stderr()
	for _, ri := range inflight {
		if !logHas(logs, ri.GetRequestId(), `"ended_by":"drain"`) {
			t.Errorf("the router's log does not say the drain ended %s (%v)", ri.GetRequestId(), ri.GetState())
		}
	}
	released, held := tr.finish(releaseBound + time.Second)
	row.release = released
	if len(held) > 0 {
		t.Errorf("workers still hold %v after the decode worker thawed: %v", releaseBound+time.Second, held)
	}
	t.Logf("%d requests in flight at SIGTERM (%d waiting for a first token); outcomes %v; told within %v; router exited %v after SIGTERM",
		len(inflight), len(waiting), byCode, maxDur(failAfter), exited.Round(10*time.Millisecond))
	f.restart(t, f.router)
	row.leaks = f.settle(t)
	row.diagnose = fmt.Sprintf("router exited %.1f s after SIGTERM (--shutdown-timeout %v), code %d; release timed from decode's thaw", exited.Seconds(), drainTimeout, code)
}

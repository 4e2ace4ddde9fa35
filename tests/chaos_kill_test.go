//go:build e2e && chaos

package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

// loadReq is one request of a chaosLoad.
type loadReq struct {
	id         string
	start, end time.Time
	err        error
	hung       bool
	done       atomic.Bool
}

// chaosLoad keeps a number of clients sending requests, one after another,
// until halted.
type chaosLoad struct {
	mu     sync.Mutex
	reqs   []*loadReq
	halted atomic.Bool
	wg     sync.WaitGroup
}

// startLoad starts clients, each sending mk(n)'s requests back to back; a
// request still running 30 s after it started counts as hung.
func startLoad(client batonv1.RouterServiceClient, clients int, mk func(n int) *batonv1.GenerateRequest) *chaosLoad {
	l := &chaosLoad{}
	var n atomic.Int64
	for range clients {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for !l.halted.Load() {
				req := mk(int(n.Add(1)))
				r := &loadReq{id: req.GetRequestId(), start: time.Now()}
				l.mu.Lock()
				l.reqs = append(l.reqs, r)
				l.mu.Unlock()
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				r.err = stream(ctx, client, req, nil)
				r.hung = ctx.Err() != nil
				cancel()
				r.end = time.Now()
				r.done.Store(true)
			}
		}()
	}
	return l
}

// halt stops the clients from starting requests.
func (l *chaosLoad) halt() { l.halted.Store(true) }

// finish halts the load and waits for its requests to end.
func (l *chaosLoad) finish(t *testing.T, within time.Duration) []*loadReq {
	t.Helper()
	l.halt()
	done := make(chan struct{})
	go func() { l.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(within):
		t.Errorf("client requests still running %v after the load was halted", within)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.reqs)
}

// tally fills the row's counts from the requests and returns how long the
// failed ones took to fail after the event at `at`.
func tally(row *chaosRow, reqs []*loadReq, at time.Time) (failAfter []time.Duration, byCode map[codes.Code]int) {
	byCode = map[codes.Code]int{}
	for _, r := range reqs {
		if !r.done.Load() {
			row.hung++
			continue
		}
		row.requests++
		code := status.Code(r.err)
		byCode[code]++
		switch {
		case r.hung:
			row.hung++
		case r.err == nil:
			row.ok++
		case code == codes.Canceled:
			row.canceled++
		default:
			row.errors++
			failAfter = append(failAfter, r.end.Sub(at))
		}
	}
	return failAfter, byCode
}

// logFailures logs the first few failures with when they happened.
func logFailures(t *testing.T, reqs []*loadReq, at time.Time) {
	t.Helper()
	n := 0
	for _, r := range reqs {
		if r.err != nil && n < 3 {
			t.Logf("%s failed %v after the event (started %v before it): %v", r.id, r.end.Sub(at).Round(time.Millisecond), at.Sub(r.start).Round(time.Millisecond), r.err)
			n++
		}
	}
}

// listed returns the requests a service lists now.
func listed(t *testing.T, n *node) []*batonv1.RequestInfo {
	t.Helper()
	resp, err := chaosHTTP().Get("http://" + adminOf(n.http) + "/debug/requests")
	if err != nil {
		t.Fatalf("%s /debug/requests: %v", n.name, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	var list batonv1.WorkerServiceListRequestsResponse
	if err == nil {
		err = protojson.UnmarshalOptions{DiscardUnknown: true}.Unmarshal(b, &list)
	}
	if err != nil {
		t.Fatalf("%s /debug/requests: %v", n.name, err)
	}
	return list.GetRequests()
}

// waitListed polls a service until it lists at least n requests in state.
func waitListed(t *testing.T, node *node, state batonv1.RequestState, n int, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		got := 0
		for _, r := range listed(t, node) {
			if r.GetState() == state {
				got++
			}
		}
		if got >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s listed %d requests in %v, not %d, within %v", node.name, got, state, n, within)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func ids(list []*batonv1.RequestInfo) []string {
	var out []string
	for _, r := range list {
		out = append(out, r.GetRequestId())
	}
	return out
}

// longRequest is a greedy request with a long prompt, so that its KV
// transfer takes many chunks.
func longRequest(g golden, id string, promptTokens int, maxNew uint32) *batonv1.GenerateRequest {
	return &batonv1.GenerateRequest{RequestId: id, PromptTokenIds: longPrompt(g, promptTokens),
		Sampling: &batonv1.SamplingParams{Temperature: proto.Float32(0), MaxNewTokens: maxNew, IgnoreEos: true}}
}

// chaosKill kills one worker with SIGKILL while transfers are in flight
// and checks that clients are told promptly (UNAVAILABLE, no hang), that
// the survivors release everything the dead worker's requests held, and
// that diagnose names the dead worker.
func chaosKill(t *testing.T, row *chaosRow, victimRole string) {
	f := startChaosFleet(t, chaosSpec{prefills: 1, decodes: 1, decode: []string{"--credit-window", "1"}})
	victim, survivors := f.decodes[0], []*node{f.prefills[0], f.router}
	if victimRole == "prefill" {
		victim, survivors = f.prefills[0], []*node{f.decodes[0], f.router}
	}
	load := startLoad(f.client(t), 24, func(n int) *batonv1.GenerateRequest {
		return longRequest(f.golden, fmt.Sprintf("kill-%s-%d", victimRole, n), 300, 32)
	})
	waitListed(t, f.decodes[0], batonv1.RequestState_REQUEST_STATE_TRANSFERRING, 2, 15*time.Second)
	load.halt()
	inflight := ids(listed(t, f.router))
	tr := startReleaseTracker(survivors...)
	killAt := f.kill9(t, victim)
	for _, id := range inflight {
		tr.aborted(id, killAt)
	}
	reqs := load.finish(t, 10*time.Second)
	failAfter, byCode := tally(row, reqs, killAt)
	logFailures(t, reqs, killAt)
	for _, r := range reqs {
		if r.err != nil {
			tr.aborted(r.id, killAt) // in flight at the kill, even if between the router's lists
		}
	}
	row.told = failAfter
	defer tr.logLate(t)
	released, held := tr.finish(releaseBound + time.Second)
	row.release = released
	t.Logf("%d requests in flight at the kill; outcomes %v; failures surfaced %v after the kill (max)", len(inflight), byCode, maxDur(failAfter))
	if len(held) > 0 {
		t.Errorf("survivors still hold %v after the kill: %v", releaseBound+time.Second, held)
	}
	for code, n := range byCode {
		if code != codes.OK && code != codes.Unavailable {
			t.Errorf("%d requests ended with %v; want OK or UNAVAILABLE", n, code)
		}
	}
	if row.errors == 0 {
		t.Errorf("no request failed: the kill hit nothing in flight (%v)", byCode)
	}
	if m := maxDur(failAfter); m > releaseBound {
		t.Errorf("a client learned of the failure %v after the kill; bound %v", m, releaseBound)
	}

	name := victimRole + "-0"
	d := f.diagnose(t)
	row.diagnose = fmt.Sprintf("%s: %s", d.Status, name+" down")
	if s := d.service(t, name); d.Status != "wedged" || !s.Down {
		t.Errorf("diagnose with %s dead: %s; want wedged naming %s down", name, d.Summary, name)
	}
	if d.Probe == nil || d.Probe.OK {
		t.Errorf("diagnose's probe succeeded with %s dead", name)
	}
	f.restart(t, victim)
	row.leaks = f.settle(t)
	f.diagnoseHealthy(t)
}

func chaosKillDecode(t *testing.T, row *chaosRow)  { chaosKill(t, row, "decode") }
func chaosKillPrefill(t *testing.T, row *chaosRow) { chaosKill(t, row, "prefill") }

// chaosKillPrefillRetry: with two prefill workers, killing one mid-transfer
// costs no request: those that had no first token are retried on the
// other, the rest decode from the KV cache they already have.
func chaosKillPrefillRetry(t *testing.T, row *chaosRow) {
	f := startChaosFleet(t, chaosSpec{prefills: 2, decodes: 1, decode: []string{"--credit-window", "1"}})
	load := startLoad(f.client(t), 24, func(n int) *batonv1.GenerateRequest {
		return longRequest(f.golden, fmt.Sprintf("retry-%d", n), 300, 32)
	})
	waitListed(t, f.decodes[0], batonv1.RequestState_REQUEST_STATE_TRANSFERRING, 2, 15*time.Second)
	var onVictim []string
	for _, r := range listed(t, f.router) {
		if strings.Contains(r.GetWorkers(), "prefill="+f.prefills[0].grpc) && r.GetGeneratedTokens() == 0 {
			onVictim = append(onVictim, r.GetRequestId())
		}
	}
	killAt := f.kill9(t, f.prefills[0])
	time.Sleep(500 * time.Millisecond) // requests keep arriving while the router learns of the death
	reqs := load.finish(t, 15*time.Second)
	_, byCode := tally(row, reqs, killAt)
	t.Logf("%d requests on the victim before their first token; outcomes %v", len(onVictim), byCode)
	if len(onVictim) == 0 {
		t.Errorf("the kill hit no request before its first token")
	}
	// Every request fails over: a retry avoids the prefill worker that
	// failed even when the router has not yet seen it die, so none may
	// surface the dead prefill's error.
	for _, r := range reqs {
		if r.err != nil {
			t.Errorf("request %s failed: %v (should have been retried on prefill-1)", r.id, r.err)
		}
	}
	// Every request caught on the victim before its first token was
	// retried: each one ended, after the kill, with its whole output.
	retried := 0
	for _, id := range onVictim {
		i := slices.IndexFunc(reqs, func(r *loadReq) bool { return r.id == id })
		switch {
		case i < 0:
			t.Errorf("request %s, on prefill-0 at the kill, is not among the load's requests", id)
		case reqs[i].err != nil || !reqs[i].end.After(killAt):
			t.Errorf("request %s, on prefill-0 before its first token, was not retried: ended %v after the kill with %v",
				id, reqs[i].end.Sub(killAt), reqs[i].err)
		default:
			retried++
		}
	}
	t.Logf("%d of the %d requests caught before their first token were retried", retried, len(onVictim))
	d := f.diagnose(t)
	row.diagnose = fmt.Sprintf("%s: prefill-0 down", d.Status)
	if s := d.service(t, "prefill-0"); d.Status != "degraded" || !s.Down || !d.service(t, "prefill-1").Healthy {
		t.Errorf("diagnose with prefill-0 dead: %s; want degraded, prefill-0 down, prefill-1 healthy", d.Summary)
	}
	f.restart(t, f.prefills[0])
	row.leaks = f.settle(t)
	f.diagnoseHealthy(t)
}

// chaosRouterRestart kills the router with SIGKILL while requests decode,
// and starts it again: the workers release everything the router's
// requests held, clients are told at once, and the new router serves.
func chaosRouterRestart(t *testing.T, row *chaosRow) {
	f := startChaosFleet(t, chaosSpec{prefills: 1, decodes: 1})
	load := startLoad(f.client(t), 32, func(n int) *batonv1.GenerateRequest {
		return longRequest(f.golden, fmt.Sprintf("rr-%d", n), 40, 300)
	})
	waitListed(t, f.decodes[0], batonv1.RequestState_REQUEST_STATE_RUNNING, 16, 15*time.Second)
	load.halt()
	inflight := ids(listed(t, f.router))
	tr := startReleaseTracker(f.prefills[0], f.decodes[0])
	killAt := f.kill9(t, f.router)
	for _, id := range inflight {
		tr.aborted(id, killAt)
	}
	reqs := load.finish(t, 10*time.Second)
	failAfter, byCode := tally(row, reqs, killAt)
	for _, r := range reqs {
		if r.err != nil {
			tr.aborted(r.id, killAt)
		}
	}
	row.told = failAfter
	defer tr.logLate(t)
	released, held := tr.finish(releaseBound + time.Second)
	row.release = released
	t.Logf("%d requests in flight at the kill; outcomes %v; clients told within %v", len(inflight), byCode, maxDur(failAfter))
	if len(held) > 0 {
		t.Errorf("workers still hold %v after the router died: %v", releaseBound+time.Second, held)
	}
	if row.errors < 16 {
		t.Errorf("only %d requests failed with the router killed mid-flight (%v)", row.errors, byCode)
	}
	d := f.diagnose(t)
	row.diagnose = fmt.Sprintf("%s: router down", d.Status)
	if s := d.service(t, "router"); d.Status != "wedged" || !s.Down {
		t.Errorf("diagnose with the router dead: %s; want wedged naming the router down", d.Summary)
	}
	f.restart(t, f.router)
	row.leaks = f.settle(t)
	f.diagnoseHealthy(t)
}

func maxDur(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	return slices.Max(d)
}

// routerWorkers reads the router's /debug/workers, if it serves one.
func routerWorkers(t *testing.T, f *chaosFleet) (any, bool) {
	t.Helper()
	resp, err := chaosHTTP().Get("http://" + adminOf(f.router.http) + "/debug/workers")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound {
		return nil, false
	}
	var v any
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		t.Fatalf("/debug/workers: %v", err)
	}
	return v, true
}

//go:build e2e && chaos

package tests

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
)

// chaosBlackhole: the network between decode and prefill stops forwarding
// in the middle of transfers, without closing anything (the router still
// reaches prefill). Both sides detect it by their deadlines and release;
// clients get DEADLINE_EXCEEDED; diagnose, run while it lasts, names
// decode's transfer queue and places its probe in kv_receive.
func chaosBlackhole(t *testing.T, row *chaosRow) {
	var px *selectiveProxy
	f := startChaosFleet(t, chaosSpec{prefills: 1, decodes: 1,
		// Prefill gives up on a silent decode before decode gives up on it,
		// so that both ends' deadlines are exercised.
		prefill: []string{"--transfer-idle-timeout", "4s"},
		decode: []string{"--credit-window", "1", "--transfer-idle-timeout", "5s", "--handshake-timeout", "5s",
			"--abort-ack-timeout", "300ms"},
		routerPrefill: func(_ int, addr string) string {
			px = startSelectiveProxy(t, addr)
			return px.addr()
		},
	})
	load := startLoad(f.client(t), 16, func(n int) *batonv1.GenerateRequest {
		return longRequest(f.golden, fmt.Sprintf("bh-%d", n), 300, 16)
	})
	waitListed(t, f.decodes[0], batonv1.RequestState_REQUEST_STATE_TRANSFERRING, 2, 15*time.Second)
	if px.blackhole(fromProcess(f.decodes[0].p.cmd.Process.Pid)) == 0 { // the router still reaches prefill
		// Seen twice in CI on a fresh clone, never locally: the proxy
		// found none of decode's connections (matched through /proc), so
		// no fault was injected and the case would measure nothing
		// (docs/reliability.md, "Still open").
		load.halt()
		t.Skip("the proxy matched none of decode's connections to prefill: the black hole was not injected")
	}
	cutAt := time.Now()
	load.halt()
	inflight := ids(listed(t, f.decodes[0]))

	// While it lasts (the deadlines are 4-5 s away), diagnose.
	time.Sleep(1200 * time.Millisecond)
	d := f.diagnose(t, "--samples", "2", "--probe-timeout", "2s")
	dec := d.service(t, "decode-0")
	row.diagnose = fmt.Sprintf("%s: decode-0 %s; probe at %s", d.Status, dec.Stage, probeStage(d))
	if d.Status != "wedged" || !dec.Stalled || dec.Stage != "transfer queue" {
		t.Errorf("diagnose during the black hole: %s; want wedged, decode-0 stalled in the transfer queue", d.Summary)
	}
	// The probe stalls where the requests do — unless the router's canary
	// has already seen the partition and routes nothing (a fast failure is
	// as good an answer).
	canaryCaught := slices.ContainsFunc(d.service(t, "router").Problems, func(p string) bool { return strings.Contains(p, "canary") })
	if d.Probe == nil || d.Probe.OK || !canaryCaught && (d.Probe.Service != "decode-0" || d.Probe.Stage != "kv_receive") {
		t.Errorf("diagnose's probe: %+v; want it stalled at kv_receive on decode-0", d.Probe)
	}
	if !slices.ContainsFunc(dec.Stuck, func(s struct {
		ID      string `json:"request_id"`
		TraceID string `json:"trace_id"`
	}) bool {
		return slices.Contains(inflight, s.ID) && len(s.TraceID) == 32
	}) {
		t.Errorf("diagnose names none of the cut-off requests %v with a trace id: %+v", inflight, dec.Stuck)
	}

	// Each side is held to the bound from its own detection: decode (and
	// the router) from the deadline that failed the client, prefill from
	// its own transfer deadline (its log says when) — it cannot hear of
	// decode's abort through the black hole. How much later than decode
	// prefill let go is measured too, and logged.
	trDecode := startReleaseTracker(f.router, f.decodes[0])
	trPrefill := startReleaseTracker(f.prefills[0])
	trLag := startReleaseTracker(f.prefills[0])
	reqs := load.finish(t, 15*time.Second)
	failAfter, byCode := tally(row, reqs, cutAt)
	row.told = failAfter
	stalledAt := logTimes(f.prefills[0].p.Stderr(), "transfer stalled; releasing")
	for _, r := range reqs {
		if r.err == nil {
			continue
		}
		trDecode.aborted(r.id, r.end) // the deadline fired when the client heard of it
		trLag.aborted(r.id, r.end)
		if at, ok := stalledAt[r.id]; ok {
			trPrefill.aborted(r.id, at)
		} else {
			trPrefill.aborted(r.id, r.end)
		}
	}
	defer trDecode.logLate(t)
	defer trPrefill.logLate(t)
	releasedD, heldD := trDecode.finish(releaseBound + time.Second)
	releasedP, heldP := trPrefill.finish(releaseBound + 5*time.Second)
	lag, _ := trLag.finish(0)
	row.release = append(releasedD, releasedP...)
	t.Logf("%d requests cut off; outcomes %v; failures surfaced after %v (max); %d prefill transfer deadlines fired; prefill let go up to %v after decode's abort",
		len(inflight), byCode, maxDur(failAfter), len(stalledAt), maxDur(lag).Round(time.Millisecond))
	if held := append(heldD, heldP...); len(held) > 0 {
		t.Errorf("still held after their deadlines: %v", held)
	}
	for code, n := range byCode {
		if code != codes.OK && code != codes.DeadlineExceeded {
			t.Errorf("%d requests ended with %v; want OK or DEADLINE_EXCEEDED", n, code)
		}
	}
	if m := maxDur(failAfter); m > 5*time.Second+releaseBound {
		t.Errorf("a client waited %v after the cut; decode's deadlines are 5 s", m)
	}
	// The network heals: the black-holed connections finally break.
	px.heal()
	row.leaks = f.settle(t)
	f.diagnoseHealthy(t)
}

// logTimes reads JSON log lines and returns, by request id, when each line
// with message msg was written.
func logTimes(logs, msg string) map[string]time.Time {
	out := map[string]time.Time{}
	for _, line := range strings.Split(logs, "\n") {
		var l struct {
			Time      time.Time `json:"time"`
			Msg       string    `json:"msg"`
			RequestID string    `json:"request_id"`
		}
		if json.Unmarshal([]byte(line), &l) == nil && l.Msg == msg && l.RequestID != "" {
			out[l.RequestID] = l.Time
		}
	}
	return out
}

func probeStage(d diagnoseResult) string {
	if d.Probe == nil {
		return "-"
	}
	if d.Probe.OK {
		return "ok"
	}
	return d.Probe.Stage
}

// chaosSlowClient: two clients stop reading their streams — one an SSE
// stream of the OpenAI API, one a gRPC stream — after the first event,
// without closing them. Their requests are bounded by the router's
// --request-timeout and released everywhere, while the other clients'
// requests are served correctly. The context window is raised to 2,048
// tokens so that the unread output outgrows every buffer on the way (HTTP/2
// flow control, the kernel's socket buffers).
func chaosSlowClient(t *testing.T, row *chaosRow) {
	const requestTimeout = 12 * time.Second
	ctxFlags := []string{"--context-length", "2048"}
	f := startChaosFleet(t, chaosSpec{prefills: 1, decodes: 1, prefill: ctxFlags, decode: ctxFlags,
		router: append([]string{"--request-timeout", requestTimeout.String()}, ctxFlags...)})
	tr := startReleaseTracker(f.all()...)
	sseConn, sseStart := slowSSE(t, f.router.http)
	defer sseConn.Close()
	grpcStop, grpcStart := slowGRPC(t, f.router.grpc, "slow-grpc")
	defer grpcStop()
	var sseID string
	for _, r := range listed(t, f.router) {
		if id := r.GetRequestId(); id != "slow-grpc" {
			sseID = id
		}
	}
	if sseID == "" {
		t.Fatal("the SSE client's request is not in flight at the router")
	}

	// Wait until the router's sends to the gRPC reader block.
	for {
		i := slices.IndexFunc(listed(t, f.router), func(r *batonv1.RequestInfo) bool {
			return r.GetRequestId() == "slow-grpc" && r.GetSinceProgressSeconds() >= 1
		})
		if i >= 0 {
			break
		}
		if time.Since(grpcStart) > requestTimeout-4*time.Second {
			t.Fatalf("the router never blocked on the client that does not read")
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("the router's sends blocked %v into the request", time.Since(grpcStart).Round(100*time.Millisecond))
	d := f.diagnose(t, "--samples", "2")
	rs := d.service(t, "router")
	row.diagnose = fmt.Sprintf("%s: router %s", d.Status, rs.Stage)
	var stuck []string
	for _, s := range rs.Stuck {
		stuck = append(stuck, s.ID)
	}
	if !rs.Stalled || rs.Stage != "streaming" || !slices.Contains(stuck, "slow-grpc") {
		t.Errorf("diagnose with clients not reading: %s; want the router's slow-grpc stalled in streaming", d.Summary)
	}
	if d.Probe == nil || !d.Probe.OK {
		t.Errorf("diagnose's probe failed beside the slow clients: %+v", d.Probe)
	}

	// Meanwhile the others are served: golden requests, all correct.
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failures []string
	gens := f.golden.Generations
	for i := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			gen := gens[i%len(gens)]
			req := greedy(gen.Prompt, uint32(len(gen.GeneratedIDs)))
			req.RequestId = fmt.Sprintf("other-%d", i)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			resp, err := complete(ctx, f.client(t), req)
			mu.Lock()
			defer mu.Unlock()
			row.requests++
			switch {
			case err != nil:
				failures = append(failures, fmt.Sprintf("%s: %v", req.RequestId, err))
				row.errors++
			case !slices.Equal(resp.GetTokenIds(), u32s(gen.GeneratedIDs)):
				failures = append(failures, fmt.Sprintf("%s: wrong tokens", req.RequestId))
				row.errors++
			default:
				row.ok++
			}
		}()
	}
	wg.Wait()
	for _, msg := range failures {
		t.Errorf("another client was affected: %s", msg)
	}
	if time.Since(grpcStart) > requestTimeout {
		t.Errorf("the other clients were served only %v into the slow requests, past their deadline", time.Since(grpcStart))
	}

	// The slow ones end at their deadline, everywhere.
	tr.aborted(sseID, sseStart.Add(requestTimeout))
	tr.aborted("slow-grpc", grpcStart.Add(requestTimeout))
	defer tr.logLate(t)
	released, held := tr.finish(time.Until(grpcStart.Add(requestTimeout)) + releaseBound + time.Second)
	row.requests += 2
	row.release = released
	row.errors += len(released) // their deadline, surfaced by ending the stream
	for _, id := range held {
		row.hung++
		var where []string
		for _, n := range f.all() {
			if slices.Contains(ids(listed(t, n)), id) {
				where = append(where, n.name)
			}
		}
		t.Errorf("the slow client's request %s is still held by %v, %v after its %v deadline, the client connected and not reading",
			id, where, releaseBound+time.Second, requestTimeout)
	}
	sseConn.Close()
	grpcStop()
	row.leaks = f.settle(t)
	f.diagnoseHealthy(t)
}

// slowGRPC starts a streaming Generate with no deadline of its own, reads
// its first event and then nothing: the router's sends soon block on HTTP/2
// flow control (the client's windows are fixed at 64 KiB). stop ends it.
func slowGRPC(t *testing.T, routerGRPC, id string) (stop func(), started time.Time) {
	t.Helper()
	conn, err := grpc.NewClient(routerGRPC, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(1<<16), grpc.WithInitialConnWindowSize(1<<16))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	stop = func() { cancel(); conn.Close() }
	started = time.Now()
	s, err := batonv1.NewRouterServiceClient(conn).Generate(ctx, &batonv1.GenerateRequest{RequestId: id, Prompt: "Once upon a time",
		Sampling: &batonv1.SamplingParams{Temperature: proto.Float32(0), MaxNewTokens: 2000, IgnoreEos: true, Logprobs: true, TopLogprobs: 20}})
	if err == nil {
		_, err = s.Recv()
	}
	if err != nil {
		stop()
		t.Fatalf("slow gRPC client: %v", err)
	}
	return stop, started
}

// slowSSE opens a streaming completion whose client reads the headers and
// the first event, then nothing more, with a tiny receive buffer so that
// the router's writes soon block.
func slowSSE(t *testing.T, routerHTTP string) (net.Conn, time.Time) {
	t.Helper()
	d := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		if err := c.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) }); err != nil {
			return err
		}
		return serr
	}}
	conn, err := d.Dial("tcp", routerHTTP)
	if err != nil {
		t.Fatal(err)
	}
	body := `{"prompt":"Once upon a time","max_tokens":2000,"stream":true,"ignore_eos":true,"logprobs":20,"temperature":0}`
	started := time.Now()
	fmt.Fprintf(conn, "POST /v1/completions HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", routerHTTP, len(body), body)
	br := bufio.NewReaderSize(conn, 512)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("streaming completion: %s %s", resp.Status, b)
	}
	if _, err := br.ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	return conn, started
}

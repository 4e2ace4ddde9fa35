//go:build e2e && chaos

package tests

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"google.golang.org/protobuf/proto"
)

// hungShutdownTimeout is decode-0's --shutdown-timeout in the hung-step
// case; exitSlack is what the process may take beyond it (flushing traces,
// unwinding the servers).
const (
	hungShutdownTimeout = 2 * time.Second
	exitSlack           = 3 * time.Second
)

// chaosHungShutdown: SIGTERM to a decode worker whose forward step hangs
// (the freeze hook's hang=true, which stopping the worker does not lift,
// as a kernel that never returns) still ends the process within
// --shutdown-timeout: drain gives up on the step, the worker logs what it
// abandons, and the requests the step held end at once with a status
// instead of hanging on the dead step. The router routes around the
// stopped worker; restarted, it serves again.
func chaosHungShutdown(t *testing.T, row *chaosRow) {
	f := startChaosFleet(t, chaosSpec{prefills: 1, decodes: 2,
		perDecode: func(i int) []string {
			return [][]string{{"--shutdown-timeout", hungShutdownTimeout.String()}, nil}[i]
		}})
	victim, other := f.decodes[0], f.decodes[1]
	decode := batonv1.NewDecodeServiceClient(dial(t, victim.grpc))
	var wg sync.WaitGroup
	var mu sync.Mutex
	var answered []time.Time
	var errs []error
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			s, err := decode.Generate(ctx, &batonv1.DecodeServiceGenerateRequest{PrefillEndpoint: f.prefills[0].grpc,
				Request: &batonv1.GenerateRequest{RequestId: fmt.Sprintf("hung-%d", i), PromptTokenIds: longPrompt(f.golden, 20),
					Sampling: &batonv1.SamplingParams{Temperature: proto.Float32(0), Seed: proto.Uint64(1), MaxNewTokens: 480, IgnoreEos: true}}})
			for err == nil {
				_, err = s.Recv()
			}
			mu.Lock()
			answered = append(answered, time.Now())
			errs = append(errs, err)
			mu.Unlock()
		}()
	}
	waitListed(t, victim, batonv1.RequestState_REQUEST_STATE_RUNNING, 4, 15*time.Second)
	resp, err := chaosHTTP().Post("http://"+adminOf(victim.http)+"/debug/freeze?for=60s&hang=true", "", nil)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("hang %s: %v %v", victim.http, resp, err)
	}
	resp.Body.Close()
	// The step in progress when the hang began completes; the next blocks.
	time.Sleep(300 * time.Millisecond)

	termAt := time.Now()
	victim.p.signal(t, syscall.SIGTERM)
	code := victim.p.wait(t, hungShutdownTimeout+exitSlack+10*time.Second)
	exited := time.Since(termAt)
	t.Logf("decode-0 exited %v after SIGTERM during a hung step (--shutdown-timeout %v), code %d", exited.Round(10*time.Millisecond), hungShutdownTimeout, code)
	if exited > hungShutdownTimeout+exitSlack {
		t.Errorf("decode-0 took %v to exit after SIGTERM during a hung step, want ≤ --shutdown-timeout %v + %v", exited, hungShutdownTimeout, exitSlack)
	}
	if code != 0 {
		t.Errorf("decode-0 exit code %d after SIGTERM, want 0", code)
	}
	if log := victim.p.Stderr(); !strings.Contains(log, "a forward step did not return in time") || !strings.Contains(log, "hung-") {
		t.Errorf("decode-0's log does not name the abandoned step and its requests:\n%s", log)
	}

	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		row.hung += 4 - len(answered)
		t.Fatal("requests held by the hung step still unanswered 10 s after the worker exited")
	}
	for i, err := range errs {
		row.requests++
		row.told = append(row.told, answered[i].Sub(termAt))
		if err == nil || errors.Is(err, io.EOF) {
			row.ok++
			t.Errorf("a request held by the hung step completed: the hang did not hold it")
			continue
		}
		row.errors++ // expected: its worker stopped under it
	}
	took, residue := f.waitIdle(t, 5*time.Second)
	row.release = append(row.release, took)
	for _, r := range residue {
		t.Errorf("not idle after decode-0 stopped: %s", r)
	}
	waitRouterSees(t, f, victim, func(w map[string]any) bool { return w["routable"] == false })
	chaosServeGolden(t, f, row, other, 5)

	f.restart(t, victim)
	f.probe(t)
	row.leaks = f.settle(t)
	row.diagnose = fmt.Sprintf("exited %.1f s after SIGTERM (--shutdown-timeout %v)", exited.Seconds(), hungShutdownTimeout)
}

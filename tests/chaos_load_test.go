//go:build e2e && chaos

package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/baton-serving/baton/engine/testmodel"
	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
)

// chaosLongSteps: the only (prefill, decode) pair serves long prompts on
// the 110M shape under sustained load, with --stall-timeout far below one
// forward step of a prompt. A long step is progress, not a stall: neither
// worker's readiness ever flips, the router's canary never quarantines the
// pair (its probes wait behind the long steps, and decode runs no step for
// max_tokens-1 requests), and no request gets UNAVAILABLE. Before the fix
// prefill went NOT_SERVING in its first long step ("no ready prefill
// worker") and every request failed.
func chaosLongSteps(t *testing.T, row *chaosRow) {
	model := filepath.Join(t.TempDir(), "llama-110m.gguf")
	spec, _ := testmodel.Preset("llama-110m")
	if err := testmodel.Write(model, spec); err != nil {
		t.Fatal(err)
	}
	// Prefill's steps are the long ones. Decode keeps the suite's 2 s: its
	// requests wait on prefill (not its stall), and its short steps share
	// the two cores with prefill's.
	const stallTimeout = 300 * time.Millisecond
	worker := []string{"--max-batch-tokens", "512", "--kv-cache-bytes", "160MiB"}
	f := startChaosFleet(t, chaosSpec{prefills: 1, decodes: 1, model: model,
		prefill: append([]string{"--stall-timeout", stallTimeout.String()}, worker...), decode: worker,
		router: []string{"--canary-interval", "500ms", "--canary-timeout", "1s"}})

	watch := startHealthWatch(f)
	const clients, perClient, promptLen = 4, 4, 480 // one step each; the context is 512
	var o outcomes
	var wg sync.WaitGroup
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perClient {
				prompt := longPrompt(f.golden, promptLen+c*perClient+i) // distinct prompts
				maxTokens := uint32(1)                                  // the TTFT benchmark's probes
				if i == perClient-1 {
					maxTokens = 8
				}
				ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
				_, err := complete(ctx, f.client(t), &batonv1.GenerateRequest{PromptTokenIds: prompt[len(prompt)-promptLen:],
					Sampling: &batonv1.SamplingParams{Temperature: proto.Float32(0), MaxNewTokens: maxTokens, IgnoreEos: true}})
				hard := ctx.Err() != nil
				cancel()
				o.add(err, hard)
			}
		}()
	}
	wg.Wait()
	flips, longest := watch.stop()
	o.fill(row)
	probes := chaosLabelled(f.router.http, "baton_canary_probes_total", "result")
	t.Logf("requests: %s; longest step seen %v (--stall-timeout %v); canary probes %v", o.String(), longest.Round(time.Millisecond), stallTimeout, probes)
	row.diagnose = fmt.Sprintf("longest step %.1f s (--stall-timeout %v), %v busy canaries; %d readiness flips or quarantines",
		longest.Seconds(), stallTimeout, probes["busy"], len(flips))
	if longest <= stallTimeout {
		t.Errorf("no forward step outlived --stall-timeout %v (longest seen %v): the case shows nothing", stallTimeout, longest)
	}
	if probes["busy"] == 0 {
		t.Errorf("no canary probe was late (%v): the case does not exercise the busy rule", probes)
	}
	for _, fl := range flips {
		t.Errorf("under load: %s", fl)
	}
	if n := o.codes[codes.Unavailable]; n > 0 {
		t.Errorf("%d requests got UNAVAILABLE from an overloaded but working pair", n)
	}
	if row.errors > 0 {
		t.Errorf("%d of %d requests failed: %s", row.errors, row.requests, o.String())
	}
	row.leaks = f.settle(t)
}

// healthWatch polls every worker's and the router's /health/ready and the
// router's /debug/workers while a case runs, recording every flip to
// NOT_SERVING and every quarantine, and the longest step in progress the
// workers reported.
type healthWatch struct {
	stopc chan struct{}
	done  chan struct{}

	mu      sync.Mutex
	flips   []string
	longest time.Duration
}

func startHealthWatch(f *chaosFleet) *healthWatch {
	w := &healthWatch{stopc: make(chan struct{}), done: make(chan struct{})}
	start := time.Now()
	note := func(format string, args ...any) {
		w.mu.Lock()
		defer w.mu.Unlock()
		if len(w.flips) < 20 {
			w.flips = append(w.flips, fmt.Sprintf("%.1fs: ", time.Since(start).Seconds())+fmt.Sprintf(format, args...))
		}
	}
	go func() {
		defer close(w.done)
		for {
			select {
			case <-w.stopc:
				return
			case <-time.After(50 * time.Millisecond):
			}
			for _, n := range f.all() {
				// A service too busy to answer within the client's 3 s is
				// not one that says NOT_SERVING: only answers count.
				if body, code := readyState(n); code != http.StatusOK && code != 0 {
					note("%s %s /health/ready %d: %s", n.name, n.http, code, body)
				}
			}
			for _, n := range f.workers() {
				if m, err := chaosMetrics(n.http); err == nil {
					w.mu.Lock()
					w.longest = max(w.longest, time.Duration(m["baton_step_running_seconds"]*float64(time.Second)))
					w.mu.Unlock()
				}
			}
			resp, err := chaosHTTP().Get("http://" + adminOf(f.router.http) + "/debug/workers")
			if err != nil {
				note("router /debug/workers: %v", err)
				continue
			}
			var v any
			err = json.NewDecoder(resp.Body).Decode(&v)
			resp.Body.Close()
			for _, n := range f.workers() {
				if e := workerEntry(v, f.routerAddr[n]); err == nil && e != nil && e["quarantined"] == true {
					note("the router quarantined %s: %v", n.grpc, e["quarantine_reason"])
				}
			}
		}
	}()
	return w
}

// stop ends the watch and returns what it saw.
func (w *healthWatch) stop() (flips []string, longest time.Duration) {
	close(w.stopc)
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.flips, w.longest
}

// readyState is n's /health/ready answer (code 0 when it did not answer).
func readyState(n *node) (string, int) {
	r, err := chaosHTTP().Get("http://" + n.http + "/health/ready")
	if err != nil {
		return err.Error(), 0
	}
	defer r.Body.Close()
	var b strings.Builder
	buf := make([]byte, 512)
	k, _ := r.Body.Read(buf)
	b.Write(buf[:k])
	return strings.TrimSpace(b.String()), r.StatusCode
}

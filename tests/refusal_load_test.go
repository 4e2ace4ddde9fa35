//go:build e2e

package tests

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// floodPromptBytes is the size of each flooding client's prompt: far beyond
// any context window, and within the default --max-body-bytes (4 MiB).
const floodPromptBytes = 3 << 20

// TestOversizedPromptFlood measures what 8 clients sending 3 MB prompts
// do to one client's normal requests (issue 20 item 7): the normal
// client's latency p50/p99 alone, then under the flood, logged (the
// figures are in docs/reliability.md). Wall-clock times are reported,
// never asserted; the test asserts what the flood gets: every oversized
// prompt refused with 400 context_length_exceeded naming "prompt", and
// every normal request served. BATON_FLOOD_REQUESTS sets how many normal
// requests each phase measures (default 20); BATON_FLOOD_INTERVAL how often
// each flooding client starts a request (default 250ms, when its previous
// one has been answered; 0: as fast as it is answered).
func TestOversizedPromptFlood(t *testing.T) {
	n := 20
	if v, err := strconv.Atoi(os.Getenv("BATON_FLOOD_REQUESTS")); err == nil && v > 0 {
		n = v
	}
	interval := 250 * time.Millisecond // each flooding client's pace
	if v, err := time.ParseDuration(os.Getenv("BATON_FLOOD_INTERVAL")); err == nil && v >= 0 {
		interval = v
	}
	c := startCluster(t, workerFlags) // the default --max-body-bytes (4 MiB) takes the flood's bodies
	story := strings.Repeat("Once upon a time ", floodPromptBytes/17)
	for _, fc := range []struct {
		name, path, flood, param string
	}{
		{"completions", "/v1/completions", `{"prompt":"` + story + `","max_tokens":8}`, "prompt"},
		// A chat message is checked by its bytes too, before any
		// template rendering or tokenizing.
		{"chat", "/v1/chat/completions", `{"messages":[{"role":"user","content":"` + story + `"}],"max_tokens":8}`, "messages"},
	} {
		t.Run(fc.name, func(t *testing.T) { oversizedFlood(t, c, n, interval, fc.path, fc.flood, fc.param) })
	}
}

// oversizedFlood is one phase pair of TestOversizedPromptFlood: normal
// completions alone, then while 8 clients post flood to path, each of
// which must be refused with 400 context_length_exceeded naming param.
func oversizedFlood(t *testing.T, c *cluster, n int, interval time.Duration, path, flood, param string) {
	url := "http://" + c.colocated.http + "/v1/completions"
	floodURL := "http://" + c.colocated.http + path
	const normal = `{"prompt":"Once upon a time","max_tokens":8,"temperature":0}`
	measure := func(t *testing.T) []time.Duration {
		var lat []time.Duration
		for range n {
			start := time.Now()
			resp, err := postNoFatal(context.Background(), url, normal, "")
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("a normal request: %s %s", resp.Status, b)
			}
			lat = append(lat, time.Since(start))
			time.Sleep(50 * time.Millisecond) // the normal client's pace: the phase spans the flood
		}
		return lat
	}
	measure(t) // warm up
	alone := measure(t)

	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var sent, refused atomic.Int64
	var bad atomic.Pointer[string]
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				next := time.Now().Add(interval)
				resp, err := postNoFatal(ctx, floodURL, flood, "")
				if err != nil {
					continue // the flood's end cancels its last request
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				sent.Add(1)
				if resp.StatusCode == http.StatusBadRequest && strings.Contains(string(b), `"context_length_exceeded"`) &&
					strings.Contains(string(b), `"param":"`+param+`"`) {
					refused.Add(1)
				} else {
					s := fmt.Sprintf("%s %.300s", resp.Status, b)
					bad.Store(&s)
				}
				select {
				case <-ctx.Done():
				case <-time.After(time.Until(next)):
				}
			}
		}()
	}
	// The flood is under way before the measurement.
	for sent.Load() < 8 {
		time.Sleep(10 * time.Millisecond)
	}
	flooded := measure(t)
	stop()
	wg.Wait()
	if s := bad.Load(); s != nil {
		t.Errorf("an oversized prompt was not refused with 400 context_length_exceeded naming %s: %s", param, *s)
	}
	pct := func(d []time.Duration, p int) time.Duration {
		s := slices.Clone(d)
		slices.Sort(s)
		return s[min(len(s)-1, len(s)*p/100)].Round(100 * time.Microsecond)
	}
	t.Logf("normal requests (%d per phase), p50 / p99: alone %v / %v; with 8 clients flooding %s with %d-byte prompts (one per %v each) %v / %v (%d oversized prompts refused)",
		n, pct(alone, 50), pct(alone, 99), path, floodPromptBytes, interval, pct(flooded, 50), pct(flooded, 99), refused.Load())
}

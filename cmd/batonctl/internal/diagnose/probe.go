package diagnose

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"
	"unicode"

	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/protojson"
)

// probeSpec is the probe request diagnose sends through the router.
type probeSpec struct {
	router    string // HTTP base URL
	client    *http.Client
	prompt    string
	maxTokens int
	timeout   time.Duration
	apiKey    string
	pollEvery time.Duration
}

// runProbe sends one greedy completion through the router's REST API with
// its own trace (a traceparent header) and a deadline that travels to the
// workers (Grpc-Timeout), and meanwhile polls every service's request list
// for it, so that a probe that does not come back can be placed in a stage.
func runProbe(ctx context.Context, spec probeSpec, targets []target) ProbeResult {
	res := ProbeResult{RequestID: "diagnose-" + randomHex(8), TraceID: randomHex(16), Started: time.Now()}
	done := make(chan struct{})
	var (
		mu        sync.Mutex
		sightings []Sighting
		polls     sync.WaitGroup
	)
	polls.Add(1)
	go func() {
		defer polls.Done()
		t := time.NewTicker(spec.pollEvery)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-t.C:
			}
			round := followProbe(ctx, targets, res.RequestID, res.TraceID, min(spec.pollEvery*5, time.Second))
			mu.Lock()
			sightings = append(sightings, round...)
			mu.Unlock()
		}
	}()
	sendProbe(ctx, spec, &res)
	close(done)
	polls.Wait()
	res.Sightings = sightings
	return res
}

// followProbe reads every service's requests once and returns where the
// probe is; every sighting of one round has the same At.
func followProbe(ctx context.Context, targets []target, id, traceID string, timeout time.Duration) []Sighting {
	at := time.Now()
	var (
		wg  sync.WaitGroup
		mu  sync.Mutex
		out []Sighting
	)
	for _, t := range targets {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			reqs, err := t.r.requests(rctx)
			if err != nil {
				return
			}
			for _, r := range reqs {
				if r.ID == id || r.TraceID == traceID {
					mu.Lock()
					out = append(out, Sighting{At: at, Service: t.svc.Name, Role: t.svc.Role, State: r.State, SinceProgress: r.SinceProgress})
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	return out
}

// sendProbe runs the probe request and fills in its outcome.
func sendProbe(ctx context.Context, spec probeSpec, res *ProbeResult) {
	// POST /v1/complete takes the GenerateRequest itself as its body.
	body, err := json.Marshal(map[string]any{
		"request_id": res.RequestID,
		"prompt":     spec.prompt,
		"sampling":   map[string]any{"temperature": 0, "max_new_tokens": spec.maxTokens},
	})
	if err != nil {
		res.Error = err.Error()
		return
	}
	// The client waits a little past the deadline, so that the router's own
	// DEADLINE_EXCEEDED (with its message) normally arrives first.
	cctx, cancel := context.WithTimeout(ctx, spec.timeout+time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(cctx, http.MethodPost, spec.router+"/v1/complete", bytes.NewReader(body))
	if err != nil {
		res.Error = err.Error()
		return
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Traceparent", "00-"+res.TraceID+"-"+randomHex(8)+"-01")
	req.Header.Set("Grpc-Timeout", fmt.Sprintf("%dm", spec.timeout.Milliseconds()))
	if spec.apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+spec.apiKey)
	}
	resp, err := spec.client.Do(req)
	defer func() { res.Took = time.Since(res.Started) }()
	if err != nil {
		res.TimedOut = errors.Is(err, context.DeadlineExceeded)
		res.Error = err.Error()
		return
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		res.TimedOut = errors.Is(err, context.DeadlineExceeded)
		res.Error = "reading the answer: " + err.Error()
		return
	}
	if resp.StatusCode != http.StatusOK {
		var st struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		}
		if json.Unmarshal(b, &st) == nil && (st.Code != 0 || st.Message != "") {
			res.Code, res.Error = codeName(codes.Code(st.Code)), st.Message
		} else {
			res.Error = fmt.Sprintf("HTTP %d %s", resp.StatusCode, shorten(string(b), 200))
		}
		res.TimedOut = res.Code == "DEADLINE_EXCEEDED"
		return
	}
	var out batonv1.CompleteResponse
	if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(b, &out); err != nil {
		res.Error = "decoding the answer: " + err.Error()
		return
	}
	res.OK, res.Text, res.Tokens = true, out.GetText(), len(out.GetTokenIds())
}

// codeName spells a gRPC code as the protocol does (DEADLINE_EXCEEDED).
func codeName(c codes.Code) string {
	if c == codes.OK {
		return "OK"
	}
	var b strings.Builder
	for i, r := range c.String() {
		if i > 0 && unicode.IsUpper(r) {
			b.WriteByte('_')
		}
		b.WriteRune(unicode.ToUpper(r))
	}
	return b.String()
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // crypto/rand.Read never fails
	return hex.EncodeToString(b)
}

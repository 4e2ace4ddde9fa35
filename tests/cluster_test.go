//go:build e2e

package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/baton-serving/baton/engine/refdata"
	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
)

// golden is the part of ../shared/golden/stories260K.json the suites use.
type golden struct {
	Generations []struct {
		Prompt        string  `json:"prompt"`
		PromptIDs     []int32 `json:"prompt_ids"`
		GeneratedIDs  []int32 `json:"generated_ids"`
		GeneratedText string  `json:"generated_text"`
	} `json:"generations"`
}

func loadGolden(t testing.TB) golden {
	t.Helper()
	b, err := os.ReadFile(refdata.Golden(t))
	if err != nil {
		t.Fatal(err)
	}
	var g golden
	if err := json.Unmarshal(b, &g); err != nil {
		t.Fatal(err)
	}
	return g
}

// node is one running service.
type node struct {
	name, grpc, http string
	p                *proc
}

// cluster is a prefill worker, a decode worker, a router doing PD through
// them, and a router doing colocated generation on the same decode worker.
type cluster struct {
	prefill, decode, router, colocated node
}

// startCluster starts the services with extra flags per binary and waits
// until all are ready.
func startCluster(t testing.TB, extra map[string][]string) *cluster {
	t.Helper()
	return startClusterModel(t, refdata.Model(t), extra)
}

// startClusterModel is startCluster on the given model file.
func startClusterModel(t testing.TB, model string, extra map[string][]string) *cluster {
	t.Helper()
	return startClusterModelEnv(t, model, nil, extra)
}

// startClusterEnv is startCluster with extra environment variables for
// every service (startCluster's services never export traces).
func startClusterEnv(t testing.TB, env []string, extra map[string][]string) *cluster {
	t.Helper()
	return startClusterModelEnv(t, refdata.Model(t), env, extra)
}

// startClusterModelEnv starts the cluster on model, with env added to every
// service's environment and extra flags per binary, and waits until all are
// ready.
func startClusterModelEnv(t testing.TB, model string, env []string, extra map[string][]string) *cluster {
	t.Helper()
	ports := freePorts(t, 8)
	addr := func(i int) string { return "127.0.0.1:" + strconv.Itoa(ports[i]) }
	c := &cluster{
		prefill:   node{name: "prefill-svc", grpc: addr(0), http: addr(1)},
		decode:    node{name: "decode-svc", grpc: addr(2), http: addr(3)},
		router:    node{name: "router-svc", grpc: addr(4), http: addr(5)},
		colocated: node{name: "router-svc", grpc: addr(6), http: addr(7)},
	}
	common := []string{"--model", model, "--context-length", "512", "--shutdown-timeout", "5s", "--log-level", "warn"}
	start := func(n *node, key string, args ...string) {
		args = append(append(append([]string{"--grpc-addr", n.grpc, "--http-addr", n.http}, common...), args...), extra[key]...)
		n.p = startProcEnv(t, n.name, env, args...)
	}
	start(&c.prefill, "prefill")
	start(&c.decode, "decode")
	start(&c.router, "router", "--prefill", c.prefill.grpc, "--decode", c.decode.grpc, "--load-interval", "100ms")
	start(&c.colocated, "router", "--prefill", "local", "--decode", c.decode.grpc, "--load-interval", "100ms")
	for _, n := range c.all() {
		waitHTTP(t, n.p, "http://"+n.http+"/health/ready", 30*time.Second)
	}
	return c
}

func (c *cluster) all() []*node { return []*node{&c.prefill, &c.decode, &c.router, &c.colocated} }

func (c *cluster) client(t testing.TB, n node) batonv1.RouterServiceClient {
	return batonv1.NewRouterServiceClient(dial(t, n.grpc))
}

// metrics scrapes a service's /metrics into name -> summed value.
func metrics(t testing.TB, httpAddr string) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for name, f := range scrape(t, httpAddr) {
		for _, m := range f.GetMetric() {
			switch {
			case m.GetGauge() != nil:
				out[name] += m.GetGauge().GetValue()
			case m.GetCounter() != nil:
				out[name] += m.GetCounter().GetValue()
			}
		}
	}
	return out
}

// queueGauges are the gauges that must read 0 on an idle worker.
var queueGauges = []string{
	"baton:num_running_reqs", "baton:num_queue_reqs", "baton:num_prefill_inflight_queue_reqs",
	"baton:num_decode_prealloc_queue_reqs", "baton:num_decode_transfer_queue_reqs",
	"baton_num_prefilling_reqs", "baton_kv_pages_used", "baton_kv_pages_leaked",
}

// waitIdle waits up to within for every queue gauge of both workers and the
// routers' in-flight count to read 0, and returns how long it took.
func (c *cluster) waitIdle(t testing.TB, within time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		var busy []string
		for _, n := range []node{c.prefill, c.decode} {
			m := metrics(t, n.http)
			for _, g := range queueGauges {
				if v := m[g]; v != 0 {
					busy = append(busy, fmt.Sprintf("%s %s=%v", n.name, g, v))
				}
			}
		}
		for _, n := range []node{c.router, c.colocated} {
			if v := metrics(t, n.http)["baton_router_inflight_requests"]; v != 0 {
				busy = append(busy, fmt.Sprintf("router %s inflight=%v", n.grpc, v))
			}
		}
		if len(busy) == 0 {
			return time.Since(start)
		}
		if time.Since(start) > within {
			t.Fatalf("not idle %v after the last request: %v", within, busy)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// complete runs one request to the end and returns its token ids.
func complete(ctx context.Context, c batonv1.RouterServiceClient, req *batonv1.GenerateRequest) (*batonv1.CompleteResponse, error) {
	return c.Complete(ctx, &batonv1.CompleteRequest{Request: req})
}

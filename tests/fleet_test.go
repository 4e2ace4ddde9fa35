//go:build e2e

package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/baton-serving/baton/engine/refdata"
	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
)

// fleet is one router in front of several prefill and decode worker
// processes on loopback.
type fleet struct {
	prefills, decodes []*node
	router            *node
	args              map[*node][]string // each node's flags, to restart it as it was
}

// startFleet starts nPrefill prefill workers (0: colocated mode), nDecode
// decode workers and a router over them, with extra flags per binary
// ("prefill", "decode", "router"), and waits until every service is ready
// and the router's canary passes through every pair (when it is on).
func startFleet(t testing.TB, nPrefill, nDecode int, extra map[string][]string) *fleet {
	t.Helper()
	mp := refdata.Model(t)
	ports := freePorts(t, 2*(nPrefill+nDecode+1))
	addr := func() string {
		a := "127.0.0.1:" + strconv.Itoa(ports[0])
		ports = ports[1:]
		return a
	}
	common := []string{"--model", mp, "--context-length", "512", "--shutdown-timeout", "5s", "--log-level", "warn"}
	f := &fleet{router: &node{name: "router-svc"}, args: map[*node][]string{}}
	prefillArg := "local"
	if nPrefill > 0 {
		var as []string
		for range nPrefill {
			n := &node{name: "prefill-svc", grpc: addr(), http: addr()}
			f.prefills = append(f.prefills, n)
			f.args[n] = slices.Concat(common, extra["prefill"])
			as = append(as, n.grpc)
		}
		prefillArg = strings.Join(as, ",")
	}
	var decodeAddrs []string
	for range nDecode {
		n := &node{name: "decode-svc", grpc: addr(), http: addr()}
		f.decodes = append(f.decodes, n)
		f.args[n] = slices.Concat(common, extra["decode"])
		decodeAddrs = append(decodeAddrs, n.grpc)
	}
	f.router.grpc, f.router.http = addr(), addr()
	f.args[f.router] = slices.Concat(common, []string{"--prefill", prefillArg, "--decode", strings.Join(decodeAddrs, ","),
		"--load-interval", "100ms"}, extra["router"])
	for _, n := range f.all() {
		f.start(t, n)
	}
	for _, n := range f.all() {
		waitHTTP(t, n.p, "http://"+n.http+"/health/ready", 30*time.Second)
	}
	f.waitRoutable(t, f.workers(), 30*time.Second)
	return f
}

func (f *fleet) all() []*node     { return slices.Concat(f.prefills, f.decodes, []*node{f.router}) }
func (f *fleet) workers() []*node { return slices.Concat(f.prefills, f.decodes) }

// start (re)starts n with its flags on its ports.
func (f *fleet) start(t testing.TB, n *node) {
	t.Helper()
	n.p = startProc(t, n.name, slices.Concat([]string{"--grpc-addr", n.grpc, "--http-addr", n.http}, f.args[n])...)
}

// kill9 kills n with SIGKILL, waits until it is gone and returns when it
// was killed.
func (f *fleet) kill9(t testing.TB, n *node) time.Time {
	t.Helper()
	at := time.Now()
	n.p.signal(t, syscall.SIGKILL)
	n.p.wait(t, 5*time.Second)
	return at
}

// restart starts a stopped worker again on its ports and waits until the
// router routes to it again.
func (f *fleet) restart(t testing.TB, n *node) {
	t.Helper()
	f.start(t, n)
	waitHTTP(t, n.p, "http://"+n.http+"/health/ready", 30*time.Second)
	f.waitRoutable(t, []*node{n}, 30*time.Second)
}

func (f *fleet) client(t testing.TB) batonv1.RouterServiceClient {
	return batonv1.NewRouterServiceClient(dial(t, f.router.grpc))
}

// fleetWorker is the part of one worker's entry in the router's
// /debug/workers that the tests read.
type fleetWorker struct {
	Address     string `json:"address"`
	Ready       bool   `json:"ready"`
	Routable    bool   `json:"routable"`
	Quarantined bool   `json:"quarantined"`
	Draining    bool   `json:"draining"`
	Inflight    int64  `json:"inflight"`
	RoutedTotal uint64 `json:"routed_total"`
	CachePages  int    `json:"cache_pages"`
	LastError   string `json:"last_error"`
	Device      string `json:"device"`
	Canary      []struct {
		Pair struct {
			Prefill string `json:"prefill"`
			Decode  string `json:"decode"`
		} `json:"pair"`
		State      string `json:"state"`
		LastResult string `json:"last_result"`
	} `json:"canary"`
}

// fleetView is the part of the router's /debug/workers the tests read.
type fleetView struct {
	Mode   string `json:"mode"`
	Canary *struct {
		PassingPairs int `json:"passing_pairs"`
	} `json:"canary"`
	Prefill *struct {
		Workers []fleetWorker `json:"workers"`
	} `json:"prefill"`
	Decode struct {
		Workers []fleetWorker `json:"workers"`
	} `json:"decode"`
}

// view reads the router's /debug/workers.
func (f *fleet) view(t testing.TB) fleetView {
	t.Helper()
	resp, err := http.Get("http://" + adminOf(f.router.http) + "/debug/workers")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/debug/workers: %s", resp.Status)
	}
	var v fleetView
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		t.Fatalf("/debug/workers: %v", err)
	}
	return v
}

// worker finds a worker's entry in a view.
func (v fleetView) worker(addr string) (fleetWorker, bool) {
	var all []fleetWorker
	if v.Prefill != nil {
		all = v.Prefill.Workers
	}
	for _, w := range append(all, v.Decode.Workers...) {
		if w.Address == addr && !w.Draining {
			return w, true
		}
	}
	return fleetWorker{}, false
}

// waitRoutable waits until the router routes to every node in ns: ready
// and, with the canary on, in a pair whose canary passed.
func (f *fleet) waitRoutable(t testing.TB, ns []*node, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		v := f.view(t)
		var not []string
		for _, n := range ns {
			if w, ok := v.worker(n.grpc); !ok || !w.Routable {
				not = append(not, fmt.Sprintf("%s %+v", n.grpc, w))
			}
		}
		if len(not) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("workers not routable after %v: %v", within, not)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// finished is a worker's count of user requests released (canaries are
// counted apart).
func finished(t testing.TB, n *node) float64 {
	t.Helper()
	return metrics(t, n.http)["baton_requests_finished_total"]
}

// waitIdle waits until every queue gauge of the given workers and the
// router's in-flight count read 0, and returns how long it took.
func (f *fleet) waitIdle(t testing.TB, ws []*node, within time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		var busy []string
		for _, n := range ws {
			m := metrics(t, n.http)
			for _, g := range queueGauges {
				if v := m[g]; v != 0 {
					busy = append(busy, fmt.Sprintf("%s %s %s=%v", n.name, n.grpc, g, v))
				}
			}
		}
		if v := metrics(t, f.router.http)["baton_router_inflight_requests"]; v != 0 {
			busy = append(busy, fmt.Sprintf("router inflight=%v", v))
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

// generate runs one request through the router's gRPC stream and returns
// its token ids and error.
func generate(ctx context.Context, c batonv1.RouterServiceClient, req *batonv1.GenerateRequest) ([]uint32, error) {
	stream, err := c.Generate(ctx, req)
	if err != nil {
		return nil, err
	}
	return tokenIDs(stream.Recv)
}

// tokenIDs reads a generate stream, the router's or decode's, to its end
// and returns the token ids it carried, with the error that ended it early.
func tokenIDs[R interface{ GetEvent() *batonv1.GenerateEvent }](recv func() (R, error)) ([]uint32, error) {
	var ids []uint32
	for {
		resp, err := recv()
		if err == io.EOF {
			return ids, nil
		}
		if err != nil {
			return ids, err
		}
		ids = append(ids, resp.GetEvent().GetTokenIds()...)
	}
}

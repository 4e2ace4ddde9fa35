//go:build e2e && chaos

package tests

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/baton-serving/baton/engine/refdata"
	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/grpc"
)

// chaosFleet is a router in front of prefill and decode workers started
// with the debug hooks, which the chaos cases kill, freeze, restart and cut
// off from each other.
type chaosFleet struct {
	prefills, decodes []*node
	router            *node
	routerConn        *grpc.ClientConn   // one connection for the case: it reconnects after a router restart
	args              map[*node][]string // to restart a node as it was
	routerAddr        map[*node]string   // a worker's gRPC address as the router knows it
	golden            golden
	ownModel          bool               // spec.model: the probe checks completion, not tokens
	idleGoroutines    map[string]float64 // by role, after warm-up
}

// chaosSpec shapes a fleet.
type chaosSpec struct {
	prefills, decodes       int
	prefill, decode, router []string // extra flags
	// routerPrefill maps a prefill's gRPC address to the one the router
	// (and so decode) is given: a proxy in front of it, say.
	routerPrefill func(i int, addr string) string
	// perDecode, when set, adds flags to decode worker i.
	perDecode func(i int) []string
	// model, when set, is served instead of the reference model.
	model string
}

// chaosWorkerFlags are what every chaos worker gets: the freeze hook, a
// small KV cache and a short stall timeout.
func chaosWorkerFlags() []string {
	return []string{"--kv-cache-bytes", "64MiB", "--debug-hooks", "--stall-timeout", "2s"}
}

func startChaosFleet(t *testing.T, spec chaosSpec) *chaosFleet {
	t.Helper()
	mp := cmp.Or(spec.model, refdata.Model(t))
	f := &chaosFleet{router: &node{name: "router-svc"}, args: map[*node][]string{}, routerAddr: map[*node]string{}, golden: loadGolden(t),
		ownModel: spec.model != ""}
	ports := freePorts(t, 2*(spec.prefills+spec.decodes+1))
	addr := func() string {
		a := "127.0.0.1:" + strconv.Itoa(ports[0])
		ports = ports[1:]
		return a
	}
	common := []string{"--model", mp, "--context-length", "512", "--shutdown-timeout", "5s", "--log-level", "warn"}
	var prefillAddrs, decodeAddrs []string
	for i := range spec.prefills {
		n := &node{name: "prefill-svc", grpc: addr(), http: addr()}
		f.prefills = append(f.prefills, n)
		f.args[n] = slices.Concat(common, chaosWorkerFlags(), spec.prefill)
		a := n.grpc
		if spec.routerPrefill != nil {
			a = spec.routerPrefill(i, a)
		}
		prefillAddrs = append(prefillAddrs, a)
		f.routerAddr[n] = a
	}
	for i := range spec.decodes {
		n := &node{name: "decode-svc", grpc: addr(), http: addr()}
		f.decodes = append(f.decodes, n)
		f.args[n] = slices.Concat(common, chaosWorkerFlags(), []string{"--prefill-allow", strings.Join(prefillAddrs, ",")}, spec.decode)
		if spec.perDecode != nil {
			f.args[n] = append(f.args[n], spec.perDecode(i)...)
		}
		decodeAddrs = append(decodeAddrs, n.grpc)
		f.routerAddr[n] = n.grpc
	}
	f.router.grpc, f.router.http = addr(), addr()
	f.args[f.router] = slices.Concat(common, []string{"--prefill", strings.Join(prefillAddrs, ","),
		"--decode", strings.Join(decodeAddrs, ","), "--load-interval", "100ms"}, spec.router)
	for _, n := range f.all() {
		f.start(t, n)
	}
	for _, n := range f.all() {
		waitHTTP(t, n.p, "http://"+n.http+"/health/ready", 30*time.Second)
	}
	// The router is ready with one pair; a worker that was still starting
	// when the router first dialled it joins a moment later. Every case
	// counts on all of them.
	f.waitRoutable(t, f.workers()...)
	f.routerConn = dial(t, f.router.grpc)
	// Warm every pair and every API up (the router's REST gateway connects
	// to its own gRPC port on first use), then take the idle goroutine
	// counts.
	for range 2 * max(spec.prefills, spec.decodes) {
		f.probe(t)
	}
	for _, api := range []struct{ path, body string }{
		{"/v1/complete", `{"prompt":"Once upon a time","sampling":{"max_new_tokens":4}}`},
		{"/v1/completions", `{"prompt":"Once upon a time","max_tokens":4}`},
	} {
		resp, err := chaosHTTP().Post("http://"+f.router.http+api.path, "application/json", strings.NewReader(api.body))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("warm-up POST %s: %s", api.path, resp.Status)
		}
	}
	f.waitIdle(t, 3*time.Second)
	f.idleGoroutines = map[string]float64{}
	for _, n := range f.all() {
		m, err := chaosMetrics(n.http)
		if err != nil {
			t.Fatal(err)
		}
		f.idleGoroutines[n.name] = max(f.idleGoroutines[n.name], m["go_goroutines"])
	}
	return f
}

func (f *chaosFleet) all() []*node {
	return slices.Concat(f.prefills, f.decodes, []*node{f.router})
}

func (f *chaosFleet) workers() []*node { return slices.Concat(f.prefills, f.decodes) }

// start (re)starts n with its flags.
func (f *chaosFleet) start(t *testing.T, n *node) {
	t.Helper()
	n.p = startProc(t, n.name, slices.Concat([]string{"--grpc-addr", n.grpc, "--http-addr", n.http}, f.args[n])...)
}

// restart starts a killed node again on its ports and waits until it and
// the router are ready.
func (f *chaosFleet) restart(t *testing.T, n *node) {
	t.Helper()
	f.start(t, n)
	waitHTTP(t, n.p, "http://"+n.http+"/health/ready", 30*time.Second)
	waitHTTP(t, f.router.p, "http://"+f.router.http+"/health/ready", 30*time.Second)
	if n != f.router {
		f.waitRoutable(t, n)
	}
}

// waitRoutable waits until the router would route to each of ns.
func (f *chaosFleet) waitRoutable(t *testing.T, ns ...*node) {
	t.Helper()
	for _, n := range ns {
		addr := f.routerAddr[n]
		if !routerSeesAddr(t, f, addr, 10*time.Second, func(w map[string]any) bool { return w["routable"] == true }) {
			v, _ := routerWorkers(t, f)
			t.Fatalf("the router did not route to %s within 10 s: %v", addr, workerEntry(v, addr))
		}
	}
}

// kill9 kills n with SIGKILL and waits for it to be gone.
func (f *chaosFleet) kill9(t *testing.T, n *node) time.Time {
	t.Helper()
	at := time.Now()
	n.p.signal(t, syscall.SIGKILL)
	n.p.wait(t, 5*time.Second)
	return at
}

func (f *chaosFleet) client(t *testing.T) batonv1.RouterServiceClient {
	return batonv1.NewRouterServiceClient(f.routerConn)
}

// probe runs the first golden prompt greedily through the router and checks
// the output token for token.
func (f *chaosFleet) probe(t *testing.T) {
	t.Helper()
	gen := f.golden.Generations[0]
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	resp, err := complete(ctx, f.client(t), greedy(gen.Prompt, uint32(len(gen.GeneratedIDs))))
	if err != nil {
		t.Fatalf("golden probe: %v", err)
	}
	if !f.ownModel && !slices.Equal(resp.GetTokenIds(), u32s(gen.GeneratedIDs)) {
		t.Fatalf("golden probe: tokens %v, want %v", resp.GetTokenIds(), gen.GeneratedIDs)
	}
}

// alive is whether n's process is running.
func alive(n *node) bool {
	select {
	case <-n.p.done:
		return false
	default:
		return true
	}
}

// chaosMetrics scrapes /metrics into name -> value summed over labels,
// without failing the test (the service may be dead).
func chaosMetrics(httpAddr string) (map[string]float64, error) {
	fams, err := chaosFamilies(httpAddr)
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for name, f := range fams {
		out[name] = value(f)
	}
	return out, nil
}

// chaosHTTP is the suite's HTTP client. It keeps no connection open
// between requests, so the services' goroutine counts do not depend on
// what the suite read last.
func chaosHTTP() *http.Client {
	return &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
}

func chaosFamilies(httpAddr string) (map[string]*dto.MetricFamily, error) {
	resp, err := chaosHTTP().Get("http://" + httpAddr + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	return parser.TextToMetricFamilies(resp.Body)
}

// chaosLabelled returns a counter's values by the value of one label.
func chaosLabelled(httpAddr, name, label string) map[string]float64 {
	fams, err := chaosFamilies(httpAddr)
	out := map[string]float64{}
	if err != nil || fams[name] == nil {
		return out
	}
	for _, m := range fams[name].GetMetric() {
		for _, lp := range m.GetLabel() {
			if lp.GetName() == label {
				out[lp.GetValue()] += m.GetCounter().GetValue() + m.GetGauge().GetValue()
			}
		}
	}
	return out
}

// waitIdle waits for every live service's queue gauges, page counts and
// in-flight count to read 0, and returns what still does not after within.
func (f *chaosFleet) waitIdle(t *testing.T, within time.Duration) (took time.Duration, residue []string) {
	t.Helper()
	start := time.Now()
	for {
		residue = nil
		for _, n := range f.all() {
			if !alive(n) {
				continue
			}
			m, err := chaosMetrics(n.http)
			if err != nil {
				residue = append(residue, fmt.Sprintf("%s %s: %v", n.name, n.http, err))
				continue
			}
			gauges := queueGauges
			if n == f.router {
				gauges = []string{"baton_router_inflight_requests"}
			}
			for _, g := range gauges {
				if v := m[g]; v != 0 {
					residue = append(residue, fmt.Sprintf("%s %s=%v", n.name, g, v))
				}
			}
		}
		if len(residue) == 0 || time.Since(start) > within {
			return time.Since(start), residue
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// settle is what every case ends with: every gauge of every live service
// back to 0 and no page leaked, goroutines back to their idle counts, and
// the golden output through the router. It returns the leaks it found (0
// when the case passes).
func (f *chaosFleet) settle(t *testing.T) (leaks int) {
	t.Helper()
	_, residue := f.waitIdle(t, 3*time.Second)
	for _, r := range residue {
		t.Errorf("not idle 3 s after the case: %s", r)
	}
	leaks = len(residue)
	for _, n := range f.workers() {
		if !alive(n) {
			continue
		}
		m, err := chaosMetrics(n.http)
		if err != nil {
			continue
		}
		for _, g := range []string{"baton_kv_pages_leaked", "baton_invariant_violations_total"} {
			if v := m[g]; v != 0 {
				t.Errorf("%s %s: %s = %v, want 0", n.name, n.http, g, v)
				leaks++
			}
		}
	}
	deadline := time.Now().Add(3 * time.Second)
	for _, n := range f.all() {
		if !alive(n) {
			continue
		}
		for {
			m, err := chaosMetrics(n.http)
			if err == nil && m["go_goroutines"] <= f.idleGoroutines[n.name]+3 {
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("%s %s: %v goroutines, %v when idle (%v)", n.name, n.http, m["go_goroutines"], f.idleGoroutines[n.name], err)
				leaks++
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	f.probe(t)
	return leaks
}

// releaseTracker measures how long aborted requests stay anywhere: it
// reads every service's /debug/requests every 20 ms and keeps each
// reading. A request aborted at time a counts as released at the end of the
// first reading that started after a and found it on no service (a dead
// service holds nothing). Aborts may be recorded after the fact, with the
// moment they happened.
type releaseTracker struct {
	nodes []*node
	every time.Duration

	mu      sync.Mutex
	rounds  []heldRound
	pending map[string]time.Time
	stop    chan struct{}
	done    chan struct{}
}

// heldRound is one reading of every service.
type heldRound struct {
	start, end time.Time
	held       map[string]string // request id -> a service that listed it
}

func startReleaseTracker(nodes ...*node) *releaseTracker {
	r := &releaseTracker{nodes: nodes, every: 20 * time.Millisecond, pending: map[string]time.Time{},
		stop: make(chan struct{}), done: make(chan struct{})}
	go r.run()
	return r
}

// aborted records that request id was aborted (cancelled, failed, cut
// off) at the given moment.
func (r *releaseTracker) aborted(id string, at time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.pending[id] = at
}

func (r *releaseTracker) run() {
	defer close(r.done)
	for {
		select {
		case <-r.stop:
			return
		case <-time.After(r.every):
		}
		round := heldRound{start: time.Now(), held: map[string]string{}}
		var mu sync.Mutex
		var wg sync.WaitGroup
		complete := true
		for _, n := range r.nodes {
			if !alive(n) {
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				ids, err := debugRequestIDs(chaosHTTP(), n.http)
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					complete = false // unknown: this reading judges nothing
					return
				}
				for _, id := range ids {
					round.held[id] = n.name
				}
			}()
		}
		wg.Wait()
		round.end = time.Now()
		if complete {
			r.mu.Lock()
			r.rounds = append(r.rounds, round)
			r.mu.Unlock()
		}
	}
}

func debugRequestIDs(client *http.Client, httpAddr string) ([]string, error) {
	resp, err := client.Get("http://" + adminOf(httpAddr) + "/debug/requests")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var list struct {
		Requests []struct {
			ID string `json:"request_id"`
		} `json:"requests"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		return nil, err
	}
	ids := make([]string, len(list.Requests))
	for i, r := range list.Requests {
		ids[i] = r.ID
	}
	return ids, nil
}

// releases computes each pending abort's release time from the readings;
// held lists the aborted requests no reading has seen gone yet.
func (r *releaseTracker) releases() (released []time.Duration, held []string) {
	late := r.late(-1)
	for _, l := range late {
		if l.held {
			held = append(held, l.id)
		} else {
			released = append(released, l.took)
		}
	}
	slices.Sort(held)
	return released, held
}

// lateRelease is one aborted request and how long it stayed, where.
type lateRelease struct {
	id   string
	took time.Duration
	last string // the last service seen holding it
	held bool   // still held at the last reading
}

// late lists the aborts released more than bound after they happened (or
// not yet), with the service that held them last.
func (r *releaseTracker) late(bound time.Duration) []lateRelease {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []lateRelease
	for id, at := range r.pending {
		i, _ := slices.BinarySearchFunc(r.rounds, at, func(h heldRound, at time.Time) int { return h.start.Compare(at) })
		last := ""
		for ; i < len(r.rounds) && r.rounds[i].held[id] != ""; i++ {
			last = r.rounds[i].held[id]
		}
		l := lateRelease{id: id, last: last, held: i == len(r.rounds)}
		if !l.held {
			l.took = r.rounds[i].end.Sub(at)
		}
		if l.held || l.took > bound {
			out = append(out, l)
		}
	}
	slices.SortFunc(out, func(a, b lateRelease) int { return cmp.Compare(b.took, a.took) })
	return out
}

// logLate logs the aborts released later than the bound, and where they
// stayed.
func (r *releaseTracker) logLate(t *testing.T) {
	t.Helper()
	for i, l := range r.late(releaseBound) {
		if i == 5 {
			break
		}
		if l.held {
			t.Logf("%s still held, last by %s", l.id, l.last)
		} else {
			t.Logf("%s released %v after its abort, last held by %s", l.id, l.took.Round(time.Millisecond), l.last)
		}
	}
}

// finish waits up to within for every aborted request to be released,
// stops the tracker and returns the release times and what is still held.
func (r *releaseTracker) finish(within time.Duration) ([]time.Duration, []string) {
	deadline := time.Now().Add(within)
	for {
		if _, held := r.releases(); len(held) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	close(r.stop)
	<-r.done
	return r.releases()
}

// chaosRow is one line of the suite's table.
type chaosRow struct {
	name                   string
	requests, ok, canceled int
	errors, hung, leaks    int
	release                []time.Duration
	told                   []time.Duration // from the fault to each failed client's answer
	diagnose               string
	took                   time.Duration
}

func percentile(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	i := int(p*float64(len(s)) + 0.5)
	return s[min(max(i-1, 0), len(s)-1)]
}

func ms(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) }

func chaosTable(rows []chaosRow) string {
	var b bytes.Buffer
	fmt.Fprintf(&b, "| case | requests | ok | cancelled | errors surfaced | clients told within (ms) | hung | release p50 / p99 / max (ms) | leaks | diagnose during the fault | time |\n")
	fmt.Fprintf(&b, "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n")
	var all []time.Duration
	for _, r := range rows {
		rel := "-"
		if len(r.release) > 0 {
			rel = fmt.Sprintf("%s / %s / %s (n=%d)", ms(percentile(r.release, 0.5)), ms(percentile(r.release, 0.99)), ms(slices.Max(r.release)), len(r.release))
			all = append(all, r.release...)
		}
		diag := r.diagnose
		if diag == "" {
			diag = "-"
		}
		told := "-"
		if len(r.told) > 0 {
			told = ms(slices.Max(r.told))
		}
		fmt.Fprintf(&b, "| %s | %d | %d | %d | %d | %s | %d | %s | %d | %s | %s |\n", r.name, r.requests, r.ok, r.canceled, r.errors, told, r.hung, rel, r.leaks, diag, r.took.Round(100*time.Millisecond))
	}
	if len(all) > 0 {
		fmt.Fprintf(&b, "\nrelease after abort over the suite: n=%d p50 %s ms, p99 %s ms, max %s ms (bound 2000 ms)\n",
			len(all), ms(percentile(all, 0.5)), ms(percentile(all, 0.99)), ms(slices.Max(all)))
	}
	return b.String()
}

// diagnoseResult is the part of `batonctl diagnose --json` the suite reads.
type diagnoseResult struct {
	Status   string            `json:"status"`
	ExitCode int               `json:"exit_code"`
	Summary  string            `json:"summary"`
	Services []diagnoseService `json:"services"`
	Probe    *struct {
		OK       bool   `json:"ok"`
		TimedOut bool   `json:"timed_out"`
		Code     string `json:"code"`
		Service  string `json:"service"`
		Stage    string `json:"stage"`
		TraceID  string `json:"trace_id"`
	} `json:"probe"`
}

type diagnoseService struct {
	Name     string   `json:"name"`
	Role     string   `json:"role"`
	HTTP     string   `json:"http"`
	GRPC     string   `json:"grpc"`
	Healthy  bool     `json:"healthy"`
	Down     bool     `json:"down"`
	Stalled  bool     `json:"stalled"`
	Ready    bool     `json:"ready"`
	Stage    string   `json:"stage"`
	Problems []string `json:"problems"`
	Stuck    []struct {
		ID      string `json:"request_id"`
		TraceID string `json:"trace_id"`
	} `json:"stuck"`
}

// diagnose runs `batonctl diagnose --json` against the fleet (workers given
// by their HTTP addresses) and returns its verdict; the exit code must
// match the verdict.
func (f *chaosFleet) diagnose(t *testing.T, args ...string) diagnoseResult {
	t.Helper()
	var ps, ds []string
	for _, n := range f.prefills {
		ps = append(ps, "http://"+n.http)
	}
	for _, n := range f.decodes {
		ds = append(ds, "http://"+n.http)
	}
	full := slices.Concat([]string{"diagnose", "--json", "--router", "http://" + f.router.http, "--router-admin", "http://" + adminOf(f.router.http),
		"--prefill", strings.Join(ps, ","), "--decode", strings.Join(ds, ","),
		"--samples", "3", "--interval", "300ms", "--timeout", "1s", "--stuck-after", "1s", "--probe-timeout", "3s"}, args)
	return runDiagnose(t, full...)
}

func runDiagnose(t *testing.T, args ...string) diagnoseResult {
	t.Helper()
	cmd := exec.Command(filepath.Join(binDir, "batonctl"), args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("batonctl diagnose: %v", err)
	}
	var d diagnoseResult
	if jerr := json.Unmarshal(stdout.Bytes(), &d); jerr != nil {
		t.Fatalf("batonctl diagnose (exit %d): not JSON: %v\n%s\n%s", code, jerr, stdout.String(), stderr.String())
	}
	if d.ExitCode != code {
		t.Errorf("diagnose exited %d but its verdict says %d", code, d.ExitCode)
	}
	t.Logf("diagnose (exit %d): %s", code, d.Summary)
	return d
}

// diagnoseHealthy runs diagnose on the settled fleet, which must find it
// healthy.
func (f *chaosFleet) diagnoseHealthy(t *testing.T) {
	t.Helper()
	if d := f.diagnose(t); d.Status != "healthy" || d.ExitCode != 0 {
		t.Errorf("diagnose after the case: %s (exit %d): %s", d.Status, d.ExitCode, d.Summary)
	}
}

// service returns the verdict for the named service.
func (d diagnoseResult) service(t *testing.T, name string) diagnoseService {
	t.Helper()
	for _, v := range d.Services {
		if v.Name == name {
			return v
		}
	}
	t.Fatalf("diagnose has no verdict for %s: %s", name, d.Summary)
	return diagnoseService{}
}

// selectiveProxy forwards TCP connections to a target; Blackhole stops
// forwarding on the connections that a predicate picks (in both
// directions, without closing them), as a partitioned network does, while
// the others keep flowing.
type selectiveProxy struct {
	lis    net.Listener
	target string

	mu     sync.Mutex
	conns  []*proxiedConn
	freeze func(client net.Addr) bool // which connections are black-holed; nil: none
	done   chan struct{}
}

type proxiedConn struct {
	client, upstream net.Conn
	frozen           chan struct{}
	once             sync.Once
}

func startSelectiveProxy(t *testing.T, target string) *selectiveProxy {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &selectiveProxy{lis: lis, target: target, done: make(chan struct{})}
	go p.serve()
	t.Cleanup(p.close)
	return p
}

func (p *selectiveProxy) addr() string { return p.lis.Addr().String() }

func (p *selectiveProxy) serve() {
	forward(p.lis, p.target, func(c, u net.Conn) {
		p.mu.Lock()
		pc := &proxiedConn{client: c, upstream: u, frozen: make(chan struct{})}
		if p.freeze != nil && p.freeze(c.RemoteAddr()) {
			close(pc.frozen)
		}
		p.conns = append(p.conns, pc)
		p.mu.Unlock()
		go p.pipe(pc, u, c)
		go p.pipe(pc, c, u)
	})
}

// pipe copies src to dst until the connection is black-holed; then it
// holds what it read, forever (until the test ends).
func (p *selectiveProxy) pipe(pc *proxiedConn, dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			select {
			case <-pc.frozen:
				<-p.done
				return
			default:
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if err != io.EOF {
				return
			}
			// Half-close as the peer did.
			if tc, ok := dst.(*net.TCPConn); ok {
				_ = tc.CloseWrite()
			}
			return
		}
	}
}

// blackhole freezes the connections, open now or accepted later, whose
// client address pick chooses.
func (p *selectiveProxy) blackhole(pick func(client net.Addr) bool) (frozen int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.freeze = pick
	for _, pc := range p.conns {
		if pick(pc.client.RemoteAddr()) {
			pc.once.Do(func() { close(pc.frozen) })
			frozen++
		}
	}
	return frozen
}

// heal ends the black hole: the frozen connections break (as a long-dead
// TCP connection finally does) and new ones flow.
func (p *selectiveProxy) heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.freeze = nil
	for _, pc := range p.conns {
		select {
		case <-pc.frozen:
			pc.client.Close()
			pc.upstream.Close()
		default:
		}
	}
}

func (p *selectiveProxy) close() {
	close(p.done)
	p.lis.Close()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, pc := range p.conns {
		pc.client.Close()
		pc.upstream.Close()
	}
}

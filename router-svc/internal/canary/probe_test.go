package canary

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/baton-serving/baton/engine/refdata"
	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// goldenPrompt is the first golden prompt's token ids.
func goldenPrompt(t *testing.T) []uint32 {
	t.Helper()
	b, err := os.ReadFile(refdata.Golden(t))
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Generations []struct {
			PromptIDs []uint32 `json:"prompt_ids"`
		} `json:"generations"`
	}
	if err := json.Unmarshal(b, &f); err != nil {
		t.Fatal(err)
	}
	if len(f.Generations) == 0 || len(f.Generations[0].PromptIDs) < 2 {
		t.Fatal("golden file has no usable prompt")
	}
	return f.Generations[0].PromptIDs
}

// buildWorkers builds the prefill and decode binaries into a temporary
// directory.
func buildWorkers(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	cmd := exec.Command("go", "build", "-o", dir+string(os.PathSeparator), "./prefill-svc", "./decode-svc")
	cmd.Dir = refdata.RepoRoot(t)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building the workers: %v\n%s", err, out)
	}
	return dir
}

// worker is a running prefill or decode binary.
type worker struct {
	name, grpcAddr, httpAddr string
	cmd                      *exec.Cmd
	done                     chan struct{}
	mu                       sync.Mutex
	logs                     bytes.Buffer
}

func (w *worker) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.logs.Write(b)
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// startWorker starts the worker binary name on two free loopback ports and
// waits for it to be ready. The ports come from 127.0.0.1:0, so another
// process can take one between freeAddr's check and the worker's bind (an
// outgoing connection's local port did, in CI): a worker that exits with
// "address already in use" is started again on new ports, up to 5 times.
func startWorker(t *testing.T, bin, name string, args ...string) *worker {
	t.Helper()
	for attempt := 1; ; attempt++ {
		if w := tryStartWorker(t, bin, name, args...); w != nil {
			return w
		}
		if attempt == 5 {
			t.Fatalf("%s: a port was taken before it bound, %d times in a row", name, attempt)
		}
	}
}

// tryStartWorker is one attempt of startWorker: the ready worker, or nil
// when it exited because a port was taken (any other failure fails t).
func tryStartWorker(t *testing.T, bin, name string, args ...string) *worker {
	t.Helper()
	w := &worker{name: name, grpcAddr: freeAddr(t), httpAddr: freeAddr(t), done: make(chan struct{})}
	w.cmd = exec.Command(filepath.Join(bin, name), append([]string{"--grpc-addr", w.grpcAddr, "--http-addr", w.httpAddr,
		"--threads", "1", "--kv-cache-bytes", "16MiB", "--log-format", "text"}, args...)...)
	w.cmd.Env = append(os.Environ(), "OTEL_EXPORTER_OTLP_ENDPOINT=", "OTEL_TRACES_EXPORTER=none", "BATON_MODEL=")
	w.cmd.Stdout, w.cmd.Stderr = w, w
	if err := w.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = w.cmd.Wait(); close(w.done) }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get("http://" + w.httpAddr + "/health/ready")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				t.Cleanup(func() {
					w.kill()
					if t.Failed() {
						w.mu.Lock()
						t.Logf("%s output:\n%s", name, w.logs.String())
						w.mu.Unlock()
					}
				})
				return w
			}
		}
		select {
		case <-w.done:
			w.mu.Lock()
			logs := w.logs.String()
			w.mu.Unlock()
			if strings.Contains(logs, "address already in use") {
				t.Logf("%s: a port was taken before it bound (%s); starting it again", name, strings.TrimSpace(logs))
				return nil
			}
			t.Fatalf("%s exited before it was ready:\n%s", name, logs)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			w.kill()
			t.Fatalf("%s not ready within 30s:\n%s", name, w.logs.String())
		}
	}
}

// kill ends the process as kill -9 does.
func (w *worker) kill() {
	_ = w.cmd.Process.Kill()
	<-w.done
}

// metrics scrapes the worker's /metrics into series -> value; a series is
// its name with its labels as written, e.g. `x_total{finish="length"}`.
func (w *worker) metrics(t *testing.T) map[string]float64 {
	t.Helper()
	resp, err := http.Get("http://" + w.httpAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("metrics line %q: %v", line, err)
		}
		out[line[:i]] = v
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// sum adds every series of the metric name.
func sum(m map[string]float64, name string) float64 {
	total := 0.0
	for k, v := range m {
		if k == name || strings.HasPrefix(k, name+"{") {
			total += v
		}
	}
	return total
}

// conns dials workers once each.
type conns struct {
	mu sync.Mutex
	m  map[string]*grpc.ClientConn
}

func (c *conns) get(addr string) (grpc.ClientConnInterface, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cc, ok := c.m[addr]; ok {
		return cc, nil
	}
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	c.m[addr] = cc
	return cc, nil
}

func (c *conns) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, cc := range c.m {
		cc.Close()
	}
}

// userRequest runs a request that is not a canary through the pair, for
// contrast with the canaries in the workers' metrics.
func userRequest(ctx context.Context, conn grpc.ClientConnInterface, prefill string, prompt []uint32) error {
	greedy := float32(0)
	stream, err := batonv1.NewDecodeServiceClient(conn).Generate(ctx, &batonv1.DecodeServiceGenerateRequest{
		Request: &batonv1.GenerateRequest{RequestId: "req-user-1", PromptTokenIds: prompt,
			Sampling: &batonv1.SamplingParams{Temperature: &greedy, MaxNewTokens: 3, IgnoreEos: true}},
		PrefillEndpoint: prefill,
	})
	if err != nil {
		return err
	}
	for {
		if _, err := stream.Recv(); err == io.EOF {
			return nil
		} else if err != nil {
			return err
		}
	}
}

// TestProbeRealWorkers runs the real probe against real prefill and decode
// workers on stories260K: PD and colocated probes pass through a real KV
// transfer, a probe naming a dead prefill fails, the workers count the
// canaries apart from user traffic, and a tracker quarantines the pair when
// its prefill is killed.
func TestProbeRealWorkers(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the worker binaries")
	}
	model := refdata.Model(t)
	prompt := goldenPrompt(t)
	bin := buildWorkers(t)
	pf := startWorker(t, bin, "prefill-svc", "--model", model)
	dc := startWorker(t, bin, "decode-svc", "--model", model)
	cs := &conns{m: map[string]*grpc.ClientConn{}}
	defer cs.close()
	prober, err := NewProber(ProberOptions{Conn: cs.get, Prompt: prompt})
	if err != nil {
		t.Fatal(err)
	}
	dead := freeAddr(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	pd, colocated := Pair{Prefill: pf.grpcAddr, Decode: dc.grpcAddr}, Pair{Decode: dc.grpcAddr}
	for _, p := range []Pair{pd, colocated} {
		if err := prober.Probe(ctx, p); err != nil {
			t.Fatalf("probe of %s: %v", p, err)
		}
	}
	err = prober.Probe(ctx, Pair{Prefill: dead, Decode: dc.grpcAddr})
	if err == nil || !strings.Contains(err.Error(), dead) {
		t.Fatalf("probe through a dead prefill: %v, want an error naming %s", err, dead)
	}
	if err := prober.Probe(ctx, Pair{Prefill: pf.grpcAddr, Decode: dead}); err == nil {
		t.Fatal("probe of a dead decode passed")
	}
	if n := len(prober.InFlight()); n != 0 {
		t.Fatalf("%d canaries still in flight after their probes returned", n)
	}
	conn, _ := cs.get(dc.grpcAddr)
	if err := userRequest(ctx, conn, pf.grpcAddr, prompt); err != nil {
		t.Fatalf("user request: %v", err)
	}

	// The scheduler reports a request after releasing it, a moment after
	// its stream ended: wait for the user request to be counted.
	eventually(t, "decode to count the user request", func() bool {
		return sum(dc.metrics(t), "baton_requests_finished_total") == 1
	})
	eventually(t, "prefill to count the user request", func() bool {
		return sum(pf.metrics(t), "baton_requests_finished_total") == 1
	})
	dm, pm := dc.metrics(t), pf.metrics(t)
	for _, c := range []struct {
		name string
		m    map[string]float64
		want float64
	}{
		{`baton_canary_requests_total{finish="length"}`, dm, 2}, // PD and colocated
		{`baton_requests_finished_total{finish="length"}`, dm, 1},
		{`baton:time_to_first_token_seconds_count`, dm, 1},
		{`baton:e2e_request_latency_seconds_count`, dm, 1},
		{`baton:kv_transfer_seconds_count`, dm, 1},
		{`baton:inter_token_latency_seconds_count`, dm, 2}, // the user request's 3 tokens
		{`baton_canary_requests_total{finish="handed_over"}`, pm, 1},
		{`baton_requests_finished_total{finish="handed_over"}`, pm, 1},
		{`baton:kv_transfer_seconds_count`, pm, 1},
	} {
		if got := c.m[c.name]; got != c.want {
			t.Errorf("%s = %v, want %v", c.name, got, c.want)
		}
	}
	if got := sum(dm, "baton_request_aborts_total"); got != 0 {
		t.Errorf("decode counts %v aborts; the failed canary's must not count", got)
	}
	if got := sum(dm, "baton_canary_requests_total"); got != 3 {
		t.Errorf("decode counts %v canaries, want 3 (two passed, one failed)", got)
	}
	// Both canaries and the user request moved KV pages: the bytes
	// counter is work done, not a per-request statistic.
	if dm["baton:kv_transfer_bytes_total"] <= 0 || dm["baton:kv_transfer_bytes_total"] != pm["baton:kv_transfer_bytes_total"] {
		t.Errorf("kv bytes: decode %v, prefill %v; want equal and positive", dm["baton:kv_transfer_bytes_total"], pm["baton:kv_transfer_bytes_total"])
	}

	// A tracker over the real probe: the live pair passes, the pair with a
	// dead prefill is quarantined, and killing the prefill quarantines the
	// live pair too.
	tr, logs, _ := newTracker(t, Options{Probe: prober.Probe, Interval: 100 * time.Millisecond, Timeout: 5 * time.Second})
	deadPair := Pair{Prefill: dead, Decode: dc.grpcAddr}
	start(t, tr, pd, deadPair)
	eventually(t, "the live pair to pass", func() bool { return tr.Allowed(pd) })
	eventually(t, "the dead pair to be quarantined", func() bool { return statusOf(tr, deadPair).State == StateQuarantined })
	pf.kill()
	eventually(t, "the pair to be quarantined after its prefill was killed", func() bool { return !tr.Allowed(pd) })
	if st := statusOf(tr, pd); !strings.Contains(st.LastError, pf.grpcAddr) {
		t.Errorf("the quarantined pair's error does not name its prefill: %+v", st)
	}
	if logs.Count("canary: pair quarantined") != 2 {
		t.Errorf("quarantines logged %d times, want 2:\n%s", logs.Count("canary: pair quarantined"), logs)
	}
	if err := tr.Check(ctx); err == nil {
		t.Error("ready with no passing pair")
	}
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		t.Fatal("the test ran out of time")
	}
}

//go:build e2e

package tests

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/baton-serving/baton/engine/refdata"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
)

type service struct {
	bin      string
	services []string // gRPC services reflection must list
}

var services = []service{
	{"prefill-svc", []string{"baton.v1.PrefillService", "baton.v1.WorkerService"}},
	{"decode-svc", []string{"baton.v1.DecodeService", "baton.v1.WorkerService"}},
	{"router-svc", []string{"baton.v1.RouterService"}},
}

// TestServiceLifecycle starts the three services on free loopback ports (the
// router pointing at the two workers) and checks what an operator relies on:
// gRPC health SERVING, /health/ready 200, /metrics in Prometheus text format,
// reflection, and a clean exit 0 on SIGTERM.
func TestServiceLifecycle(t *testing.T) {
	model := refdata.Model(t)
	ports := freePorts(t, 6)
	addr := func(i int) string { return "127.0.0.1:" + strconv.Itoa(ports[i]) }
	procs := map[string]*proc{}
	for i, svc := range services {
		args := []string{"--grpc-addr", addr(2 * i), "--http-addr", addr(2*i + 1), "--model", model, "--shutdown-timeout", "5s", "--grpc-reflection"}
		if svc.bin == "router-svc" {
			args = append(args, "--prefill", addr(0), "--decode", addr(2), "--load-interval", "100ms")
		}
		p := startProc(t, svc.bin, args...)
		procs[svc.bin] = p
		waitHTTP(t, p, "http://"+addr(2*i+1)+"/health/ready", 20*time.Second)
	}
	for i, svc := range services {
		t.Run(svc.bin, func(t *testing.T) {
			conn := dial(t, addr(2*i))
			for _, name := range append([]string{""}, svc.services...) {
				waitServing(t, conn, name)
			}
			checkMetrics(t, "http://"+addr(2*i+1)+"/metrics", svc.bin)
			listed := reflectServices(t, conn)
			for _, want := range append([]string{"grpc.health.v1.Health"}, svc.services...) {
				if !slices.Contains(listed, want) {
					t.Errorf("reflection lists %v, missing %s", listed, want)
				}
			}
		})
	}
	// Stop the router first, as an operator draining a deployment would.
	for _, bin := range []string{"router-svc", "prefill-svc", "decode-svc"} {
		p := procs[bin]
		p.signal(t, syscall.SIGTERM)
		if code := p.wait(t, 10*time.Second); code != 0 {
			t.Errorf("%s: exit code after SIGTERM = %d, want 0\n%s", bin, code, p.Stderr())
		}
		if !strings.Contains(p.Stderr(), `"msg":"stopped"`) {
			t.Errorf("%s: no 'stopped' log line after SIGTERM:\n%s", bin, p.Stderr())
		}
	}
}

// TestRouterReadinessNeedsWorkers checks that readiness is earned: a router
// whose workers are unreachable is alive but not ready, and says why.
func TestRouterReadinessNeedsWorkers(t *testing.T) {
	model := refdata.Model(t)
	ports := freePorts(t, 4)
	grpcAddr := "127.0.0.1:" + strconv.Itoa(ports[0])
	httpAddr := "127.0.0.1:" + strconv.Itoa(ports[1])
	p := startProc(t, "router-svc", "--grpc-addr", grpcAddr, "--http-addr", httpAddr, "--model", model,
		"--prefill", "127.0.0.1:"+strconv.Itoa(ports[2]), "--decode", "127.0.0.1:"+strconv.Itoa(ports[3]))
	waitHTTP(t, p, "http://"+httpAddr+"/health", 20*time.Second)
	resp, err := http.Get("http://" + httpAddr + "/health/ready")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), "no ready prefill worker") {
		t.Errorf("/health/ready = %d %s, want 503 naming the missing workers", resp.StatusCode, body)
	}
	if st := healthStatus(t, dial(t, grpcAddr), ""); st != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("gRPC health = %v, want NOT_SERVING", st)
	}
	p.signal(t, syscall.SIGTERM)
	if code := p.wait(t, 10*time.Second); code != 0 {
		t.Errorf("exit code %d", code)
	}
}

func checkMetrics(t *testing.T, url, service string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s", url, resp.Status)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("/metrics is not Prometheus text: %v", err)
	}
	for name, mf := range families {
		if mf.GetHelp() == "" {
			t.Errorf("metric %s has no HELP", name)
		}
	}
	bi, ok := families["baton_build_info"]
	if !ok {
		t.Fatalf("baton_build_info missing; have %d families", len(families))
	}
	var gotService string
	for _, lp := range bi.GetMetric()[0].GetLabel() {
		if lp.GetName() == "service" {
			gotService = lp.GetValue()
		}
	}
	if gotService != service {
		t.Errorf("baton_build_info service label = %q, want %q", gotService, service)
	}
	for _, want := range []string{"process_cpu_seconds_total", "go_goroutines"} {
		if _, ok := families[want]; !ok {
			t.Errorf("metric %s missing", want)
		}
	}
}

func reflectServices(t *testing.T, conn *grpc.ClientConn) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	stream, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&reflectionpb.ServerReflectionRequest{
		MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range resp.GetListServicesResponse().GetService() {
		names = append(names, s.GetName())
	}
	return names
}

// TestStartupErrors checks that bad start-up input gives one clear line and a
// non-zero exit, never a stack trace.
func TestStartupErrors(t *testing.T) {
	model := refdata.Model(t)
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	busyAddr := busy.Addr().String()
	free := freePorts(t, 2)
	okGRPC := "127.0.0.1:" + strconv.Itoa(free[0])
	okHTTP := "127.0.0.1:" + strconv.Itoa(free[1])

	cases := []struct {
		name     string
		bin      string
		args     []string
		wantCode int
		want     []string
	}{
		{"grpc port in use", "prefill-svc", []string{"--grpc-addr", busyAddr, "--http-addr", okHTTP, "--model", model}, 1, []string{"--grpc-addr", busyAddr, "address already in use"}},
		{"http port in use", "decode-svc", []string{"--grpc-addr", okGRPC, "--http-addr", busyAddr, "--model", model}, 1, []string{"--http-addr", "address already in use"}},
		{"unparsable address", "router-svc", []string{"--grpc-addr", "localhost", "--model", model}, 2, []string{"--grpc-addr", `"localhost"`}},
		{"bad port", "decode-svc", []string{"--http-addr", "127.0.0.1:99999", "--model", model}, 2, []string{"--http-addr", "99999"}},
		{"missing model", "router-svc", []string{"--grpc-addr", okGRPC, "--http-addr", okHTTP, "--model", "/nonexistent/model.gguf"}, 1, []string{"/nonexistent/model.gguf", "no such file"}},
		{"model is a directory", "prefill-svc", []string{"--grpc-addr", okGRPC, "--http-addr", okHTTP, "--model", t.TempDir()}, 1, []string{"--model", "directory"}},
		{"unknown flag", "decode-svc", []string{"--no-such-flag"}, 2, nil},
		{"bad worker list", "router-svc", []string{"--prefill", "nohost", "--model", model}, 2, []string{"--prefill"}},
		{"bad duration", "router-svc", []string{"--shutdown-timeout", "soon", "--model", model}, 2, []string{"shutdown-timeout"}},
		// The test binaries are the default build, without CUDA: a GPU
		// asked for by name is a flag error, not a fall-back to the CPU.
		// (--log-level error: the start-up logs before the device is
		// opened are not the error line.)
		{"cuda without CUDA", "decode-svc", []string{"--grpc-addr", okGRPC, "--http-addr", okHTTP, "--model", model, "--device", "cuda", "--log-level", "error"}, 2, []string{"--device cuda:0", "built without CUDA"}},
		{"cuda:7 without CUDA", "prefill-svc", []string{"--grpc-addr", okGRPC, "--http-addr", okHTTP, "--model", model, "--device", "cuda:7", "--log-level", "error"}, 2, []string{"--device cuda:7", "built without CUDA"}},
		{"unknown device", "decode-svc", []string{"--device", "tpu", "--model", model}, 2, []string{"device", `"tpu"`, "want auto, cpu, cuda or cuda:N"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := startProc(t, c.bin, c.args...)
			if code := p.wait(t, 10*time.Second); code != c.wantCode {
				t.Errorf("exit code = %d, want %d\n%s", code, c.wantCode, p.Stderr())
			}
			if c.want != nil {
				oneLine(t, p.Stderr(), c.want...)
			}
		})
	}
}

// TestEnvOverrides checks that BATON_* variables configure a service and that
// a bad value names the variable.
func TestEnvOverrides(t *testing.T) {
	model := refdata.Model(t)
	free := freePorts(t, 2)
	httpAddr := "127.0.0.1:" + strconv.Itoa(free[1])
	q := startProcEnv(t, "prefill-svc", []string{"BATON_GRPC_ADDR=127.0.0.1:" + strconv.Itoa(free[0]), "BATON_HTTP_ADDR=" + httpAddr, "BATON_MODEL=" + model})
	waitHTTP(t, q, "http://"+httpAddr+"/health/ready", 20*time.Second)
	q.signal(t, syscall.SIGTERM)
	if code := q.wait(t, 10*time.Second); code != 0 {
		t.Errorf("exit code %d", code)
	}

	r := startProcEnv(t, "decode-svc", []string{"BATON_SHUTDOWN_TIMEOUT=forever", "BATON_MODEL=" + model})
	if code := r.wait(t, 10*time.Second); code != 2 {
		t.Errorf("exit code %d, want 2", code)
	}
	oneLine(t, r.Stderr(), "BATON_SHUTDOWN_TIMEOUT")
}

// TestBatonctlUp runs the launcher as an operator would: all three services
// come up on the documented port layout, answer health and metrics, and stop
// with exit 0 on SIGTERM.
func TestBatonctlUp(t *testing.T) {
	model := refdata.Model(t)
	base := consecutiveFreePorts(t, 9) // 6 gRPC and HTTP, 3 admin
	p, logDir := startUp(t, 30*time.Second, nil, "--port-base", strconv.Itoa(base), "--model", model)
	for i, want := range map[int]string{1: "baton.v1.RouterService", 2: "baton.v1.PrefillService", 4: "baton.v1.DecodeService"} {
		waitServing(t, dial(t, fmt.Sprintf("127.0.0.1:%d", base+i)), want)
	}
	checkMetrics(t, fmt.Sprintf("http://127.0.0.1:%d/metrics", base), "router-svc")
	checkMetrics(t, fmt.Sprintf("http://127.0.0.1:%d/metrics", base+3), "prefill-svc")
	checkMetrics(t, fmt.Sprintf("http://127.0.0.1:%d/metrics", base+5), "decode-svc")

	p.signal(t, syscall.SIGTERM)
	if code := p.wait(t, 20*time.Second); code != 0 {
		t.Errorf("batonctl up exit code = %d, want 0\n%s", code, p.Stderr())
	}
	if n := strings.Count(upLogs(t, logDir), `"msg":"stopped"`); n != 3 {
		t.Errorf("%d services logged a clean stop, want 3:\n%s", n, upLogs(t, logDir))
	}
	// Nothing may still listen on the layout's ports.
	for i := range 6 {
		if c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", base+i), 200*time.Millisecond); err == nil {
			c.Close()
			t.Errorf("port %d still accepts connections after batonctl up stopped", base+i)
		}
	}
}

// TestBatonctlUpPortTaken checks that a service failing to start fails the
// launcher with its reason, and that the services already started are stopped.
func TestBatonctlUpPortTaken(t *testing.T) {
	model := refdata.Model(t)
	base := consecutiveFreePorts(t, 9)                                  // 6 gRPC and HTTP, 3 admin
	busy, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", base+4)) // decode gRPC
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	p := startProc(t, "batonctl", "up", "--port-base", strconv.Itoa(base), "--model", model, "--bin-dir", binDir, "--log-dir", t.TempDir())
	if code := p.wait(t, 30*time.Second); code == 0 {
		t.Fatalf("batonctl up succeeded with its decode port taken")
	}
	last := strings.TrimSpace(p.Stderr())
	last = last[strings.LastIndex(last, "\n")+1:]
	for _, w := range []string{"decode-svc", "address already in use"} {
		if !strings.Contains(last, w) {
			t.Errorf("last line %q does not mention %q", last, w)
		}
	}
	if c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", base+2), 200*time.Millisecond); err == nil {
		c.Close()
		t.Errorf("prefill still listening after the launcher failed")
	}
}

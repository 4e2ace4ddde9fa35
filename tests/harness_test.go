//go:build e2e

package tests

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/baton-serving/baton/engine/refdata"
	"github.com/baton-serving/baton/svckit/tlsconf"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// binDir holds the binaries built once by TestMain.
var binDir string

// certDir holds a development CA and router, prefill and decode
// certificates written by TestMain with `batonctl certs`.
var certDir string

// e2eTLS is BATON_E2E_TLS=1: every router-svc, prefill-svc and decode-svc
// the suite starts gets its role's certificate (BATON_TLS_CERT, _KEY,
// _CA), batonctl up gets --tls, and dial reaches the workers it knows with
// the router's certificate. The router's own ports stay plaintext.
var e2eTLS = os.Getenv("BATON_E2E_TLS") == "1"

// workerRoles maps the gRPC address of each worker the suite started to its
// role and the directory of the certificates it was given, so that dial can
// use TLS for workers when e2eTLS.
var workerRoles sync.Map // string -> workerTLS

type workerTLS struct {
	role    tlsconf.Role
	certDir string // certDir, or batonctl up --tls's own
}

// serviceRoles are the services' certificate roles.
var serviceRoles = map[string]tlsconf.Role{"router-svc": tlsconf.Router, "prefill-svc": tlsconf.Prefill, "decode-svc": tlsconf.Decode}

// tlsEnv is the environment that gives a service role's certificate.
func tlsEnv(role tlsconf.Role) []string {
	f := tlsconf.FilesIn(certDir, role)
	return []string{"BATON_TLS_CERT=" + f.Cert, "BATON_TLS_KEY=" + f.Key, "BATON_TLS_CA=" + f.CA}
}

// grpcAddrOf is the --grpc-addr in args, else BATON_GRPC_ADDR in env.
func grpcAddrOf(args, env []string) string {
	for i, a := range args {
		if (a == "--grpc-addr" || a == "-grpc-addr") && i+1 < len(args) {
			return args[i+1]
		}
		if v, ok := strings.CutPrefix(a, "--grpc-addr="); ok {
			return v
		}
	}
	for _, e := range env {
		if v, ok := strings.CutPrefix(e, "BATON_GRPC_ADDR="); ok {
			return v
		}
	}
	return ""
}

func TestMain(m *testing.M) {
	code, err := buildAndRun(m)
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		os.Exit(1)
	}
	os.Exit(code)
}

func buildAndRun(m *testing.M) (int, error) {
	root, err := refdata.Root()
	if err != nil {
		return 0, err
	}
	dir, err := os.MkdirTemp("", "baton-e2e-bin-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	cmd := exec.Command("go", "build", "-o", dir+string(os.PathSeparator),
		"./router-svc", "./prefill-svc", "./decode-svc", "./cmd/batonctl")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return 0, fmt.Errorf("building binaries: %v\n%s", err, out)
	}
	binDir = dir
	certDir = filepath.Join(dir, "certs")
	if out, err := exec.Command(filepath.Join(dir, "batonctl"), "certs", "--out", certDir).CombinedOutput(); err != nil {
		return 0, fmt.Errorf("batonctl certs: %v\n%s", err, out)
	}
	return m.Run(), nil
}

// Ports for the services the suite starts come from below the kernel's
// ephemeral range (ip_local_port_range): a port found free there cannot
// be taken, between the check and the service's bind, as the local port
// of some outgoing connection — which "127.0.0.1:0" ports can, and did
// ("bind: address already in use"). A cursor that only moves forward
// keeps one test process from handing out a port twice.
var portCursor struct {
	sync.Mutex
	next, low, high int
}

// ephemeralLow is the first port of the kernel's ephemeral range.
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if lo, err := strconv.Atoi(f[0]); err == nil && lo > 12000 {
				return lo
			}
		}
	}
	return 32768
}

// takePorts returns the next n consecutive ports that are free now (n = 1
// for a single port), advancing the cursor past them.
func takePorts(t testing.TB, n int) int {
	t.Helper()
	portCursor.Lock()
	defer portCursor.Unlock()
	if portCursor.high == 0 {
		portCursor.low, portCursor.high = 10000, ephemeralLow()
		portCursor.next = portCursor.low + (os.Getpid()*97)%(portCursor.high-portCursor.low)
	}
	span := portCursor.high - portCursor.low
	for tried := 0; tried < span; {
		base := portCursor.next
		if base+n > portCursor.high {
			base = portCursor.low
		}
		ok := true
		var ls []net.Listener
		for i := range n {
			l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(base+i))
			if err != nil {
				ok = false
				break
			}
			ls = append(ls, l)
		}
		for _, l := range ls {
			l.Close()
		}
		portCursor.next = base + max(len(ls), 1)
		if ok {
			portCursor.next = base + n
			return base
		}
		tried += max(len(ls), 1)
	}
	t.Fatalf("no run of %d free ports below %d", n, portCursor.high)
	return 0
}

// freePorts returns n distinct loopback ports that are free now.
func freePorts(t testing.TB, n int) []int {
	t.Helper()
	ports := make([]int, n)
	for i := range ports {
		ports[i] = takePorts(t, 1)
	}
	return ports
}

// consecutiveFreePorts finds a base port whose next n ports are free.
func consecutiveFreePorts(t testing.TB, n int) int {
	t.Helper()
	return takePorts(t, n)
}

// proc is a started binary whose stderr is captured.
type proc struct {
	name   string
	cmd    *exec.Cmd
	mu     sync.Mutex
	stderr bytes.Buffer
	stdout bytes.Buffer
	done   chan struct{}
	err    error
}

func startProc(t testing.TB, name string, args ...string) *proc {
	t.Helper()
	return startProcEnv(t, name, nil, args...)
}

// startProcEnv starts a binary with extra environment variables. Tracing
// export and BATON_MODEL are cleared so the host's environment cannot leak in.
func startProcEnv(t testing.TB, name string, env []string, args ...string) *proc {
	t.Helper()
	return startProcIn(t, binDir, name, env, args...)
}

// startProcIn is startProcEnv with the binary taken from dir (the
// cuda-tagged binaries of TestCUDAEmulated).
func startProcIn(t testing.TB, dir, name string, env []string, args ...string) *proc {
	t.Helper()
	p := &proc{name: name, done: make(chan struct{})}
	p.cmd = exec.Command(filepath.Join(dir, name), args...)
	p.cmd.Stderr = lockedWriter{&p.mu, &p.stderr}
	p.cmd.Stdout = lockedWriter{&p.mu, &p.stdout}
	base := append(os.Environ(), "OTEL_EXPORTER_OTLP_ENDPOINT=", "BATON_MODEL=")
	if role, ok := serviceRoles[name]; ok {
		if e2eTLS {
			base = append(base, tlsEnv(role)...) // before env: a test's own BATON_TLS_* wins
		}
		if role != tlsconf.Router {
			if a := grpcAddrOf(args, env); a != "" {
				workerRoles.Store(a, workerTLS{role, certDir})
			}
		}
	}
	if _, ok := serviceRoles[name]; ok {
		env = withAdminAddr(t, args, env)
	}
	p.cmd.Env = append(base, env...)
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = p.cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("%s stderr:\n%s", name, p.Stderr())
		}
	})
	return p
}

// startUp runs `batonctl up` with the suite's binaries, the given
// arguments and extra environment, its service logs in a temporary
// directory, and waits for its banner. It returns the process and the log
// directory (see upLogs).
func startUp(t testing.TB, within time.Duration, env []string, args ...string) (*proc, string) {
	t.Helper()
	logDir := t.TempDir()
	if e2eTLS {
		args = append([]string{"--tls"}, args...)
	}
	registerUpWorkers(args, filepath.Join(logDir, "certs"))
	p := startProcEnv(t, "batonctl", env, append([]string{"up", "--bin-dir", binDir, "--log-dir", logDir}, args...)...)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("batonctl up's service logs:\n%s", upLogs(t, logDir))
		}
	})
	deadline := time.Now().Add(within)
	for !strings.Contains(p.Stdout(), "Baton is up") {
		if time.Now().After(deadline) {
			t.Fatalf("batonctl up not up in time:\n%s\n%s", p.Stdout(), p.Stderr())
		}
		select {
		case <-p.done:
			t.Fatalf("batonctl up exited: %v\n%s", p.err, p.Stderr())
		case <-time.After(50 * time.Millisecond):
		}
	}
	return p, logDir
}

// registerUpWorkers records the worker gRPC addresses of batonctl up's
// port layout (up.Layout: prefill P+2, decode P+4, further prefill workers
// from P+6, then further decode workers) for dial, with the certificates
// batonctl up --tls writes into dir.
func registerUpWorkers(args []string, dir string) {
	val := func(flag string, def int) int {
		for i, a := range args {
			if a == flag && i+1 < len(args) {
				if n, err := strconv.Atoi(args[i+1]); err == nil {
					return n
				}
			}
		}
		return def
	}
	base := val("--port-base", 0)
	if base == 0 {
		return
	}
	prefills, decodes := val("--prefill-workers", 1), val("--decode-workers", 1)
	at := func(port int, role tlsconf.Role) {
		workerRoles.Store("127.0.0.1:"+strconv.Itoa(port), workerTLS{role, dir})
	}
	at(base+2, tlsconf.Prefill)
	at(base+4, tlsconf.Decode)
	next := base + 6
	for range prefills - 1 {
		at(next, tlsconf.Prefill)
		next += 2
	}
	for range decodes - 1 {
		at(next, tlsconf.Decode)
		next += 2
	}
}

// upLogs is every service log batonctl up wrote into dir, each file's lines
// after its name.
func upLogs(t testing.TB, dir string) string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.log"))
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, f := range files {
		body, err := os.ReadFile(f)
		if err != nil {
			t.Errorf("reading %s: %v", f, err)
		}
		fmt.Fprintf(&b, "== %s\n%s", filepath.Base(f), body)
	}
	return b.String()
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}

func (p *proc) Stderr() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stderr.String()
}

func (p *proc) Stdout() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stdout.String()
}

// wait waits for the process to exit and returns its exit code.
func (p *proc) wait(t testing.TB, within time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(within):
		t.Fatalf("%s did not exit within %v", p.name, within)
	}
	return p.cmd.ProcessState.ExitCode()
}

func (p *proc) signal(t testing.TB, sig syscall.Signal) {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("signal %s: %v", p.name, err)
	}
}

// waitHTTP polls url until it answers 200 or the process exits.
func waitHTTP(t testing.TB, p *proc, url string, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		resp, err := http.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		select {
		case <-p.done:
			t.Fatalf("%s exited before %s was ready: %v\n%s", p.name, url, p.err, p.Stderr())
		case <-time.After(50 * time.Millisecond):
		}
	}
	t.Fatalf("%s: %s not ready within %v", p.name, url, within)
}

// dial opens a plain-text gRPC connection; with BATON_E2E_TLS=1, a worker
// the suite started is dialed with mutual TLS as the router.
func dial(t testing.TB, addr string) *grpc.ClientConn {
	t.Helper()
	return dialAs(t, addr, tlsconf.Router)
}

// dialAs is dial presenting as's certificate under BATON_E2E_TLS=1: a test
// that plays decode towards prefill (TransferKV) dials as decode.
func dialAs(t testing.TB, addr string, as tlsconf.Role) *grpc.ClientConn {
	t.Helper()
	creds := grpc.WithTransportCredentials(insecure.NewCredentials())
	if w, ok := workerRoles.Load(addr); ok && e2eTLS {
		w := w.(workerTLS)
		creds = tlsDialOptionIn(t, w.certDir, as, w.role)
	}
	conn, err := grpc.NewClient(addr, creds)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// tlsDialOption is mutual TLS with as's certificate to a server of role want.
func tlsDialOption(t testing.TB, as, want tlsconf.Role) grpc.DialOption {
	t.Helper()
	return tlsDialOptionIn(t, certDir, as, want)
}

// tlsDialOptionIn is tlsDialOption with the certificates in dir.
func tlsDialOptionIn(t testing.TB, dir string, as, want tlsconf.Role) grpc.DialOption {
	t.Helper()
	id, err := tlsconf.Load(tlsconf.FilesIn(dir, as), nil)
	if err != nil {
		t.Fatal(err)
	}
	return id.DialOption(want)
}

// healthStatus asks the standard gRPC health service about service ("" = the server).
func healthStatus(t testing.TB, conn *grpc.ClientConn, service string) healthpb.HealthCheckResponse_ServingStatus {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: service})
	if err != nil {
		t.Fatalf("health check %q: %v", service, err)
	}
	return resp.GetStatus()
}

// waitServing polls the gRPC health service until service reports SERVING.
func waitServing(t testing.TB, conn *grpc.ClientConn, service string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		st := healthStatus(t, conn, service)
		if st == healthpb.HealthCheckResponse_SERVING {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("health of %q = %v after 10s, want SERVING", service, st)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// oneLine asserts that a start-up failure printed one clear line: no stack
// trace, no panic, and the expected words.
func oneLine(t testing.TB, stderr string, want ...string) {
	t.Helper()
	s := strings.TrimSpace(stderr)
	if n := strings.Count(s, "\n"); n != 0 {
		t.Errorf("want a one-line error, got %d lines:\n%s", n+1, s)
	}
	for _, bad := range []string{"panic", "goroutine ", ".go:"} {
		if strings.Contains(s, bad) {
			t.Errorf("error output looks like a crash (%q):\n%s", bad, s)
		}
	}
	for _, w := range want {
		if !strings.Contains(s, w) {
			t.Errorf("error %q does not mention %q", s, w)
		}
	}
}

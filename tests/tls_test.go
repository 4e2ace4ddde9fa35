//go:build e2e

package tests

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/baton-serving/baton/engine/refdata"
	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"github.com/baton-serving/baton/svckit/tlsconf"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// tlsCluster is a prefill worker, a decode worker and a router, each given
// its role's certificate through BATON_TLS_CERT, _KEY and _CA (the
// environment, so that a build without the flags starts them anyway, in
// plaintext, and the test shows what a client without a certificate could
// reach).
func startTLSCluster(t *testing.T) *cluster {
	t.Helper()
	ports := freePorts(t, 6)
	addr := func(i int) string { return "127.0.0.1:" + strconv.Itoa(ports[i]) }
	c := &cluster{
		prefill: node{name: "prefill-svc", grpc: addr(0), http: addr(1)},
		decode:  node{name: "decode-svc", grpc: addr(2), http: addr(3)},
		router:  node{name: "router-svc", grpc: addr(4), http: addr(5)},
	}
	common := []string{"--model", refdata.Model(t), "--context-length", "512", "--shutdown-timeout", "5s", "--log-level", "warn"}
	start := func(n *node, role tlsconf.Role, args ...string) {
		n.p = startProcEnv(t, n.name, tlsEnv(role), append(append([]string{"--grpc-addr", n.grpc, "--http-addr", n.http}, common...), args...)...)
	}
	start(&c.prefill, tlsconf.Prefill, workerFlags["prefill"]...)
	start(&c.decode, tlsconf.Decode, workerFlags["decode"]...)
	start(&c.router, tlsconf.Router, "--prefill", c.prefill.grpc, "--decode", c.decode.grpc, "--load-interval", "100ms")
	for _, n := range []*node{&c.prefill, &c.decode, &c.router} {
		waitHTTP(t, n.p, "http://"+n.http+"/health/ready", 30*time.Second)
	}
	return c
}

// healthErr is the error of one gRPC health check at addr over opt.
func healthErr(t *testing.T, addr string, opt grpc.DialOption) error {
	t.Helper()
	conn, err := grpc.NewClient(addr, opt)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	return err
}

// noCertTLS is a TLS client that trusts the suite's CA but presents no
// certificate.
func noCertTLS(t *testing.T) grpc.DialOption {
	t.Helper()
	ca, err := os.ReadFile(tlsconf.FilesIn(certDir, tlsconf.Router).CA)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	return grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: pool, ServerName: "localhost", MinVersion: tls.VersionTLS13}))
}

// TestTLSWorkers: with --tls-cert, --tls-key and --tls-ca, a worker's gRPC
// port refuses a client without a certificate (the handshake fails), a
// certificate of the wrong role is refused with PERMISSION_DENIED naming
// the roles, the router's certificate works, and requests flow from the
// router through prefill and decode. The router's own port stays
// plaintext for clients.
func TestTLSWorkers(t *testing.T) {
	c := startTLSCluster(t)
	plain := grpc.WithTransportCredentials(insecure.NewCredentials())
	for _, w := range []node{c.prefill, c.decode} {
		if err := healthErr(t, w.grpc, plain); err == nil {
			t.Fatalf("a plaintext client without a certificate reached %s's gRPC port %s", w.name, w.grpc)
		} else if status.Code(err) != codes.Unavailable {
			t.Errorf("plaintext client at %s: %v, want UNAVAILABLE (no connection)", w.name, err)
		}
		if err := healthErr(t, w.grpc, noCertTLS(t)); err == nil {
			t.Fatalf("a TLS client without a certificate reached %s's gRPC port %s", w.name, w.grpc)
		} else if status.Code(err) != codes.Unavailable {
			t.Errorf("TLS client without a certificate at %s: %v, want the handshake to fail", w.name, err)
		}
	}

	// The prefill certificate may not call decode (only the router may).
	conn, err := grpc.NewClient(c.decode.grpc, tlsDialOption(t, tlsconf.Prefill, tlsconf.Decode))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = batonv1.NewWorkerServiceClient(conn).Info(ctx, &batonv1.InfoRequest{})
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(status.Convert(err).Message(), "peer certificate role prefill, want router") {
		t.Fatalf("prefill's certificate calling decode's WorkerService.Info: %v, want PERMISSION_DENIED \"peer certificate role prefill, want router\"", err)
	}
	stream, err := batonv1.NewDecodeServiceClient(conn).Generate(ctx, &batonv1.DecodeServiceGenerateRequest{})
	if err == nil {
		_, err = stream.Recv()
	}
	if status.Code(err) != codes.PermissionDenied {
		t.Fatalf("prefill's certificate calling decode's Generate: %v, want PERMISSION_DENIED", err)
	}
	// The router's certificate may, and a client expecting prefill at
	// decode's address is refused by its own check of the server's role.
	if err := healthErr(t, c.decode.grpc, tlsDialOption(t, tlsconf.Router, tlsconf.Decode)); err != nil {
		t.Fatalf("router's certificate at decode: %v", err)
	}
	if err := healthErr(t, c.decode.grpc, tlsDialOption(t, tlsconf.Router, tlsconf.Prefill)); err == nil ||
		!strings.Contains(err.Error(), "server certificate role decode, want prefill") {
		t.Fatalf("a router expecting prefill at decode's address: %v", err)
	}

	// A request through the (plaintext) router: the router reaches both
	// workers and decode pulls the KV cache from prefill, all over mTLS.
	g := loadGolden(t)
	gen := g.Generations[0]
	resp, err := complete(ctx, c.client(t, c.router), greedy(gen.Prompt, uint32(len(gen.GeneratedIDs))))
	if err != nil {
		t.Fatalf("request through the router with mTLS to the workers: %v", err)
	}
	if !slices.Equal(resp.GetTokenIds(), u32s(gen.GeneratedIDs)) {
		t.Fatalf("generated ids %v, want %v", resp.GetTokenIds(), gen.GeneratedIDs)
	}
}

// TestTLSWrongRoleAtStartup: a worker given another role's certificate
// refuses to start, in one line naming the flag and both roles; so does a
// partial flag set.
func TestTLSWrongRoleAtStartup(t *testing.T) {
	ports := freePorts(t, 2)
	args := []string{"--grpc-addr", "127.0.0.1:" + strconv.Itoa(ports[0]), "--http-addr", "127.0.0.1:" + strconv.Itoa(ports[1]), "--model", refdata.Model(t)}
	p := startProcEnv(t, "decode-svc", tlsEnv(tlsconf.Prefill), args...)
	if code := p.wait(t, 30*time.Second); code != 2 {
		t.Fatalf("decode-svc with prefill's certificate: exit %d, want 2\n%s", code, p.Stderr())
	}
	oneLine(t, p.Stderr(), "--tls-cert", "certificate role prefill, want decode")

	f := tlsconf.FilesIn(certDir, tlsconf.Decode)
	p = startProcEnv(t, "decode-svc", []string{"BATON_TLS_CERT=", "BATON_TLS_KEY=", "BATON_TLS_CA="}, append(args, "--tls-cert", f.Cert)...)
	if code := p.wait(t, 30*time.Second); code != 2 {
		t.Fatalf("decode-svc with --tls-cert only: exit %d, want 2\n%s", code, p.Stderr())
	}
	oneLine(t, p.Stderr(), "--tls-key", "all three or none")
}

// TestBatonctlUpTLS: with batonctl up --tls a client without a certificate
// cannot reach a worker's gRPC port, while requests through the router
// work.
func TestBatonctlUpTLS(t *testing.T) {
	base := consecutiveFreePorts(t, 9) // 6 gRPC and HTTP, 3 admin
	args := []string{"--port-base", strconv.Itoa(base), "--model", refdata.Model(t)}
	if !e2eTLS { // startUp adds it then
		args = append(args, "--tls")
	}
	p, _ := startUp(t, 60*time.Second, []string{"BATON_KV_CACHE_BYTES=64MiB", "BATON_THREADS=1"}, args...)
	plain := grpc.WithTransportCredentials(insecure.NewCredentials())
	for _, port := range []int{base + 2, base + 4} { // prefill's and decode's gRPC ports
		addr := "127.0.0.1:" + strconv.Itoa(port)
		if err := healthErr(t, addr, plain); err == nil {
			t.Fatalf("a client without a certificate reached the worker gRPC port %s", addr)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := complete(ctx, batonv1.NewRouterServiceClient(dial(t, "127.0.0.1:"+strconv.Itoa(base+1))), greedy("Once upon a time", 8))
	if err != nil || len(resp.GetTokenIds()) != 8 {
		t.Fatalf("request through batonctl up --tls's router: %v %v", resp, err)
	}
	if !strings.Contains(p.Stderr(), "mutual TLS on") {
		t.Errorf("batonctl up did not say TLS is on:\n%s", p.Stderr())
	}
}

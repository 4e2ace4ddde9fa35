package tlsconf

import (
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// devDir writes a development CA and role certificates into a temporary
// directory.
func devDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := WriteDevCerts(dir, DevOptions{Hosts: []string{"worker.example", "10.1.2.3"}}); err != nil {
		t.Fatal(err)
	}
	return dir
}

func mustLoad(t *testing.T, f Files) *Identity {
	t.Helper()
	id, err := Load(f, nil)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// serve starts a real gRPC server with mutual TLS as role on loopback,
// serving the health service, authorized by p. It returns the address.
func serve(t *testing.T, dir string, role Role, p Policy) string {
	t.Helper()
	id := mustLoad(t, FilesIn(dir, role))
	srv := grpc.NewServer(ServerOptions(id, p, toStatus)...)
	healthpb.RegisterHealthServer(srv, health.NewServer())
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(lis) }()
	t.Cleanup(func() { srv.Stop(); <-done })
	return lis.Addr().String()
}

// check calls the health service at addr over opt.
func check(t *testing.T, addr string, opt grpc.DialOption) error {
	t.Helper()
	conn, err := grpc.NewClient(addr, opt)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	return err
}

var routerOnly = Policy{"": {Router}}

// toStatus is the mapping svckit's table gives these errors.
func toStatus(err error) error {
	code := codes.PermissionDenied
	if errors.Is(err, ErrNoCertificate) {
		code = codes.Unauthenticated
	}
	return status.Error(code, err.Error())
}

func TestRightRolePasses(t *testing.T) {
	dir := devDir(t)
	addr := serve(t, dir, Decode, routerOnly)
	if err := check(t, addr, mustLoad(t, FilesIn(dir, Router)).DialOption(Decode)); err != nil {
		t.Fatalf("router calling decode: %v", err)
	}
}

func TestWrongRoleRefused(t *testing.T) {
	dir := devDir(t)
	addr := serve(t, dir, Decode, routerOnly)
	err := check(t, addr, mustLoad(t, FilesIn(dir, Prefill)).DialOption(Decode))
	if status.Code(err) != codes.PermissionDenied {
		t.Fatalf("prefill calling a router-only method: got %v, want PERMISSION_DENIED", err)
	}
	if want := "peer certificate role prefill, want router"; !strings.Contains(status.Convert(err).Message(), want) {
		t.Fatalf("message %q does not say %q", status.Convert(err).Message(), want)
	}
}

func TestNoClientCertificateRefused(t *testing.T) {
	dir := devDir(t)
	addr := serve(t, dir, Decode, routerOnly)
	// A client that trusts the CA but presents no certificate.
	pool := mustLoad(t, FilesIn(dir, Router)).current().pool
	noCert := credentials.NewTLS(&tls.Config{RootCAs: pool, ServerName: "localhost", MinVersion: tls.VersionTLS13})
	if err := check(t, addr, grpc.WithTransportCredentials(noCert)); status.Code(err) != codes.Unavailable {
		t.Fatalf("client without certificate: got %v, want the handshake to fail (UNAVAILABLE)", err)
	}
	if err := check(t, addr, grpc.WithTransportCredentials(insecure.NewCredentials())); status.Code(err) != codes.Unavailable {
		t.Fatalf("plaintext client: got %v, want UNAVAILABLE", err)
	}
}

func TestOtherCARefused(t *testing.T) {
	dir, other := devDir(t), devDir(t)
	addr := serve(t, dir, Decode, routerOnly)
	// A router certificate from another CA, with that CA as its trust:
	// the server refuses the client, and the client the server.
	if err := check(t, addr, mustLoad(t, FilesIn(other, Router)).DialOption(Decode)); status.Code(err) != codes.Unavailable {
		t.Fatalf("certificate of another CA: got %v, want UNAVAILABLE", err)
	}
	// A client trusting dir's CA but presenting other's certificate.
	mixed := Files{Cert: FilesIn(other, Router).Cert, Key: FilesIn(other, Router).Key, CA: FilesIn(dir, Router).CA}
	if _, err := Load(mixed, nil); err == nil || !strings.Contains(err.Error(), "does not verify against --tls-ca") {
		t.Fatalf("Load of a certificate the CA did not sign: %v", err)
	}
}

func TestClientChecksServerRole(t *testing.T) {
	dir := devDir(t)
	addr := serve(t, dir, Decode, routerOnly)
	err := check(t, addr, mustLoad(t, FilesIn(dir, Router)).DialOption(Prefill))
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "server certificate role decode, want prefill") {
		t.Fatalf("router expecting prefill reached decode: got %v", err)
	}
}

func TestPolicyFor(t *testing.T) {
	for _, c := range []struct {
		server Role
		method string
		want   []Role
	}{
		{Prefill, "/baton.v1.PrefillService/TransferKV", []Role{Decode}},
		{Prefill, "/baton.v1.WorkerService/WatchLoad", []Role{Router}},
		{Decode, "/baton.v1.DecodeService/Generate", []Role{Router}},
		{Decode, "/baton.v1.WorkerService/Info", []Role{Router}},
		{Decode, "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo", []Role{Router}},
		{Decode, "/grpc.health.v1.Health/Check", []Role{}},
	} {
		got := PolicyFor(c.server).allowed(c.method)
		if strings.Join(roleStrings(got), ",") != strings.Join(roleStrings(c.want), ",") {
			t.Errorf("%s server, %s: allowed %v, want %v", c.server, c.method, got, c.want)
		}
	}
	if PolicyFor(Router) != nil {
		t.Error("the router's client-facing server has a peer policy")
	}
}

func roleStrings(rs []Role) []string {
	s := make([]string, len(rs))
	for i, r := range rs {
		s[i] = string(r)
	}
	return s
}

func TestFilesValidate(t *testing.T) {
	if err := (Files{}).Validate(); err != nil {
		t.Fatalf("none set: %v", err)
	}
	if err := (Files{Cert: "a", Key: "b", CA: "c"}).Validate(); err != nil {
		t.Fatalf("all set: %v", err)
	}
	err := Files{Cert: "a"}.Validate()
	if err == nil || !strings.HasPrefix(err.Error(), "--tls-key:") || !strings.Contains(err.Error(), "missing --tls-key, --tls-ca") {
		t.Fatalf("only --tls-cert: %v", err)
	}
}

func TestLoadErrorsNameTheFlag(t *testing.T) {
	dir := devDir(t)
	f := FilesIn(dir, Router)
	for _, c := range []struct {
		name string
		f    Files
		want string
	}{
		{"missing cert", Files{Cert: filepath.Join(dir, "nope.crt"), Key: f.Key, CA: f.CA}, "--tls-cert "},
		{"missing key", Files{Cert: f.Cert, Key: filepath.Join(dir, "nope.key"), CA: f.CA}, "--tls-key "},
		{"missing CA", Files{Cert: f.Cert, Key: f.Key, CA: filepath.Join(dir, "nope.crt")}, "--tls-ca "},
		{"key of another role", Files{Cert: f.Cert, Key: FilesIn(dir, Decode).Key, CA: f.CA}, "--tls-cert "},
		{"CA file without a certificate", Files{Cert: f.Cert, Key: f.Key, CA: f.Key}, "--tls-ca "},
		{"certificate without a role", Files{Cert: filepath.Join(dir, CACertFile), Key: filepath.Join(dir, CAKeyFile), CA: f.CA}, "names no Baton role"},
	} {
		_, err := Load(c.f, nil)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want an error with %q", c.name, err, c.want)
		}
	}
	id := mustLoad(t, f)
	if id.Role() != Router {
		t.Fatalf("role %q, want router", id.Role())
	}
	leaf := id.current().cert.Leaf
	if len(leaf.URIs) != 1 || leaf.URIs[0].String() != "spiffe://baton/router" {
		t.Fatalf("URI SANs %v", leaf.URIs)
	}
	for _, h := range []string{"localhost", "worker.example"} {
		if err := leaf.VerifyHostname(h); err != nil {
			t.Errorf("SAN %s: %v", h, err)
		}
	}
	for _, h := range []string{"127.0.0.1", "::1", "10.1.2.3"} {
		if err := leaf.VerifyHostname(h); err != nil {
			t.Errorf("SAN %s: %v", h, err)
		}
	}
	if st, err := os.Stat(f.Key); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("key file mode: %v %v", st.Mode(), err)
	}
}

// TestReload: new files (a rotated Secret) serve new handshakes without a
// restart; a certificate from a new CA is then the one trusted.
func TestReload(t *testing.T) {
	dir := devDir(t)
	id := mustLoad(t, FilesIn(dir, Decode))
	id.every = 0
	srv := grpc.NewServer(ServerOptions(id, routerOnly, toStatus)...)
	healthpb.RegisterHealthServer(srv, health.NewServer())
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(lis) }()
	defer func() { srv.Stop(); <-done }()
	addr := lis.Addr().String()

	old := t.TempDir()
	for _, n := range []string{"router.crt", "router.key", CACertFile} {
		b, err := os.ReadFile(filepath.Join(dir, n))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(old, n), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := check(t, addr, mustLoad(t, FilesIn(old, Router)).DialOption(Decode)); err != nil {
		t.Fatalf("before rotation: %v", err)
	}
	// Rotate: a new CA and certificates in the same paths. Modification
	// times must differ from the old files'.
	time.Sleep(10 * time.Millisecond)
	if err := WriteDevCerts(dir, DevOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := check(t, addr, mustLoad(t, FilesIn(dir, Router)).DialOption(Decode)); err != nil {
		t.Fatalf("a client of the new CA after rotation: %v", err)
	}
	if err := check(t, addr, mustLoad(t, FilesIn(old, Router)).DialOption(Decode)); status.Code(err) != codes.Unavailable {
		t.Fatalf("a client of the old CA after rotation: got %v, want UNAVAILABLE", err)
	}
	// Broken files keep the previous identity.
	if err := os.WriteFile(FilesIn(dir, Decode).Cert, []byte("garbage"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := check(t, addr, mustLoad(t, FilesIn(dir, Router)).DialOption(Decode)); err != nil {
		t.Fatalf("after a broken rewrite: %v", err)
	}
}

// warnCounter counts Warn records whose message contains sub.
type warnCounter struct {
	sub string
	n   *atomic.Int32
}

func (h warnCounter) Enabled(context.Context, slog.Level) bool { return true }
func (h warnCounter) Handle(_ context.Context, r slog.Record) error {
	if r.Level == slog.LevelWarn && strings.Contains(r.Message, h.sub) {
		h.n.Add(1)
	}
	return nil
}
func (h warnCounter) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h warnCounter) WithGroup(string) slog.Handler      { return h }

// TestReloadOtherRoleWarnsOnce: files rewritten with another role's
// certificate are refused, the previous identity kept, and the refusal is
// logged once per change of the files, not at every check.
func TestReloadOtherRoleWarnsOnce(t *testing.T) {
	dir := devDir(t)
	var warned atomic.Int32
	f := FilesIn(dir, Decode)
	id, err := Load(f, slog.New(warnCounter{sub: "role", n: &warned}))
	if err != nil {
		t.Fatal(err)
	}
	id.every = 0
	other := FilesIn(dir, Prefill)
	mtime := time.Now().Add(time.Minute)
	rewrite := func() {
		t.Helper()
		for _, p := range [][2]string{{other.Cert, f.Cert}, {other.Key, f.Key}} {
			b, err := os.ReadFile(p[0])
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p[1], b, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Chtimes(p[1], mtime, mtime); err != nil {
				t.Fatal(err)
			}
		}
		mtime = mtime.Add(time.Minute)
	}
	rewrite()
	for range 5 {
		if r := id.Role(); r != Decode {
			t.Fatalf("role %s after a rewrite with another role's certificate, want the previous decode", r)
		}
	}
	if n := warned.Load(); n != 1 {
		t.Errorf("role change warned %d times over 5 checks of unchanged files, want once", n)
	}
	rewrite() // changed again: one more warning
	for range 3 {
		id.Role()
	}
	if n := warned.Load(); n != 2 {
		t.Errorf("role change warned %d times after a second rewrite, want 2", n)
	}
}

func TestRoleOf(t *testing.T) {
	dir := devDir(t)
	ca := mustLoad(t, FilesIn(dir, Router))
	for _, r := range Roles {
		if got := mustLoad(t, FilesIn(dir, r)).Role(); got != r {
			t.Errorf("role %s read as %s", r, got)
		}
	}
	if _, err := RoleOf(ca.current().cert.Leaf); err != nil {
		t.Fatal(err)
	}
	_, err := Load(Files{Cert: filepath.Join(dir, CACertFile), Key: filepath.Join(dir, CAKeyFile), CA: filepath.Join(dir, CACertFile)}, nil)
	if !errors.Is(err, ErrNoRole) {
		t.Fatalf("CA certificate as identity: %v, want ErrNoRole", err)
	}
}

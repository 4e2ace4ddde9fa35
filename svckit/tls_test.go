package svckit

import (
	"bytes"
	"context"
	"flag"
	"log/slog"
	"strings"
	"testing"
	"time"

	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"github.com/baton-serving/baton/svckit/tlsconf"
	"github.com/baton-serving/baton/svckit/workerapi"
	"github.com/baton-serving/baton/tracing"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

func TestTLSFlagsAllOrNone(t *testing.T) {
	c := Config{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", ShutdownTimeout: time.Second, TLS: tlsconf.Files{Cert: "c.crt", CA: "ca.crt"}}
	err := c.Validate()
	if err == nil || !strings.HasPrefix(err.Error(), "--tls-key:") {
		t.Fatalf("--tls-cert and --tls-ca without --tls-key: %v, want an error naming --tls-key", err)
	}
	var got Config
	fs := NewFlagSet("x", "x", &bytes.Buffer{})
	got.AddFlags(fs, Config{})
	if err := ParseFlags(fs, nil, func(k string) (string, bool) {
		v, ok := map[string]string{"BATON_TLS_CERT": "a", "BATON_TLS_KEY": "b", "BATON_TLS_CA": "c"}[k]
		return v, ok
	}); err != nil {
		t.Fatal(err)
	}
	if got.TLS != (tlsconf.Files{Cert: "a", Key: "b", CA: "c"}) {
		t.Fatalf("BATON_TLS_* read as %+v", got.TLS)
	}
}

// roleService is a Service with a TLSRole, as the workers are.
type roleService struct{ role tlsconf.Role }

func (roleService) AddFlags(*flag.FlagSet)            {}
func (roleService) Validate() error                   { return nil }
func (roleService) Open(context.Context, *Deps) error { return nil }
func (roleService) Register(*Server) error            { return nil }
func (roleService) Close() error                      { return nil }
func (s roleService) TLSRole() tlsconf.Role           { return s.role }
func tlsArgs(dir string, r tlsconf.Role) []string {
	f := tlsconf.FilesIn(dir, r)
	return []string{"--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--tls-cert", f.Cert, "--tls-key", f.Key, "--tls-ca", f.CA}
}

// TestMainRefusesAnotherRolesCertificate: a worker started with another
// role's certificate stops at start-up with one line naming the flag.
func TestMainRefusesAnotherRolesCertificate(t *testing.T) {
	dir := t.TempDir()
	if err := tlsconf.WriteDevCerts(dir, tlsconf.DevOptions{}); err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	code := Main(tlsArgs(dir, tlsconf.Prefill), &stderr, Spec{Name: "decode-svc", Summary: "test"}, roleService{tlsconf.Decode})
	if code != 2 || !strings.Contains(stderr.String(), "--tls-cert") || !strings.Contains(stderr.String(), "certificate role prefill, want decode") {
		t.Fatalf("exit %d, %q; want 2 and the roles", code, stderr.String())
	}
}

// TestServerMutualTLS: a server with a peer policy takes only mutual TLS
// and authorizes by role; the drain guard and health still work through it.
func TestServerMutualTLS(t *testing.T) {
	dir := t.TempDir()
	if err := tlsconf.WriteDevCerts(dir, tlsconf.DevOptions{}); err != nil {
		t.Fatal(err)
	}
	load := func(r tlsconf.Role) *tlsconf.Identity {
		id, err := tlsconf.Load(tlsconf.FilesIn(dir, r), nil)
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	logger := slog.New(slog.DiscardHandler)
	tp, err := tracing.Init(context.Background(), "svckit-test", logger)
	if err != nil {
		t.Fatal(err)
	}
	defer tp.Shutdown(context.Background())
	srv, err := NewServer("svckit-test", Config{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", ShutdownTimeout: 5 * time.Second}, logger, tp,
		ServerOptions{TLS: load(tlsconf.Decode), Peers: tlsconf.PolicyFor(tlsconf.Decode)})
	if err != nil {
		t.Fatal(err)
	}
	batonv1.RegisterWorkerServiceServer(srv.GRPC, workerapi.New(&workerapi.Idle{Role: batonv1.WorkerRole_WORKER_ROLE_DECODE, Ready: srv.Ready}))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	defer func() { cancel(); <-done }()

	call := func(opt grpc.DialOption) (error, error) {
		conn, err := grpc.NewClient(srv.GRPCAddr(), opt)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer ccancel()
		_, herr := healthpb.NewHealthClient(conn).Check(cctx, &healthpb.HealthCheckRequest{})
		_, ierr := batonv1.NewWorkerServiceClient(conn).Info(cctx, &batonv1.InfoRequest{})
		return herr, ierr
	}
	if herr, _ := call(grpc.WithTransportCredentials(insecure.NewCredentials())); status.Code(herr) != codes.Unavailable {
		t.Fatalf("plaintext health check: %v, want UNAVAILABLE", herr)
	}
	herr, ierr := call(load(tlsconf.Prefill).DialOption(tlsconf.Decode))
	if herr != nil {
		t.Fatalf("health check with prefill's certificate (open to any certified peer): %v", herr)
	}
	if status.Code(ierr) != codes.PermissionDenied || !strings.Contains(ierr.Error(), "peer certificate role prefill, want router") {
		t.Fatalf("WorkerService.Info with prefill's certificate: %v, want PERMISSION_DENIED", ierr)
	}
	if herr, ierr := call(load(tlsconf.Router).DialOption(tlsconf.Decode)); herr != nil || ierr != nil {
		t.Fatalf("router's certificate: health %v, Info %v", herr, ierr)
	}
	if srv.TLS == nil {
		t.Fatal("Server.TLS is nil: the service could not dial with its identity")
	}
}

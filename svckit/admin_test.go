package svckit

import (
	"bufio"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"github.com/baton-serving/baton/tracing"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
)

// runServer starts a Server with cfg (loopback ports filled in) and stops it
// at the end of the test. register runs before Run.
func runServer(t *testing.T, cfg Config, register func(*Server)) *Server {
	t.Helper()
	logger := slog.New(slog.DiscardHandler)
	tp, err := tracing.Init(context.Background(), "svckit-test", logger)
	if err != nil {
		t.Fatal(err)
	}
	cfg.GRPCAddr, cfg.HTTPAddr = "127.0.0.1:0", "127.0.0.1:0"
	if cfg.ShutdownTimeout == 0 {
		cfg.ShutdownTimeout = 2 * time.Second
	}
	srv, err := NewServer("svckit-test", cfg, logger, tp, ServerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if register != nil {
		register(srv)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run = %v", err)
		}
		_ = tp.Shutdown(context.Background())
	})
	waitFor(t, func() bool {
		resp, err := http.Get("http://" + srv.HTTPAddr() + "/health")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil
	})
	return srv
}

// The debug surface (in-flight requests with client addresses and trace
// ids, profiles) is never on the public HTTP port; it is on the admin
// listener, and /metrics stays public unless --metrics-on-admin.
func TestDebugOnlyOnAdmin(t *testing.T) {
	list := func() []*batonv1.RequestInfo { return []*batonv1.RequestInfo{{RequestId: "r1", Peer: "10.1.2.3:4"}} }
	srv := runServer(t, Config{Pprof: true, AdminAddr: "127.0.0.1:0"}, func(s *Server) { s.HandleDebugRequests(list) })
	for _, p := range []string{"/debug/requests", "/debug/pprof/goroutine?debug=1"} {
		if c := httpStatus(t, "http://"+srv.HTTPAddr()+p); c != http.StatusNotFound {
			t.Errorf("HTTP port: GET %s = %d, want 404", p, c)
		}
	}
	if srv.AdminAddr() == "" {
		t.Fatal("AdminAddr empty with --admin-addr set")
	}
	for _, p := range []string{"/debug/requests", "/debug/pprof/goroutine?debug=1"} {
		if c := httpStatus(t, "http://"+srv.AdminAddr()+p); c != http.StatusOK {
			t.Errorf("admin: GET %s = %d, want 200", p, c)
		}
	}
	if c := httpStatus(t, "http://"+srv.HTTPAddr()+"/metrics"); c != http.StatusOK {
		t.Errorf("HTTP port: GET /metrics = %d, want 200", c)
	}
	if c := httpStatus(t, "http://"+srv.AdminAddr()+"/metrics"); c != http.StatusNotFound {
		t.Errorf("admin: GET /metrics = %d without --metrics-on-admin, want 404", c)
	}

	moved := runServer(t, Config{AdminAddr: "127.0.0.1:0", MetricsOnAdmin: true}, nil)
	if c := httpStatus(t, "http://"+moved.HTTPAddr()+"/metrics"); c != http.StatusNotFound {
		t.Errorf("--metrics-on-admin: HTTP port GET /metrics = %d, want 404", c)
	}
	if c := httpStatus(t, "http://"+moved.AdminAddr()+"/metrics"); c != http.StatusOK {
		t.Errorf("--metrics-on-admin: admin GET /metrics = %d, want 200", c)
	}

	off := runServer(t, Config{AdminAddr: AdminOff, Pprof: true}, func(s *Server) { s.HandleDebugRequests(list) })
	if off.AdminAddr() != "" {
		t.Errorf("--admin-addr off: AdminAddr = %q", off.AdminAddr())
	}
	if c := httpStatus(t, "http://"+off.HTTPAddr()+"/debug/requests"); c != http.StatusNotFound {
		t.Errorf("--admin-addr off: HTTP port GET /debug/requests = %d, want 404", c)
	}
}

// A client that sends its headers and then trickles (here: stops) its body
// is cut off by --http-body-timeout instead of holding a handler forever.
func TestSlowBodyCutOff(t *testing.T) {
	handlerErr := make(chan error, 1)
	srv := runServer(t, Config{HTTPBodyTimeout: 300 * time.Millisecond}, func(s *Server) {
		s.Mux.HandleFunc("POST /upload", func(w http.ResponseWriter, r *http.Request) {
			_, err := io.ReadAll(r.Body)
			handlerErr <- err
			if err != nil {
				code := http.StatusBadRequest
				if errors.Is(err, ErrBodyTimeout) {
					code = http.StatusRequestTimeout
				}
				http.Error(w, err.Error(), code)
				return
			}
			_, _ = io.WriteString(w, "ok")
		})
	})
	conn, err := net.Dial("tcp", srv.HTTPAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, "POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n0123456789"); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(15 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no answer to a stalled upload: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestTimeout {
		t.Errorf("stalled upload: HTTP %d, want 408", resp.StatusCode)
	}
	if err := <-handlerErr; !errors.Is(err, ErrBodyTimeout) {
		t.Errorf("handler's read error = %v, want ErrBodyTimeout", err)
	}
}

// The body deadline ends with the body: a handler that has read its whole
// body may stream its answer for longer than --http-body-timeout without
// its request's context being cancelled (SSE streams depend on it).
func TestBodyDeadlineEndsWithBody(t *testing.T) {
	const timeout = 200 * time.Millisecond
	ctxErr := make(chan error, 1)
	srv := runServer(t, Config{HTTPBodyTimeout: timeout}, func(s *Server) {
		s.Mux.HandleFunc("POST /stream", func(w http.ResponseWriter, r *http.Request) {
			if _, err := io.ReadAll(r.Body); err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			rc := http.NewResponseController(w)
			for range 6 {
				_, _ = io.WriteString(w, "data: x\n\n")
				_ = rc.Flush()
				select {
				case <-r.Context().Done():
					ctxErr <- r.Context().Err()
					return
				case <-time.After(timeout):
				}
			}
			ctxErr <- nil
		})
	})
	resp, err := http.Post("http://"+srv.HTTPAddr()+"/stream", "text/plain", strings.NewReader("hello"))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err := <-ctxErr; err != nil {
		t.Fatalf("request context ended while streaming: %v (got %q)", err, b)
	}
	if n := strings.Count(string(b), "data: x"); n != 6 {
		t.Errorf("got %d events, want 6", n)
	}
}

func grpcConn(t *testing.T, addr string, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// Reflection lists every service to anyone who reaches the port: only with
// --grpc-reflection.
func TestReflectionOnlyWithFlag(t *testing.T) {
	for _, on := range []bool{false, true} {
		srv := runServer(t, Config{GRPCReflection: on}, nil)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		stream, err := reflectionpb.NewServerReflectionClient(grpcConn(t, srv.GRPCAddr())).ServerReflectionInfo(ctx)
		if err == nil {
			// A refused stream's Send may say only io.EOF; Recv has its status.
			_ = stream.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}})
			_, err = stream.Recv()
		}
		cancel()
		if want := codes.Unimplemented; !on && status.Code(err) != want {
			t.Errorf("--grpc-reflection=false: reflection answered %v, want %v", err, want)
		}
		if on && err != nil {
			t.Errorf("--grpc-reflection: %v", err)
		}
	}
}

// One client connection may not hold more than --grpc-max-concurrent-streams
// streams open: the next one waits.
func TestMaxConcurrentStreams(t *testing.T) {
	srv := runServer(t, Config{GRPCMaxConcurrentStreams: 2}, nil)
	health := healthpb.NewHealthClient(grpcConn(t, srv.GRPCAddr()))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for i := range 2 {
		w, err := health.Watch(ctx, &healthpb.HealthCheckRequest{})
		if err == nil {
			_, err = w.Recv()
		}
		if err != nil {
			t.Fatalf("watch %d: %v", i, err)
		}
	}
	tctx, tcancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer tcancel()
	w, err := health.Watch(tctx, &healthpb.HealthCheckRequest{})
	if err == nil {
		_, err = w.Recv()
	}
	if status.Code(err) != codes.DeadlineExceeded {
		t.Errorf("third stream on one connection: %v, want it to wait (DEADLINE_EXCEEDED)", err)
	}
}

// stallProxy forwards TCP between its clients and target until stall is
// called; then it forwards nothing more in either direction but keeps every
// connection open: a half-open peer, as a dead host or a black-holed
// network looks.
type stallProxy struct {
	lis     net.Listener
	target  string
	mu      sync.Mutex
	stalled chan struct{}
	conns   []net.Conn
	wg      sync.WaitGroup
}

func newStallProxy(t *testing.T, target string) *stallProxy {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &stallProxy{lis: lis, target: target, stalled: make(chan struct{})}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

func (p *stallProxy) addr() string { return p.lis.Addr().String() }

func (p *stallProxy) stall() { close(p.stalled) }

func (p *stallProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.lis.Accept()
		if err != nil {
			return
		}
		u, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, u)
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(c, u)
		go p.pipe(u, c)
	}
}

// pipe copies from src to dst until the proxy stalls; after that it reads
// and drops, so the sender's writes succeed and nothing arrives.
func (p *stallProxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if err != nil {
			return
		}
		select {
		case <-p.stalled:
			continue
		default:
		}
		if _, err := dst.Write(buf[:n]); err != nil {
			return
		}
	}
}

func (p *stallProxy) close() {
	p.lis.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// hangDesc is a server-streaming method whose handler waits for its
// context to end, reporting when it started and ended.
func hangDesc(started, ended chan<- struct{}) *grpc.ServiceDesc {
	return &grpc.ServiceDesc{
		ServiceName: "svckit.test.Hang",
		HandlerType: (*any)(nil),
		Streams: []grpc.StreamDesc{{StreamName: "Hang", ServerStreams: true, Handler: func(_ any, ss grpc.ServerStream) error {
			started <- struct{}{}
			<-ss.Context().Done()
			ended <- struct{}{}
			return ss.Context().Err()
		}}},
	}
}

// Keepalive on both ends: across a peer that went silent (half-open), the
// server's pings end the server's stream, and the client's pings fail the
// client's RPC, each within keepalive time + timeout instead of never.
func TestKeepaliveNoticesHalfOpenPeer(t *testing.T) {
	started, ended := make(chan struct{}, 1), make(chan struct{}, 1)
	cfg := Config{GRPCKeepaliveTime: time.Second, GRPCKeepaliveTimeout: time.Second}
	srv := runServer(t, cfg, func(s *Server) { s.GRPC.RegisterService(hangDesc(started, ended), struct{}{}) })
	proxy := newStallProxy(t, srv.GRPCAddr())
	// gRPC raises a client's ping interval to at least 10s.
	conn := grpcConn(t, proxy.addr(), cfg.KeepaliveDialOption())

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, err := conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true}, "/svckit.test.Hang/Hang")
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.CloseSend(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("the stream did not reach the server")
	}
	proxy.stall()
	at := time.Now()

	select {
	case <-ended:
		t.Logf("server ended the stream %v after the stall", time.Since(at).Round(time.Millisecond))
	case <-time.After(8 * time.Second):
		t.Error("server: stream on a half-open connection still open 8s after the stall (keepalive 1s+1s)")
	}

	recvErr := make(chan error, 1)
	go func() {
		var m healthpb.HealthCheckResponse
		recvErr <- stream.RecvMsg(&m)
	}()
	select {
	case err := <-recvErr:
		if status.Code(err) != codes.Unavailable {
			t.Errorf("client: RecvMsg = %v, want UNAVAILABLE", err)
		}
		t.Logf("client's RPC failed %v after the stall: %v", time.Since(at).Round(time.Millisecond), err)
	case <-time.After(25 * time.Second):
		t.Error("client: RPC over a half-open connection still waiting 25s after the stall (keepalive 10s+1s)")
		cancel()
		<-recvErr
	}
}

// The new flags are in --help with their variables, and Validate names the
// flag of a bad value.
func TestAdminFlags(t *testing.T) {
	var out strings.Builder
	var cfg Config
	fs := NewFlagSet("x", "test", &out)
	cfg.AddFlags(fs, Config{AdminAddr: "127.0.0.1:8086"})
	_ = ParseFlags(fs, []string{"--help"}, nil)
	for _, w := range []string{"$BATON_ADMIN_ADDR", "(default \"127.0.0.1:8086\")", "$BATON_METRICS_ON_ADMIN", "$BATON_HTTP_BODY_TIMEOUT",
		"$BATON_GRPC_REFLECTION", "$BATON_GRPC_MAX_CONCURRENT_STREAMS", "$BATON_GRPC_KEEPALIVE_TIME", "$BATON_GRPC_KEEPALIVE_TIMEOUT",
		"$BATON_GRPC_KEEPALIVE_MIN_TIME"} {
		if !strings.Contains(out.String(), w) {
			t.Errorf("usage lacks %q", w)
		}
	}
	base := Config{GRPCAddr: "127.0.0.1:1", HTTPAddr: "127.0.0.1:2", ShutdownTimeout: time.Second}
	for _, c := range []struct {
		mod  func(*Config)
		want string // "" for valid
	}{
		{func(c *Config) { c.AdminAddr = "off" }, ""},
		{func(c *Config) { c.AdminAddr = "127.0.0.1:3"; c.MetricsOnAdmin = true }, ""},
		{func(c *Config) { c.AdminAddr = "nowhere" }, "--admin-addr"},
		{func(c *Config) { c.MetricsOnAdmin = true }, "--metrics-on-admin"},
		{func(c *Config) { c.GRPCKeepaliveTime = time.Millisecond }, "--grpc-keepalive-time"},
		{func(c *Config) { c.HTTPBodyTimeout = -time.Second }, "--http-body-timeout"},
		{func(c *Config) { c.GRPCMaxConcurrentStreams = 1 << 33 }, "--grpc-max-concurrent-streams"},
		// A min-time above the peers' ping interval GOAWAYs their healthy
		// long streams with too_many_pings.
		{func(c *Config) { c.GRPCKeepaliveTime = 10 * time.Second; c.GRPCKeepaliveMinTime = 20 * time.Second }, "--grpc-keepalive-min-time"},
		{func(c *Config) { c.GRPCKeepaliveMinTime = 40 * time.Second }, "--grpc-keepalive-min-time"}, // the default time is 30s
		{func(c *Config) { c.GRPCKeepaliveTime = 10 * time.Second; c.GRPCKeepaliveMinTime = 10 * time.Second }, ""},
		// --pprof serves on the admin listener only: without one it would
		// do nothing, silently.
		{func(c *Config) { c.Pprof = true }, "--pprof"},
		{func(c *Config) { c.Pprof = true; c.AdminAddr = "127.0.0.1:3" }, ""},
	} {
		cfg := base
		c.mod(&cfg)
		err := cfg.Validate()
		if (c.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), c.want)) {
			t.Errorf("Validate(%+v) = %v, want %q", cfg, err, c.want)
		}
	}
}

package workers

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"github.com/miekg/dns"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
)

// TestMain fails the package if a test leaves a goroutine behind: every
// watch, connection and server a Set or a test starts must be gone.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var (
	testLayout = &batonv1.KVLayout{Dtype: batonv1.KVDataType_KV_DATA_TYPE_F16, PageSizeTokens: 16, NumLayers: 5, NumKvHeads: 4, HeadDim: 8}
	testExpect = Identity{Fingerprint: "fp-good", Layers: 5, KVHeads: 4, HeadDim: 8}
)

// server is a worker's WorkerService on a real loopback port: it reports
// the identity and readiness the test sets, and can go quiet without
// closing its streams.
type server struct {
	batonv1.UnimplementedWorkerServiceServer
	addr    string
	srv     *grpc.Server
	info    atomic.Pointer[batonv1.InfoResponse]
	ready   atomic.Bool
	quiet   atomic.Bool  // WatchLoad stops sending, streams stay open
	watches atomic.Int32 // WatchLoad streams open now
	load    atomic.Uint32
}

// startServer serves a decode worker at addr ("127.0.0.1:0" for any port).
func startServer(t *testing.T, addr string) *server {
	t.Helper()
	return startServerInfo(t, addr, &batonv1.InfoResponse{Role: decodeRole, Model: &batonv1.ModelInfo{Fingerprint: "fp-good"}, KvLayout: testLayout})
}

// startServerInfo serves a worker with the given identity at addr.
func startServerInfo(t *testing.T, addr string, info *batonv1.InfoResponse) *server {
	t.Helper()
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	s := &server{addr: lis.Addr().String(), srv: grpc.NewServer()}
	s.info.Store(info)
	s.ready.Store(true)
	batonv1.RegisterWorkerServiceServer(s.srv, s)
	go s.srv.Serve(lis)
	t.Cleanup(s.srv.Stop)
	return s
}

func (s *server) Info(context.Context, *batonv1.InfoRequest) (*batonv1.InfoResponse, error) {
	return s.info.Load(), nil
}

func (s *server) WatchLoad(req *batonv1.WatchLoadRequest, stream batonv1.WorkerService_WatchLoadServer) error {
	s.watches.Add(1)
	defer s.watches.Add(-1)
	t := time.NewTicker(time.Duration(req.GetIntervalMs()) * time.Millisecond)
	defer t.Stop()
	for {
		if !s.quiet.Load() {
			if err := stream.Send(&batonv1.WatchLoadResponse{Load: &batonv1.LoadReport{
				Ready: s.ready.Load(), RunningRequests: s.load.Load(), PagesTotal: 100}}); err != nil {
				return err
			}
		}
		select {
		case <-stream.Context().Done():
			return stream.Context().Err()
		case <-t.C:
		}
	}
}

// runSet runs a set over src until the test ends, and checks that Run
// returns having closed every connection.
func runSet(t *testing.T, src Source, lostAfter time.Duration) *Set {
	t.Helper()
	s := NewSet(Config{Role: decodeRole, Source: src, Expect: testExpect, LoadInterval: 50 * time.Millisecond,
		ResolveInterval: 50 * time.Millisecond, LostAfter: lostAfter, Logger: slog.New(slog.DiscardHandler),
		DialOptions: []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	t.Cleanup(func() {
		ws := s.Workers()
		cancel()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Error("Set.Run did not return within 5s of its context ending")
			return
		}
		for _, w := range ws {
			if st := w.Conn().GetState(); st != connectivity.Shutdown {
				t.Errorf("%s: connection %v after Run returned, want SHUTDOWN", w.Addr, st)
			}
		}
	})
	return s
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within 5s: %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func readyAddrs(s *Set) string {
	var out []string
	for _, w := range s.Ready() {
		out = append(out, w.Addr)
	}
	return strings.Join(out, ",")
}

func worker(s *Set, addr string) *Worker {
	for _, w := range s.Workers() {
		if w.Addr == addr {
			return w
		}
	}
	return nil
}

func TestIdentityCheck(t *testing.T) {
	good := startServer(t, "127.0.0.1:0")
	wrongRole := startServerInfo(t, "127.0.0.1:0", &batonv1.InfoResponse{Role: prefillRole, Model: &batonv1.ModelInfo{Fingerprint: "fp-good"}})
	otherModel := &batonv1.InfoResponse{Role: decodeRole, Model: &batonv1.ModelInfo{Fingerprint: "fp-other"}}
	wrongModel := startServerInfo(t, "127.0.0.1:0", otherModel)
	wrongLayout := startServerInfo(t, "127.0.0.1:0", &batonv1.InfoResponse{Role: decodeRole, Model: &batonv1.ModelInfo{Fingerprint: "fp-good"},
		KvLayout: &batonv1.KVLayout{Dtype: batonv1.KVDataType_KV_DATA_TYPE_F16, PageSizeTokens: 16, NumLayers: 6, NumKvHeads: 4, HeadDim: 8}})
	unready := startServer(t, "127.0.0.1:0")
	unready.ready.Store(false)

	s := runSet(t, Static{good.addr, wrongRole.addr, wrongModel.addr, wrongLayout.addr, unready.addr, "127.0.0.1:1"}, 0)
	waitFor(t, "the good worker ready", func() bool { return readyAddrs(s) == good.addr })
	for _, tc := range []struct {
		addr, excluded, lastErr string
	}{
		{wrongRole.addr, "worker reports role prefill, configured as decode", ""},
		{wrongModel.addr, "worker serves model fingerprint fp-other, the router fp-good", ""},
		{wrongLayout.addr, "worker's kv_layout.num_layers is 6, the router's model has 5", ""},
		{"127.0.0.1:1", "", "info: "},
	} {
		w := worker(s, tc.addr)
		waitFor(t, tc.addr+" refused", func() bool { return w.Excluded() == tc.excluded && strings.Contains(w.LastError(), tc.lastErr) })
		if w.Info() != nil && tc.excluded != "" {
			t.Errorf("%s: identity %v accepted", tc.addr, w.Info())
		}
	}
	// A worker that says it is not ready is watched but not routed to;
	// once it says ready, it is.
	waitFor(t, "the unready worker watched", func() bool { return worker(s, unready.addr).Load() != nil })
	unready.ready.Store(true)
	waitFor(t, "the worker ready", func() bool { return readyAddrs(s) == strings.Join(sortedAddrs(good.addr, unready.addr), ",") })
	// A worker replaced at the same address by one serving another model
	// is refused at its reconnection.
	w := worker(s, good.addr)
	if w.Info().GetModel().GetFingerprint() != "fp-good" {
		t.Error("identity not recorded")
	}
	good.srv.Stop()
	startServerInfo(t, good.addr, otherModel)
	waitFor(t, "the replacement refused", func() bool { return strings.Contains(w.Excluded(), "fp-other") })
	if s.Routable(w) || w.Info() != nil {
		t.Errorf("the replaced worker is routable (%v) or keeps its old identity (%v)", s.Routable(w), w.Info())
	}
}

func sortedAddrs(a ...string) []string {
	out := Static(a)
	r, _ := out.Resolve(context.Background())
	return r
}

func TestLostWorker(t *testing.T) {
	for _, tc := range []struct {
		name string
		lose func(*server)
		want string
	}{
		{"killed", func(s *server) { s.srv.Stop() }, "watch load"},
		{"silent", func(s *server) { s.quiet.Store(true) }, "no load report for 400ms"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := startServer(t, "127.0.0.1:0")
			s := runSet(t, Static{srv.addr}, 400*time.Millisecond)
			waitFor(t, "ready", func() bool { return readyAddrs(s) == srv.addr })
			w := worker(s, srv.addr)
			lost := w.Lost()
			tc.lose(srv)
			select {
			case <-lost.Done():
			case <-time.After(5 * time.Second):
				t.Fatal("the worker's Lost context was not cancelled")
			}
			cause := context.Cause(lost)
			if !errors.Is(cause, ErrLost) || !strings.Contains(cause.Error(), srv.addr) || !strings.Contains(cause.Error(), tc.want) {
				t.Errorf("cause %q, want ErrLost naming %s and %q", cause, srv.addr, tc.want)
			}
			if w.Lost() == lost || w.Lost().Err() != nil {
				t.Error("a fresh Lost context was not installed")
			}
			if s.Routable(w) {
				t.Error("a lost worker is routable")
			}
			if tc.name == "silent" {
				// It comes back when it speaks again.
				srv.quiet.Store(false)
				waitFor(t, "ready again", func() bool { return readyAddrs(s) == srv.addr })
			}
		})
	}
}

// zone is a DNS server's data: names (FQDN, lower case) to IPv4 addresses.
// A name present with no addresses answers NOERROR with no records.
type zone struct {
	mu       sync.Mutex
	a        map[string][]string
	servfail bool
	queries  atomic.Int64
}

func (z *zone) set(name string, ips ...string) {
	z.mu.Lock()
	defer z.mu.Unlock()
	z.a[name] = ips
}

func (z *zone) ServeDNS(w dns.ResponseWriter, r *dns.Msg) {
	z.queries.Add(1)
	m := new(dns.Msg)
	m.SetReply(r)
	z.mu.Lock()
	defer z.mu.Unlock()
	if z.servfail || len(r.Question) != 1 {
		m.Rcode = dns.RcodeServerFailure
		_ = w.WriteMsg(m)
		return
	}
	q := r.Question[0]
	ips, ok := z.a[strings.ToLower(q.Name)]
	switch {
	case !ok:
		m.Rcode = dns.RcodeNameError
	case q.Qtype == dns.TypeA:
		for _, ip := range ips {
			m.Answer = append(m.Answer, &dns.A{
				Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 1}, A: net.ParseIP(ip)})
		}
	}
	_ = w.WriteMsg(m)
}

// startDNS serves z over UDP on loopback and returns its address.
func startDNS(t *testing.T, z *zone) string {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	started := make(chan struct{})
	srv := &dns.Server{PacketConn: pc, Handler: z, NotifyStartedFunc: func() { close(started) }}
	done := make(chan struct{})
	go func() { _ = srv.ActivateAndServe(); close(done) }()
	<-started
	t.Cleanup(func() {
		_ = srv.Shutdown()
		<-done
	})
	return pc.LocalAddr().String()
}

// loopbackServers starts n workers on 127.0.0.2, 127.0.0.3, ... sharing one
// port, as pods behind a headless Service share theirs.
func loopbackServers(t *testing.T, n int) (int, []*server) {
	t.Helper()
	for try := 0; try < 20; try++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		var ls []net.Listener
		for i := range n {
			l, err := net.Listen("tcp", net.JoinHostPort(fmt.Sprint("127.0.0.", i+2), strconv.Itoa(port)))
			if err != nil {
				break
			}
			ls = append(ls, l)
		}
		if len(ls) < n {
			for _, l := range ls {
				l.Close()
			}
			continue
		}
		out := make([]*server, n)
		for i, l := range ls {
			l.Close()
			out[i] = startServer(t, l.Addr().String())
		}
		return port, out
	}
	t.Skip("no port free on 127.0.0.2 and up (loopback aliases unavailable?)")
	return 0, nil
}

// TestDNSDiscovery runs the set against a DNS server the test controls:
// records added join the set (checked and watched), records removed leave
// it (their watch stops, their connection closes once their requests are
// done), and a failing DNS server changes nothing.
func TestDNSDiscovery(t *testing.T) {
	port, srvs := loopbackServers(t, 3)
	z := &zone{a: map[string][]string{}}
	const name = "decode.baton.test."
	z.set(name, "127.0.0.2", "127.0.0.3")
	src, err := ParseTarget("dns:///"+name+":"+strconv.Itoa(port), startDNS(t, z))
	if err != nil {
		t.Fatal(err)
	}
	addr := func(i int) string { return srvs[i].addr }
	s := runSet(t, src, 0)
	waitFor(t, "two workers ready", func() bool { return readyAddrs(s) == addr(0)+","+addr(1) })

	// A record appears: the worker joins and is watched.
	z.set(name, "127.0.0.2", "127.0.0.3", "127.0.0.4")
	waitFor(t, "the third worker ready", func() bool { return readyAddrs(s) == addr(0)+","+addr(1)+","+addr(2) })

	// A record vanishes while a request runs on its worker: the worker
	// leaves the routing set at once; its connection, and its watch (so
	// that the request would still fail fast if it died), stay for the
	// request, then end.
	w0 := worker(s, addr(0))
	pp := &Pairer{Decode: s, DecodePolicy: mustPolicy(t, "round-robin")}
	var held []*Pair
	for range 3 {
		p, err := pp.Pick(nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, p)
	}
	if w0.Inflight() != 1 {
		t.Fatalf("in-flight on %s = %d, want 1", w0.Addr, w0.Inflight())
	}
	z.set(name, "127.0.0.3", "127.0.0.4")
	waitFor(t, "the first worker gone", func() bool { return readyAddrs(s) == addr(1)+","+addr(2) && len(s.Workers()) == 2 })
	if d := s.Draining(); len(d) != 1 || d[0] != w0 {
		t.Errorf("draining %v, want %s", d, w0.Addr)
	}
	time.Sleep(100 * time.Millisecond)
	if st := w0.Conn().GetState(); st == connectivity.Shutdown || srvs[0].watches.Load() != 1 {
		t.Fatalf("connection %v and %d watches under a running request, want open and 1", st, srvs[0].watches.Load())
	}
	for _, p := range held {
		if p.Decode == w0 {
			p.Release()
		}
	}
	waitFor(t, "its connection closed", func() bool { return w0.Conn().GetState() == connectivity.Shutdown })
	waitFor(t, "its watch stopped", func() bool { return srvs[0].watches.Load() == 0 })
	if len(s.Draining()) != 0 {
		t.Errorf("still draining: %v", s.Draining())
	}
	for _, p := range held {
		p.Release()
	}

	// The DNS server fails: the set keeps its workers.
	z.mu.Lock()
	z.servfail = true
	z.mu.Unlock()
	q := z.queries.Load()
	waitFor(t, "the failing server asked", func() bool { return z.queries.Load() > q+2 })
	if got := readyAddrs(s); got != addr(1)+","+addr(2) {
		t.Errorf("after SERVFAIL ready = %s, want the workers kept", got)
	}
	z.mu.Lock()
	z.servfail = false
	z.mu.Unlock()

	// The name goes away (a Service scaled to zero): the set empties, and
	// fills again when it returns.
	z.mu.Lock()
	delete(z.a, name)
	z.mu.Unlock()
	waitFor(t, "no workers", func() bool { return len(s.Workers()) == 0 })
	waitFor(t, "no watch left", func() bool { return srvs[1].watches.Load() == 0 && srvs[2].watches.Load() == 0 })
	z.set(name, "127.0.0.2")
	waitFor(t, "a worker back", func() bool { return readyAddrs(s) == addr(0) })
}

func TestParseTarget(t *testing.T) {
	for _, tc := range []struct {
		in, dnsServer, want, err string
	}{
		{in: "a:1, b:2,,", want: "a:1,b:2"},
		{in: "dns:///decode.ns.svc.cluster.local:8084", want: "dns:///decode.ns.svc.cluster.local:8084"},
		{in: "dns:///decode:8084", dnsServer: "10.0.0.10:53", want: "dns://10.0.0.10:53/decode:8084"},
		{in: "dns://1.1.1.1:53/decode:8084", dnsServer: "10.0.0.10:53", want: "dns://1.1.1.1:53/decode:8084"},
		{in: "", err: "at least one host:port"},
		{in: "a", err: `address "a": want host:port`},
		{in: "a:0", err: "want 1-65535"},
		{in: ":80", err: "no host"},
		{in: "dns:///decode", err: "want host:port"},
		{in: "dns:decode:80", err: "address"},
		{in: "http://x:80", err: "only scheme understood is dns"},
		{in: "dns://nope/decode:80", err: "DNS server"},
	} {
		src, err := ParseTarget(tc.in, tc.dnsServer)
		switch {
		case tc.err != "":
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("ParseTarget(%q) = %v, %v; want error %q", tc.in, src, err, tc.err)
			}
		case err != nil:
			t.Errorf("ParseTarget(%q): %v", tc.in, err)
		case src.String() != tc.want:
			t.Errorf("ParseTarget(%q) = %s, want %s", tc.in, src, tc.want)
		}
	}
}

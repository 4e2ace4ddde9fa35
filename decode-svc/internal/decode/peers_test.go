package decode

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"github.com/baton-serving/baton/prefill-svc/prefill"
	"github.com/baton-serving/baton/svckit/workerapi/workertest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

func TestPrefillAllow(t *testing.T) {
	spec := "prefill-0:50051, 10.1.0.0/16 ,*.prefill.baton.svc:9000,[::1]:7000,PreFill-Host,192.168.0.0/16:8082,[fd00::/8]:8082"
	rules, err := parseAllow(spec)
	if err != nil {
		t.Fatal(err)
	}
	l := peerLimits{allow: rules}
	for ep, want := range map[string]bool{
		"prefill-0:50051":                   true,
		"prefill-0:50052":                   false,
		"prefill-01:50051":                  false,
		"10.1.2.3:1234":                     true,
		"10.2.0.1:1234":                     false,
		"[::ffff:10.1.0.9]:80":              true,
		"a.prefill.baton.svc:9000":          true,
		"a.b.prefill.baton.svc:9000":        true,
		"a.prefill.baton.svc:9001":          false,
		"prefill.baton.svc:9000":            false,
		"evilprefill.baton.svc:9000":        false,
		"a.prefill.baton.svc.attacker:9000": false,
		"[::1]:7000":                        true,
		"[::1]:7001":                        false,
		"prefill-host:1":                    true,
		"metadata.google.internal:80":       false,
		"169.254.169.254:80":                false,
		"192.168.3.4:8082":                  true,
		"192.168.3.4:8083":                  false,
		"[fd00::1]:8082":                    true,
		"[fd00::1]:22":                      false,
		"pod.192.168.0.0:8082":              false,
	} {
		err := l.allowed(ep)
		if got := err == nil; got != want {
			t.Errorf("allowed(%q) = %v, want allowed %v", ep, err, want)
		}
		if err != nil && (!errors.Is(err, errPrefillNotAllowed) || !strings.Contains(err.Error(), "prefill_endpoint")) {
			t.Errorf("allowed(%q) = %v: want errPrefillNotAllowed naming prefill_endpoint", ep, err)
		}
	}
	if err := (&peerLimits{}).allowed("anywhere:1"); err != nil {
		t.Errorf("an empty list refused %v", err)
	}
	if r, _ := parseAllow("*"); (&peerLimits{allow: r}).allowed("anywhere:1") != nil {
		t.Error("* refused an endpoint")
	}
	for _, bad := range []string{"host:", "host:0", "host:99999", "a*b:1", "*.:1", "host:port", "10.0.0.0/8:x"} {
		if _, err := parseAllow(bad); err == nil {
			t.Errorf("parseAllow(%q) accepted it", bad)
		}
	}
}

func testPool(idle time.Duration, n int) *peerPool {
	return newPeerPool(peerLimits{idle: idle, max: n}, grpc.WithTransportCredentials(insecure.NewCredentials()))
}

// waitShutdown waits until c is closed.
func waitShutdown(t *testing.T, c *grpc.ClientConn, what string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for c.GetState() != connectivity.Shutdown {
		if time.Now().After(deadline) {
			t.Fatalf("%s: still %v after 10 s", what, c.GetState())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A connection no transfer uses is closed after the idle timeout, never
// while a transfer uses it.
func TestPeerPoolClosesIdle(t *testing.T) {
	const idle = 50 * time.Millisecond
	p := testPool(idle, 8)
	defer p.close()
	c, release, err := p.get("127.0.0.1:1")
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * idle)
	if s := c.GetState(); s == connectivity.Shutdown || p.size() != 1 {
		t.Fatalf("in use: state %v, %d kept; want it open", s, p.size())
	}
	// Used again, by two transfers: the same connection, unless its idle
	// timer fired in between (a loaded machine), when it must be closed.
	release()
	c2, r2, err := p.get("127.0.0.1:1")
	if err != nil {
		t.Fatal(err)
	}
	if c2 != c {
		waitShutdown(t, c, "the connection replaced after its idle timeout")
		c = c2
	}
	_, r3, _ := p.get("127.0.0.1:1")
	release() // a second call does nothing
	r2()
	time.Sleep(3 * idle)
	if c.GetState() == connectivity.Shutdown {
		t.Fatal("closed while a transfer still used it")
	}
	r3()
	waitShutdown(t, c, "idle connection")
	if n := p.size(); n != 0 {
		t.Fatalf("%d connections kept after the idle timeout", n)
	}
}

// At most max connections are kept: a new endpoint replaces the one idle
// longest, and is refused when all are in use.
func TestPeerPoolBound(t *testing.T) {
	p := testPool(time.Hour, 2)
	defer p.close()
	a, ra, err := p.get("127.0.0.1:1")
	if err != nil {
		t.Fatal(err)
	}
	b, rb, err := p.get("127.0.0.1:2")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := p.get("127.0.0.1:3"); !errors.Is(err, errTooManyPeers) {
		t.Fatalf("a third endpoint with two in use: %v, want errTooManyPeers", err)
	}
	rb()
	time.Sleep(10 * time.Millisecond)
	ra()
	c, rc, err := p.get("127.0.0.1:3")
	if err != nil {
		t.Fatal(err)
	}
	defer rc()
	waitShutdown(t, b, "the connection idle longest")
	if a.GetState() == connectivity.Shutdown || c.GetState() == connectivity.Shutdown {
		t.Fatal("closed a connection idle for less time")
	}
	if n := p.size(); n != 2 {
		t.Fatalf("%d connections kept, bound 2", n)
	}
}

// startPeers starts a prefill worker and a decode worker with the flags
// and returns the decode Service.
func startPeers(t *testing.T, decodeFlags ...string) (*Service, *workertest.Worker, batonv1.DecodeServiceClient) {
	t.Helper()
	model := workertest.Model(t)
	p := workertest.Start(t, "prefill-svc", prefill.New(), common(model)...)
	dec := New()
	dec.dialOpts = []grpc.DialOption{workertest.Dialer([]*workertest.Worker{p}, nil)}
	d := workertest.Start(t, "decode-svc", dec, append(common(model), decodeFlags...)...)
	return dec, p, batonv1.NewDecodeServiceClient(d.Conn)
}

func generate(t *testing.T, client batonv1.DecodeServiceClient, in *batonv1.DecodeServiceGenerateRequest) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream, err := client.Generate(ctx, in)
	for err == nil {
		_, err = stream.Recv()
	}
	if errors.Is(err, io.EOF) {
		return nil
	}
	return err
}

// A request naming a prefill endpoint --prefill-allow does not admit is
// refused before anything is reserved or dialed; one it admits is served.
func TestDisallowedPrefillRefused(t *testing.T) {
	dec, p, client := startPeers(t, "--prefill-allow", "10.9.9.9:1,*.prefill.example")
	err := generate(t, client, request("denied-1", 20, 4, p.Addr()))
	// UNAVAILABLE, not INVALID_ARGUMENT: the router chose the endpoint, so
	// the refusal is the pair's failure (the router fails over; a client
	// sees 503, not 400).
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "prefill_endpoint") ||
		!strings.Contains(err.Error(), p.Addr()) || !strings.Contains(err.Error(), "--prefill-allow") {
		t.Fatalf("a request naming %s: %v; want UNAVAILABLE naming prefill_endpoint, the address and --prefill-allow", p.Addr(), err)
	}
	if n := dec.peers.size(); n != 0 {
		t.Errorf("decode keeps %d prefill connections after refusing", n)
	}

	dec, p, client = startPeers(t, "--prefill-allow", "10.9.9.9:1,127.0.0.0/8")
	if err := generate(t, client, request("allowed-1", 20, 4, p.Addr())); err != nil {
		t.Fatalf("a request naming an allowed prefill: %v", err)
	}
	if n := dec.peers.size(); n != 1 {
		t.Errorf("decode keeps %d prefill connections after one transfer, want 1", n)
	}
}

// The idle timeout and the bound are decode's flags.
func TestPrefillConnectionFlags(t *testing.T) {
	dec, p, client := startPeers(t, "--prefill-idle-timeout", "100ms", "--max-prefill-conns", "1")
	if err := generate(t, client, request("idle-1", 20, 4, p.Addr())); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for dec.peers.size() != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the prefill connection is still open 10 s after its transfer, with --prefill-idle-timeout 100ms")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if dec.peers.max != 1 {
		t.Errorf("--max-prefill-conns 1 gave a bound of %d", dec.peers.max)
	}
}

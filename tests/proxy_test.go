//go:build e2e

package tests

import (
	"net"
	"sync"
	"sync/atomic"
	"testing"
)

// proxy forwards TCP connections to a target and can be frozen: it then
// stops forwarding in both directions without closing anything, as a
// black-holed network does.
type proxy struct {
	lis    net.Listener
	target string
	// freezeAfter > 0 freezes the proxy once that many bytes have gone from
	// the target back to the client.
	freezeAfter int64
	back        atomic.Int64
	frozen      chan struct{}
	freezeOnce  sync.Once
	done        chan struct{}
	mu          sync.Mutex
	conns       []net.Conn
}

func startProxy(t *testing.T, target string, freezeAfter int64) *proxy {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{lis: lis, target: target, freezeAfter: freezeAfter, frozen: make(chan struct{}), done: make(chan struct{})}
	go p.serve()
	t.Cleanup(p.close)
	return p
}

func (p *proxy) addr() string { return p.lis.Addr().String() }

func (p *proxy) freeze() { p.freezeOnce.Do(func() { close(p.frozen) }) }

func (p *proxy) serve() {
	forward(p.lis, p.target, func(c, u net.Conn) {
		p.mu.Lock()
		p.conns = append(p.conns, c, u)
		p.mu.Unlock()
		go p.pipe(u, c, nil)
		go p.pipe(c, u, &p.back)
	})
}

// forward accepts connections on lis, dials target for each and hands both
// ends to handle; it returns once lis is closed. A failed dial drops the
// client's connection, as an unreachable target would.
func forward(lis net.Listener, target string, handle func(client, upstream net.Conn)) {
	for {
		c, err := lis.Accept()
		if err != nil {
			return
		}
		u, err := net.Dial("tcp", target)
		if err != nil {
			c.Close()
			continue
		}
		handle(c, u)
	}
}

// pipe copies src to dst until the proxy freezes; then it holds the bytes.
func (p *proxy) pipe(dst, src net.Conn, count *atomic.Int64) {
	buf := make([]byte, 4096)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			select {
			case <-p.frozen:
				<-p.done // black hole: never forward, never close, until the test ends
				return
			default:
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
			if count != nil && p.freezeAfter > 0 && count.Add(int64(n)) >= p.freezeAfter {
				p.freeze()
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *proxy) close() {
	close(p.done)
	p.lis.Close()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
}

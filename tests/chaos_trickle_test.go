//go:build e2e && chaos

package tests

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Trickling clients (issue 18, defect 2): a client that takes a few bytes
// of its stream every second never lets a write block for long, yet falls
// ever further behind the generation. 256 of them used to hold every slot
// of the router (--max-concurrent-requests' default 256) while readiness
// said SERVING.
const (
	tricklers      = 256
	trickleTimeout = 3 * time.Second // the router's --client-write-timeout
	tricklePerCap  = 128             // --max-inflight-per-client's default
)

// chaosTrickle: a baseline of normal clients' latency; then 256 trickling
// SSE clients from one address, of which the per-client cap
// (--max-inflight-per-client, default 128) refuses the excess with 429
// naming the flag while normal clients from another address are served;
// then 256 tricklers each from its own address, which fill every slot until
// the minimum-progress rule (--client-write-timeout) evicts them; then
// normal clients are served within a generous factor of the baseline. Each
// evicted request is released everywhere within 2 s of the moment the rule
// had to fire: its last progress at the router (the relay blocks once the
// stream's queue is full, so every event the client has not taken was
// queued by then) plus the write timeout.
//
// The router keeps its default --max-concurrent-requests and
// --max-inflight-per-client; a --request-timeout well under the case's own
// bounds ends the tricklers of a router without the rule, so that such a
// router fails the case instead of hanging it.
func chaosTrickle(t *testing.T, row *chaosRow) {
	ctxFlags := []string{"--context-length", "2048"}
	f := startChaosFleet(t, chaosSpec{prefills: 1, decodes: 1, prefill: ctxFlags,
		decode: append([]string{"--kv-cache-bytes", "256MiB"}, ctxFlags...),
		router: append([]string{"--client-write-timeout", trickleTimeout.String(), "--request-timeout", "40s"}, ctxFlags...)})
	normalFrom := net.IPv4(127, 0, 0, 2)

	// The baseline: normal clients' latency on the idle fleet.
	var baseline []time.Duration
	for i := range 8 {
		took, err := normalSSE(f.router.http, normalFrom, fmt.Sprintf("baseline-%d", i))
		if err != nil {
			t.Fatalf("baseline request: %v", err)
		}
		baseline = append(baseline, took)
		row.requests++
		row.ok++
	}
	base := percentile(baseline, 0.5)
	bound := 5*base + 2*time.Second
	t.Logf("normal clients' baseline latency: median %v, max %v; after the trickle they must be served within %v", base, slices.Max(baseline), bound)

	tr := startReleaseTracker(f.all()...)
	defer tr.logLate(t)
	var evicted []string // every trickler the router admitted

	// One address: the cap refuses the excess, normal clients are served.
	one := openTricklers(t, f.router.http, "trickle-one", func(int) net.IP { return net.IPv4(127, 0, 0, 1) })
	row.requests += len(one.conns) + len(one.refused)
	row.errors += len(one.refused)
	t.Logf("256 tricklers from 127.0.0.1: %d admitted, %d refused", len(one.conns), len(one.refused))
	if len(one.refused) < tricklers-tricklePerCap || len(one.conns) > tricklePerCap {
		t.Errorf("256 tricklers from one address: %d admitted, %d refused; want at most %d admitted (--max-inflight-per-client)",
			len(one.conns), len(one.refused), tricklePerCap)
	}
	for _, r := range one.refused {
		if r.status != http.StatusTooManyRequests || !strings.Contains(r.body, "max-inflight-per-client") {
			t.Errorf("a trickler beyond the cap was refused with %d %q; want 429 naming --max-inflight-per-client", r.status, r.body)
			break
		}
	}
	for i := range 4 {
		if _, err := normalSSE(f.router.http, normalFrom, fmt.Sprintf("beside-one-%d", i)); err != nil {
			t.Errorf("a normal client beside 256 tricklers from one address: %v", err)
			row.errors++
		} else {
			row.ok++
		}
		row.requests++
	}
	evicted = append(evicted, one.ids()...)
	gone := f.waitEvicted(t, tr, one.ids())
	one.close()
	f.waitIdle(t, 3*time.Second)

	// One address each: they fill every slot until the rule evicts them;
	// then normal clients are served as usual.
	many := openTricklers(t, f.router.http, "trickle-many", func(i int) net.IP { return net.IPv4(127, 0, byte(1+i/250), byte(1+i%250)) })
	defer many.close()
	row.requests += len(many.conns) + len(many.refused)
	row.errors += len(many.refused)
	t.Logf("256 tricklers from their own addresses: %d admitted, %d refused", len(many.conns), len(many.refused))
	if len(many.conns) < tricklers*9/10 {
		t.Errorf("only %d of 256 tricklers from their own addresses were admitted: %v", len(many.conns), many.refused[:min(3, len(many.refused))])
	}
	evicted = append(evicted, many.ids()...)
	if f.waitEvicted(t, tr, many.ids()) && gone {
		var after []time.Duration
		for i := range 8 {
			took, err := normalSSE(f.router.http, normalFrom, fmt.Sprintf("after-%d", i))
			row.requests++
			if err != nil {
				t.Errorf("a normal client after the trickle: %v", err)
				row.errors++
				continue
			}
			row.ok++
			after = append(after, took)
		}
		if len(after) > 0 {
			t.Logf("normal clients after the trickle: median %v, max %v (baseline median %v)", percentile(after, 0.5), slices.Max(after), base)
			if slices.Max(after) > bound {
				t.Errorf("a normal client after the trickle took %v; baseline median %v, bound 5x + 2 s = %v", slices.Max(after), base, bound)
			}
		}
	}

	released, held := tr.finish(releaseBound + time.Second)
	row.release = released
	row.errors += len(released)
	for _, id := range held {
		row.hung++
		var where []string
		for _, n := range f.all() {
			if slices.Contains(ids(listed(t, n)), id) {
				where = append(where, n.name)
			}
		}
		if row.hung <= 5 {
			t.Errorf("trickler %s still held by %v, %v after the minimum-progress rule had to end it", id, where, releaseBound+time.Second)
		}
	}
	if len(released)+len(held) != len(evicted) {
		t.Errorf("%d admitted tricklers, %d tracked", len(evicted), len(released)+len(held))
	}
	many.close()
	row.leaks = f.settle(t)
	f.diagnoseHealthy(t)
}

// waitEvicted polls the router's in-flight table until none of the
// tricklers' requests is listed, and records each one's abort with the
// tracker at the moment the rule had to fire: its last progress at the
// router plus the write timeout. A router that lets them drip on is given
// until the slowest one's deadline plus 5 s; false when some are still
// listed then.
func (f *chaosFleet) waitEvicted(t *testing.T, tr *releaseTracker, want []string) bool {
	t.Helper()
	stalled := map[string]time.Time{} // id -> its last progress at the router
	for _, id := range want {
		stalled[id] = time.Now()
	}
	start := time.Now()
	for {
		at := time.Now()
		var left []string
		for _, r := range listed(t, f.router) {
			id := r.GetRequestId()
			if _, ok := stalled[id]; ok {
				stalled[id] = at.Add(-time.Duration(r.GetSinceProgressSeconds() * float64(time.Second)))
				left = append(left, id)
			}
		}
		latest := time.Time{}
		for _, s := range stalled {
			latest = later(latest, s)
		}
		if len(left) == 0 || time.Since(latest) > trickleTimeout+5*time.Second || time.Since(start) > 60*time.Second {
			for id, s := range stalled {
				tr.aborted(id, s.Add(trickleTimeout))
			}
			if len(left) > 0 {
				slices.Sort(left)
				t.Errorf("%d tricklers still in flight at the router %v after they started, last progress %v ago: %v",
					len(left), time.Since(start).Round(time.Second), time.Since(latest).Round(100*time.Millisecond), left[:min(5, len(left))])
				return false
			}
			t.Logf("%d tricklers evicted %v after they were all admitted", len(want), time.Since(start).Round(100*time.Millisecond))
			return true
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// trickleSet is a batch of trickling clients: the connections of those the
// router admitted, dripping, and the answers of those it refused.
type trickleSet struct {
	conns   map[string]net.Conn // by request id
	refused []refusal
	stop    chan struct{}
	wg      sync.WaitGroup
	once    sync.Once
}

type refusal struct {
	status int
	body   string
}

func (s *trickleSet) ids() []string {
	var out []string
	for id := range s.conns {
		out = append(out, id)
	}
	slices.Sort(out)
	return out
}

func (s *trickleSet) close() {
	s.once.Do(func() {
		close(s.stop)
		for _, c := range s.conns {
			c.Close()
		}
		s.wg.Wait()
	})
}

// openTricklers opens 256 streaming completions at once, trickler i from
// address from(i), and returns once each has its answer's head (a stream
// starts with its first event). The admitted ones then drip: 256 bytes a
// second, through a receive buffer of a few KiB with 1,200-byte segments,
// so that the router's socket buffers stay small and a long generation
// (top-20 logprobs make each event a couple of KiB) soon outgrows them.
func openTricklers(t *testing.T, routerHTTP, prefix string, from func(i int) net.IP) *trickleSet {
	t.Helper()
	s := &trickleSet{conns: map[string]net.Conn{}, stop: make(chan struct{})}
	var mu sync.Mutex
	var wg sync.WaitGroup
	var failures []string
	sem := make(chan struct{}, 64)
	for i := range tricklers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			id := fmt.Sprintf("%s-%d", prefix, i)
			conn, br, status, err := trickleOpen(routerHTTP, from(i), id)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err != nil:
				failures = append(failures, fmt.Sprintf("%s: %v", id, err))
			case conn == nil:
				s.refused = append(s.refused, status)
			default:
				s.conns[id] = conn
				s.wg.Add(1)
				go s.drip(conn, br)
			}
		}()
	}
	wg.Wait()
	for _, msg := range failures[:min(5, len(failures))] {
		t.Errorf("trickler: %s", msg)
	}
	return s
}

// drip reads 256 bytes a second until the stream ends or the set closes.
func (s *trickleSet) drip(conn net.Conn, br *bufio.Reader) {
	defer s.wg.Done()
	buf := make([]byte, 256)
	for {
		select {
		case <-s.stop:
			return
		case <-time.After(time.Second):
		}
		if _, err := br.Read(buf); err != nil {
			return
		}
	}
}

// trickleOpen sends one streaming completion from address from and reads
// its answer's head: the admitted stream's connection and reader, or the
// refusal.
func trickleOpen(routerHTTP string, from net.IP, id string) (net.Conn, *bufio.Reader, refusal, error) {
	d := net.Dialer{Timeout: 10 * time.Second, LocalAddr: &net.TCPAddr{IP: from}, Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		if err := c.Control(func(fd uintptr) {
			if serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 2048); serr == nil {
				serr = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_TCP, syscall.TCP_MAXSEG, 1200)
			}
		}); err != nil {
			return err
		}
		return serr
	}}
	conn, err := d.Dial("tcp", routerHTTP)
	if err != nil {
		return nil, nil, refusal{}, err
	}
	body := `{"prompt":"Once upon a time","max_tokens":1500,"stream":true,"ignore_eos":true,"logprobs":20,"temperature":0}`
	_ = conn.SetDeadline(time.Now().Add(60 * time.Second))
	fmt.Fprintf(conn, "POST /v1/completions HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nX-Request-Id: %s\r\nContent-Length: %d\r\n\r\n%s",
		routerHTTP, id, len(body), body)
	br := bufio.NewReaderSize(conn, 256)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		conn.Close()
		return nil, nil, refusal{}, err
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		conn.Close()
		return nil, nil, refusal{resp.StatusCode, string(b)}, nil
	}
	_ = conn.SetDeadline(time.Time{})
	return conn, br, refusal{}, nil
}

// normalSSE is a normal client from address from: a short streaming
// completion, read to its end at once. It returns how long it took.
func normalSSE(routerHTTP string, from net.IP, id string) (time.Duration, error) {
	d := net.Dialer{Timeout: 10 * time.Second, LocalAddr: &net.TCPAddr{IP: from}}
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DisableKeepAlives: true, DialContext: d.DialContext}}
	body := `{"prompt":"Once upon a time","max_tokens":16,"stream":true,"ignore_eos":true,"temperature":0}`
	req, err := http.NewRequestWithContext(context.Background(), http.MethodPost, "http://"+routerHTTP+"/v1/completions", strings.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Request-Id", id)
	start := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", id, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	took := time.Since(start)
	switch {
	case err != nil:
		return 0, fmt.Errorf("%s: reading the stream: %w", id, err)
	case resp.StatusCode != http.StatusOK:
		return 0, fmt.Errorf("%s: %s %s", id, resp.Status, b)
	case !strings.HasSuffix(strings.TrimSpace(string(b)), "data: [DONE]") || strings.Count(string(b), `"text"`) < 16:
		return 0, fmt.Errorf("%s: an incomplete stream: %q", id, b)
	}
	return took, nil
}

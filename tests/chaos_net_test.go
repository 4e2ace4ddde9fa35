//go:build e2e && chaos

package tests

import (
	"bufio"
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/baton-serving/baton/engine/testmodel"
	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
)

// chaosBlackhole: the network between decode and prefill stops forwarding
// in the middle of transfers, without closing anything (the router still
// reaches prefill). Both sides detect it by their deadlines and release;
// clients get DEADLINE_EXCEEDED; diagnose, run while it lasts, names
// decode's transfer queue and places its probe in kv_receive. With
// --credit-window 1 prefill waits for decode's credits, and its credit
// deadline fires.
func chaosBlackhole(t *testing.T, row *chaosRow) {
	blackhole(t, row, blackholeCase{spec: chaosSpec{decode: []string{"--credit-window", "1"}}, clients: 16, prompt: 300})
}

// chaosBlackholeLongPrompts: the same black hole with decode's default
// credit window (32 chunks of up to 256 KiB) and prompts whose KV outgrows
// the HTTP/2 and TCP windows: a model of 24 layers of 256 dimensions keeps
// 24 KiB of KV per token at F16, 7 MiB per 300-token prompt. Prefill's
// sends then block on flow control with credit to spare; its send deadline
// (--transfer-idle-timeout) must end them and release the pages, as the
// credit deadline does with a window of 1.
func chaosBlackholeLongPrompts(t *testing.T, row *chaosRow) {
	model := filepath.Join(t.TempDir(), "kv-heavy.gguf")
	// The 110M preset's storage (Q8_0, tied), in a shape that is cheap to
	// compute for its KV.
	spec, _ := testmodel.Preset("llama-110m")
	spec.Dim, spec.Hidden, spec.Layers, spec.Heads, spec.KVHeads, spec.Vocab, spec.Context = 256, 512, 24, 4, 4, 512, 512
	if err := testmodel.Write(model, spec); err != nil {
		t.Fatal(err)
	}
	kv := []string{"--kv-cache-bytes", "128MiB"} // 8 prompts in flight on either side
	blackhole(t, row, blackholeCase{spec: chaosSpec{model: model, prefill: kv, decode: kv}, clients: 8, prompt: 300,
		stall: kvtransferSendStalled})
}

// kvtransferSendStalled is in the error prefill logs when a send made no
// progress for its deadline (kvtransfer.ErrSendStalled).
const kvtransferSendStalled = "a send made no progress"

// blackholeCase shapes a black-hole case: the fleet's extra flags (the
// deadlines are added), the load, and what prefill's stalls must say.
type blackholeCase struct {
	spec            chaosSpec
	clients, prompt int
	// stall, when set, must be in the error of at least one of prefill's
	// "transfer stalled" lines: the case exercises that deadline.
	stall string
}

func blackhole(t *testing.T, row *chaosRow, c blackholeCase) {
	var px *selectiveProxy
	spec := c.spec
	spec.prefills, spec.decodes = 1, 1
	// Prefill gives up on a silent decode before decode gives up on it,
	// so that both ends' deadlines are exercised.
	spec.prefill = append(spec.prefill, "--transfer-idle-timeout", "4s")
	spec.decode = append(spec.decode, "--transfer-idle-timeout", "5s", "--handshake-timeout", "5s", "--abort-ack-timeout", "300ms")
	spec.routerPrefill = func(_ int, addr string) string {
		px = startSelectiveProxy(t, addr)
		return px.addr()
	}
	f := startChaosFleet(t, spec)
	load := startLoad(f.client(t), c.clients, func(n int) *batonv1.GenerateRequest {
		return longRequest(f.golden, fmt.Sprintf("bh-%d", n), c.prompt, 16)
	})
	waitListed(t, f.decodes[0], batonv1.RequestState_REQUEST_STATE_TRANSFERRING, 2, 15*time.Second)
	// The router still reaches prefill: only decode's connections, to
	// the proxy, are cut.
	decodePid := f.decodes[0].p.cmd.Process.Pid
	if n := px.blackhole(fromProcess(decodePid, px.addr())); n == 0 {
		load.halt()
		t.Fatalf("the black hole was not injected: none of the proxy's %d connections is decode's (pid %d; its sockets: %v)",
			px.count(), decodePid, socketInodes(decodePid))
	}
	cutAt := time.Now()
	load.halt()
	inflight := ids(listed(t, f.decodes[0]))

	// While it lasts (the deadlines are 4-5 s away), diagnose.
	time.Sleep(1200 * time.Millisecond)
	d := f.diagnose(t, "--samples", "2", "--probe-timeout", "2s")
	dec := d.service(t, "decode-0")
	row.diagnose = fmt.Sprintf("%s: decode-0 %s; probe at %s", d.Status, dec.Stage, probeStage(d))
	if d.Status != "wedged" || !dec.Stalled || dec.Stage != "transfer queue" {
		t.Errorf("diagnose during the black hole: %s; want wedged, decode-0 stalled in the transfer queue", d.Summary)
	}
	// The probe stalls where the requests do — unless the router's canary
	// has already seen the partition and routes nothing (a fast failure is
	// as good an answer).
	canaryCaught := slices.ContainsFunc(d.service(t, "router").Problems, func(p string) bool { return strings.Contains(p, "canary") })
	if d.Probe == nil || d.Probe.OK || !canaryCaught && (d.Probe.Service != "decode-0" || d.Probe.Stage != "kv_receive") {
		t.Errorf("diagnose's probe: %+v; want it stalled at kv_receive on decode-0", d.Probe)
	}
	if !slices.ContainsFunc(dec.Stuck, func(s struct {
		ID      string `json:"request_id"`
		TraceID string `json:"trace_id"`
	}) bool {
		return slices.Contains(inflight, s.ID) && len(s.TraceID) == 32
	}) {
		t.Errorf("diagnose names none of the cut-off requests %v with a trace id: %+v", inflight, dec.Stuck)
	}

	// Each side is held to the bound from its own detection: decode (and
	// the router) from the deadline that failed the client, prefill from
	// its own transfer deadline (its log says when) — it cannot hear of
	// decode's abort through the black hole. How much later than decode
	// prefill let go is measured too, and logged.
	trDecode := startReleaseTracker(f.router, f.decodes[0])
	trPrefill := startReleaseTracker(f.prefills[0])
	trLag := startReleaseTracker(f.prefills[0])
	reqs := load.finish(t, 15*time.Second)
	failAfter, byCode := tally(row, reqs, cutAt)
	row.told = failAfter
	stalledAt := logTimes(f.prefills[0].p.Stderr(), "transfer stalled; releasing")
	if c.stall != "" {
		errs := logErrs(f.prefills[0].p.Stderr(), "transfer stalled; releasing")
		n := 0
		for _, e := range errs {
			if strings.Contains(e, c.stall) {
				n++
			}
		}
		t.Logf("prefill's stalls: %d of %d say %q", n, len(errs), c.stall)
		if n == 0 {
			t.Errorf("no transfer stalled with %q (%d stalled: %v): the case did not exercise that deadline", c.stall, len(errs), errs)
		}
	}
	for _, r := range reqs {
		if r.err == nil {
			continue
		}
		trDecode.aborted(r.id, r.end) // the deadline fired when the client heard of it
		trLag.aborted(r.id, r.end)
		if at, ok := stalledAt[r.id]; ok {
			trPrefill.aborted(r.id, at)
		} else {
			trPrefill.aborted(r.id, r.end)
		}
	}
	defer trDecode.logLate(t)
	defer trPrefill.logLate(t)
	releasedD, heldD := trDecode.finish(releaseBound + time.Second)
	releasedP, heldP := trPrefill.finish(releaseBound + 5*time.Second)
	lag, _ := trLag.finish(0)
	row.release = append(releasedD, releasedP...)
	t.Logf("%d requests cut off; outcomes %v; failures surfaced after %v (max); %d prefill transfer deadlines fired; prefill let go up to %v after decode's abort",
		len(inflight), byCode, maxDur(failAfter), len(stalledAt), maxDur(lag).Round(time.Millisecond))
	if held := append(heldD, heldP...); len(held) > 0 {
		t.Errorf("still held after their deadlines: %v", held)
	}
	for code, n := range byCode {
		if code != codes.OK && code != codes.DeadlineExceeded {
			t.Errorf("%d requests ended with %v; want OK or DEADLINE_EXCEEDED", n, code)
		}
	}
	// A DEADLINE_EXCEEDED before the first token is retried once, on the
	// only pair: through the same black hole, to decode's deadline again.
	if m := maxDur(failAfter); m > 2*5*time.Second+releaseBound {
		t.Errorf("a client waited %v after the cut; decode's deadlines are 5 s, twice with the router's retry", m)
	}
	// The network heals: the black-holed connections finally break.
	px.heal()
	row.leaks = f.settle(t)
	f.diagnoseHealthy(t)
}

// logErrs reads JSON log lines and returns, by request id, the err field
// of each line with message msg.
func logErrs(logs, msg string) map[string]string {
	out := map[string]string{}
	for _, line := range strings.Split(logs, "\n") {
		var l struct {
			Msg       string `json:"msg"`
			RequestID string `json:"request_id"`
			Err       string `json:"err"`
		}
		if json.Unmarshal([]byte(line), &l) == nil && l.Msg == msg && l.RequestID != "" {
			out[l.RequestID] = l.Err
		}
	}
	return out
}

// fromProcess picks the connections that process pid opened to server
// (the proxy's listening address). A connection is its four addresses:
// the process's end is the socket listed in /proc/net/tcp (or tcp6) with
// the client's address as local, server as remote, and an inode among the
// process's open sockets (/proc/PID/fd). A local port alone is not enough:
// ephemeral ports are shared by unrelated connections, and TIME_WAIT
// entries, listed with inode 0, outlive their sockets.
func fromProcess(pid int, server string) func(client net.Addr) bool {
	return func(client net.Addr) bool {
		ca, err := netip.ParseAddrPort(client.String())
		if err != nil {
			return false
		}
		sa, err := netip.ParseAddrPort(server)
		if err != nil {
			return false
		}
		mine := socketInodes(pid)
		for _, s := range tcpSockets() {
			if s.inode != "0" && mine[s.inode] && s.local == unmap(ca) && s.remote == unmap(sa) {
				return true
			}
		}
		return false
	}
}

func unmap(a netip.AddrPort) netip.AddrPort { return netip.AddrPortFrom(a.Addr().Unmap(), a.Port()) }

// socketInodes is the set of inodes of process pid's open sockets.
func socketInodes(pid int) map[string]bool {
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return nil
	}
	out := map[string]bool{}
	for _, fd := range fds {
		l, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
		if inode, ok := strings.CutPrefix(l, "socket:["); err == nil && ok {
			out[strings.TrimSuffix(inode, "]")] = true
		}
	}
	return out
}

// tcpSocket is one line of /proc/net/tcp or tcp6.
type tcpSocket struct {
	local, remote netip.AddrPort
	inode         string
}

// tcpSockets lists the machine's TCP sockets (IPv4 and IPv6).
func tcpSockets() []tcpSocket {
	var out []tcpSocket
	for _, file := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(file)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			f := strings.Fields(line)
			if len(f) < 10 {
				continue
			}
			l, lok := procAddr(f[1])
			r, rok := procAddr(f[2])
			if lok && rok {
				out = append(out, tcpSocket{local: l, remote: r, inode: f[9]})
			}
		}
	}
	return out
}

// procAddr parses an address of /proc/net/tcp{,6}: the IP in hex, as 32-bit
// words in host (little-endian) order, then ":" and the port in hex.
func procAddr(s string) (netip.AddrPort, bool) {
	ipHex, portHex, ok := strings.Cut(s, ":")
	port, err := strconv.ParseUint(portHex, 16, 16)
	if !ok || err != nil || (len(ipHex) != 8 && len(ipHex) != 32) {
		return netip.AddrPort{}, false
	}
	raw, err := hex.DecodeString(ipHex)
	if err != nil {
		return netip.AddrPort{}, false
	}
	for w := 0; w < len(raw); w += 4 {
		raw[w], raw[w+1], raw[w+2], raw[w+3] = raw[w+3], raw[w+2], raw[w+1], raw[w]
	}
	ip, _ := netip.AddrFromSlice(raw)
	return netip.AddrPortFrom(ip.Unmap(), uint16(port)), true
}

// logTimes reads JSON log lines and returns, by request id, when each line
// with message msg was written.
func logTimes(logs, msg string) map[string]time.Time {
	out := map[string]time.Time{}
	for _, line := range strings.Split(logs, "\n") {
		var l struct {
			Time      time.Time `json:"time"`
			Msg       string    `json:"msg"`
			RequestID string    `json:"request_id"`
		}
		if json.Unmarshal([]byte(line), &l) == nil && l.Msg == msg && l.RequestID != "" {
			out[l.RequestID] = l.Time
		}
	}
	return out
}

func probeStage(d diagnoseResult) string {
	if d.Probe == nil {
		return "-"
	}
	if d.Probe.OK {
		return "ok"
	}
	return d.Probe.Stage
}

// chaosSlowClient: two clients stop reading their streams — one an SSE
// stream of the OpenAI API, one a gRPC stream — after the first event,
// without closing them. Their requests are bounded by the router's
// --request-timeout and released everywhere, while the other clients'
// requests are served correctly. The context window is raised to 2,048
// tokens so that the unread output outgrows every buffer on the way (HTTP/2
// flow control, the kernel's socket buffers).
func chaosSlowClient(t *testing.T, row *chaosRow) {
	const requestTimeout = 12 * time.Second
	ctxFlags := []string{"--context-length", "2048"}
	f := startChaosFleet(t, chaosSpec{prefills: 1, decodes: 1, prefill: ctxFlags, decode: ctxFlags,
		router: append([]string{"--request-timeout", requestTimeout.String()}, ctxFlags...)})
	tr := startReleaseTracker(f.all()...)
	sseConn, sseStart := slowSSE(t, f.router.http)
	defer sseConn.Close()
	grpcStop, grpcStart := slowGRPC(t, f.router.grpc, "slow-grpc")
	defer grpcStop()
	var sseID string
	for _, r := range listed(t, f.router) {
		if id := r.GetRequestId(); id != "slow-grpc" {
			sseID = id
		}
	}
	if sseID == "" {
		t.Fatal("the SSE client's request is not in flight at the router")
	}

	// Wait until the router's sends to the gRPC reader block.
	for {
		i := slices.IndexFunc(listed(t, f.router), func(r *batonv1.RequestInfo) bool {
			return r.GetRequestId() == "slow-grpc" && r.GetSinceProgressSeconds() >= 1
		})
		if i >= 0 {
			break
		}
		if time.Since(grpcStart) > requestTimeout-4*time.Second {
			t.Fatalf("the router never blocked on the client that does not read")
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("the router's sends blocked %v into the request", time.Since(grpcStart).Round(100*time.Millisecond))
	d := f.diagnose(t, "--samples", "2")
	rs := d.service(t, "router")
	row.diagnose = fmt.Sprintf("%s: router %s", d.Status, rs.Stage)
	var stuck []string
	for _, s := range rs.Stuck {
		stuck = append(stuck, s.ID)
	}
	if !rs.Stalled || rs.Stage != "streaming" || !slices.Contains(stuck, "slow-grpc") {
		t.Errorf("diagnose with clients not reading: %s; want the router's slow-grpc stalled in streaming", d.Summary)
	}
	if d.Probe == nil || !d.Probe.OK {
		t.Errorf("diagnose's probe failed beside the slow clients: %+v", d.Probe)
	}

	// Meanwhile the others are served: golden requests, all correct.
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failures []string
	gens := f.golden.Generations
	for i := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			gen := gens[i%len(gens)]
			req := greedy(gen.Prompt, uint32(len(gen.GeneratedIDs)))
			req.RequestId = fmt.Sprintf("other-%d", i)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			resp, err := complete(ctx, f.client(t), req)
			mu.Lock()
			defer mu.Unlock()
			row.requests++
			switch {
			case err != nil:
				failures = append(failures, fmt.Sprintf("%s: %v", req.RequestId, err))
				row.errors++
			case !slices.Equal(resp.GetTokenIds(), u32s(gen.GeneratedIDs)):
				failures = append(failures, fmt.Sprintf("%s: wrong tokens", req.RequestId))
				row.errors++
			default:
				row.ok++
			}
		}()
	}
	wg.Wait()
	for _, msg := range failures {
		t.Errorf("another client was affected: %s", msg)
	}
	if time.Since(grpcStart) > requestTimeout {
		t.Errorf("the other clients were served only %v into the slow requests, past their deadline", time.Since(grpcStart))
	}

	// The slow ones end at their deadline, everywhere.
	tr.aborted(sseID, sseStart.Add(requestTimeout))
	tr.aborted("slow-grpc", grpcStart.Add(requestTimeout))
	defer tr.logLate(t)
	released, held := tr.finish(time.Until(grpcStart.Add(requestTimeout)) + releaseBound + time.Second)
	row.requests += 2
	row.release = released
	row.errors += len(released) // their deadline, surfaced by ending the stream
	for _, id := range held {
		row.hung++
		var where []string
		for _, n := range f.all() {
			if slices.Contains(ids(listed(t, n)), id) {
				where = append(where, n.name)
			}
		}
		t.Errorf("the slow client's request %s is still held by %v, %v after its %v deadline, the client connected and not reading",
			id, where, releaseBound+time.Second, requestTimeout)
	}
	sseConn.Close()
	grpcStop()
	row.leaks = f.settle(t)
	f.diagnoseHealthy(t)
}

// slowGRPC starts a streaming Generate with no deadline of its own, reads
// its first event and then nothing: the router's sends soon block on HTTP/2
// flow control (the client's windows are fixed at 64 KiB). stop ends it.
func slowGRPC(t *testing.T, routerGRPC, id string) (stop func(), started time.Time) {
	t.Helper()
	conn, err := grpc.NewClient(routerGRPC, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(1<<16), grpc.WithInitialConnWindowSize(1<<16))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	stop = func() { cancel(); conn.Close() }
	started = time.Now()
	s, err := batonv1.NewRouterServiceClient(conn).Generate(ctx, &batonv1.GenerateRequest{RequestId: id, Prompt: "Once upon a time",
		Sampling: &batonv1.SamplingParams{Temperature: proto.Float32(0), MaxNewTokens: 2000, IgnoreEos: true, Logprobs: true, TopLogprobs: 20}})
	if err == nil {
		_, err = s.Recv()
	}
	if err != nil {
		stop()
		t.Fatalf("slow gRPC client: %v", err)
	}
	return stop, started
}

// slowSSE opens a streaming completion whose client reads the headers and
// the first event, then nothing more, with a tiny receive buffer so that
// the router's writes soon block.
func slowSSE(t *testing.T, routerHTTP string) (net.Conn, time.Time) {
	t.Helper()
	d := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		if err := c.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) }); err != nil {
			return err
		}
		return serr
	}}
	conn, err := d.Dial("tcp", routerHTTP)
	if err != nil {
		t.Fatal(err)
	}
	body := `{"prompt":"Once upon a time","max_tokens":2000,"stream":true,"ignore_eos":true,"logprobs":20,"temperature":0}`
	started := time.Now()
	fmt.Fprintf(conn, "POST /v1/completions HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", routerHTTP, len(body), body)
	br := bufio.NewReaderSize(conn, 512)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("streaming completion: %s %s", resp.Status, b)
	}
	if _, err := br.ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	return conn, started
}

// count is the number of connections the proxy has accepted.
func (p *selectiveProxy) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.conns)
}

// TestFromProcess: the black hole's connection matcher picks this
// process's connections to the proxy, also when a TIME_WAIT entry on the
// same local port (inode 0) is listed beside it, and not another
// process's.
func TestFromProcess(t *testing.T) {
	proxy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	other, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	go func() { // the other server closes after the client does
		for {
			c, err := other.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(io.Discard, c); c.Close() }()
		}
	}()
	reuse := func(_, _ string, c syscall.RawConn) error {
		var serr error
		if err := c.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1) }); err != nil {
			return err
		}
		return serr
	}
	pick := fromProcess(os.Getpid(), proxy.Addr().String())
	for i := range 20 {
		// A closed connection leaves its port in TIME_WAIT (bound before
		// connecting, so that the port may be bound again)...
		d := net.Dialer{Control: reuse, LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)}}
		c, err := d.Dial("tcp", other.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		port := c.LocalAddr().(*net.TCPAddr).Port
		c.Close()
		// ... and a new one to the proxy reuses the port.
		d.LocalAddr = &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: port}
		var mine net.Conn
		for range 100 {
			if mine, err = d.Dial("tcp", proxy.Addr().String()); err == nil {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		if err != nil {
			t.Fatalf("trial %d: dialing from port %d: %v", i, port, err)
		}
		accepted, err := proxy.Accept()
		if err != nil {
			t.Fatal(err)
		}
		if !pick(accepted.RemoteAddr()) {
			t.Fatalf("trial %d: this process's connection from port %d is not matched", i, port)
		}
		mine.Close()
		accepted.Close()
	}
	// Another process's connection is not this one's.
	cmd := exec.Command("bash", "-c", "exec 3<>/dev/tcp/"+strings.Replace(proxy.Addr().String(), ":", "/", 1)+"; sleep 30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	theirs, err := proxy.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer theirs.Close()
	if pick(theirs.RemoteAddr()) {
		t.Fatal("another process's connection is matched as this one's")
	}
	if !fromProcess(cmd.Process.Pid, proxy.Addr().String())(theirs.RemoteAddr()) {
		t.Fatal("the other process's connection is not matched as its own")
	}
}

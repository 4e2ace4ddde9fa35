//go:build e2e

package tests

import (
	"bufio"
	"bytes"
	"context"
	"net/http"
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

	"github.com/baton-serving/baton/engine/refdata"
	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
)

// upEnv is the worker configuration of the `up` tests: small, one thread
// each (the machine is shared), round-robin so every worker gets traffic.
var upEnv = []string{"BATON_KV_CACHE_BYTES=64MiB", "BATON_THREADS=1",
	"BATON_PREFILL_POLICY=round-robin", "BATON_DECODE_POLICY=round-robin"}

// upPorts is more than `up` takes for 2+2 workers (gRPC, HTTP and admin
// ports), so the run found free covers every layout.
const upPorts = 20

// TestBatonctlUpKillDecode: with `up --prefill-workers 2 --decode-workers
// 2` under load, kill -9 of one decode worker hangs no client, the
// survivors serve the golden output at once, and `up` restarts the dead
// worker on its ports: within 15 s it is ready and the router sends it
// requests again. `up` keeps running and Ctrl-C still stops it cleanly.
func TestBatonctlUpKillDecode(t *testing.T) {
	model := refdata.Model(t)
	g := loadGolden(t)
	base := consecutiveFreePorts(t, upPorts)
	p, logDir := startUp(t, 60*time.Second, upEnv, "--port-base", strconv.Itoa(base),
		"--prefill-workers", "2", "--decode-workers", "2", "--model", model)
	addr := func(off int) string { return "127.0.0.1:" + strconv.Itoa(base+off) }
	// decode#1 is gRPC P+4, HTTP P+5; decode#2 gRPC P+8, HTTP P+9.
	victimGRPC, victimHTTP, otherHTTP := addr(4), addr(5), addr(9)
	waitServing(t, dial(t, addr(1)), "baton.v1.RouterService")
	client := batonv1.NewRouterServiceClient(dial(t, addr(1)))
	gen := g.Generations[0]
	want := u32s(gen.GeneratedIDs)

	// Both decode workers serve before the kill.
	for end := time.Now().Add(45 * time.Second); finishedAt(victimHTTP) < 1 || finishedAt(otherHTTP) < 1; {
		if time.Now().After(end) {
			t.Fatalf("not both decode workers served within 45 s (decode#1 %v, decode#2 %v)", finishedAt(victimHTTP), finishedAt(otherHTTP))
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		_, err := complete(ctx, client, greedy(gen.Prompt, uint32(len(gen.GeneratedIDs))))
		cancel()
		if err != nil {
			t.Fatalf("before the kill: %v", err)
		}
	}

	// Load: four clients in a loop, each request with a 30 s deadline.
	type result struct {
		start, end time.Time
		err        error
		golden     bool
	}
	var mu sync.Mutex
	var results []result
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				start := time.Now()
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				resp, err := complete(ctx, client, greedy(gen.Prompt, uint32(len(gen.GeneratedIDs))))
				cancel()
				mu.Lock()
				results = append(results, result{start, time.Now(), err, err == nil && slices.Equal(resp.GetTokenIds(), want)})
				mu.Unlock()
			}
		}()
	}
	time.Sleep(time.Second)
	victim := childPid(t, p.cmd.Process.Pid, victimGRPC)
	if victim == 0 {
		t.Fatalf("no decode#1 process on %s", victimGRPC)
	}
	killed := time.Now()
	if err := syscall.Kill(victim, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}

	// Back: a new process, ready, and given requests by the router.
	before := -1.0
	var back time.Duration
	for {
		if pid := childPid(t, p.cmd.Process.Pid, victimGRPC); pid != 0 && pid != victim && ready(victimHTTP) {
			if before < 0 {
				before = finishedAt(victimHTTP)
			}
			if finishedAt(victimHTTP) > before {
				back = time.Since(killed)
				break
			}
		}
		if time.Since(killed) > 15*time.Second {
			close(stop)
			wg.Wait()
			t.Fatalf("decode#1 not back and routed to within 15 s of its kill -9 (restarted: %v)\n%s", before >= 0, p.Stderr())
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("decode#1 back and serving %v after kill -9", back.Round(10*time.Millisecond))
	time.Sleep(time.Second)
	close(stop)
	wg.Wait()

	// No client hung; what was in flight on the victim may fail, with a
	// status; everything sent a moment after the kill is golden.
	var failed, lateBad, total int
	for _, r := range results {
		total++
		if r.end.Sub(r.start) > 25*time.Second {
			t.Errorf("a request hung: %v after %v", r.err, r.end.Sub(r.start))
		}
		if !r.golden {
			failed++
			if r.start.After(killed.Add(time.Second)) {
				lateBad++
				t.Errorf("request sent %v after the kill: golden %v, err %v", r.start.Sub(killed).Round(time.Millisecond), r.golden, r.err)
			}
		}
	}
	t.Logf("%d requests under load, %d failed (in flight on the victim at the kill)", total, failed)
	if failed > 4 {
		t.Errorf("%d requests failed; at most the 4 in flight at the kill may", failed)
	}
	select {
	case <-p.done:
		t.Fatalf("batonctl up exited after kill -9 of one decode worker:\n%s", p.Stderr())
	default:
	}
	if !strings.Contains(p.Stderr(), "decode-svc#1 exited unexpectedly (signal: killed)") {
		t.Errorf("up's stderr does not report the dead worker:\n%s", p.Stderr())
	}

	p.signal(t, syscall.SIGINT)
	if code := p.wait(t, 30*time.Second); code != 0 {
		t.Errorf("batonctl up exit code after Ctrl-C = %d, want 0\n%s", code, p.Stderr())
	}
	if n := strings.Count(upLogs(t, logDir), `"msg":"stopped"`); n != 5 {
		t.Errorf("%d services logged a clean stop, want 5 (the restarted decode#1 included)", n)
	}
}

// TestBatonctlUpCtrlC: Ctrl-C at a terminal sends SIGINT to the whole
// foreground process group. `up` keeps its services out of that group and
// stops them itself, so it exits 0 every time: fresh `up`s, as many as fit
// in about a minute (at most 10, at least 3), each interrupted once it is
// up.
func TestBatonctlUpCtrlC(t *testing.T) {
	model := refdata.Model(t)
	start := time.Now()
	runs := 0
	for runs < 10 && (runs < 3 || time.Since(start) < 60*time.Second) {
		runs++
		base := consecutiveFreePorts(t, upPorts)
		logDir := t.TempDir()
		cmd := exec.Command(filepath.Join(binDir, "batonctl"), "up", "--bin-dir", binDir, "--log-dir", logDir,
			"--port-base", strconv.Itoa(base), "--model", model)
		cmd.Env = append(append(os.Environ(), "OTEL_EXPORTER_OTLP_ENDPOINT=", "BATON_MODEL="), upEnv...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // a terminal's foreground group
		var stdout, stderr lockedBuffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		deadline := time.After(60 * time.Second)
		for !strings.Contains(stdout.String(), "Baton is up") {
			select {
			case err := <-exited:
				t.Fatalf("run %d: up exited before it was up: %v\n%s", runs, err, stderr.String())
			case <-deadline:
				_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
				<-exited
				t.Fatalf("run %d: not up within 60 s\n%s", runs, stderr.String())
			case <-time.After(50 * time.Millisecond):
			}
		}
		// The services are out of the terminal's group: Ctrl-C reaches up
		// alone, which stops each with one SIGTERM.
		kids := childrenOf(t, cmd.Process.Pid)
		if len(kids) != 3 {
			t.Errorf("run %d: up has %d child processes, want 3", runs, len(kids))
		}
		for pid, pgrp := range kids {
			if pgrp == cmd.Process.Pid {
				t.Errorf("run %d: service pid %d is in up's process group %d: a terminal's Ctrl-C reaches it too", runs, pid, pgrp)
			}
		}
		// Ctrl-C, and on every other run a second one a moment later (an
		// impatient operator): still a clean stop.
		if err := syscall.Kill(-cmd.Process.Pid, syscall.SIGINT); err != nil {
			t.Fatal(err)
		}
		if runs%2 == 0 {
			time.Sleep(time.Duration(runs*20) * time.Millisecond)
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGINT)
		}
		select {
		case err := <-exited:
			if err != nil {
				t.Errorf("run %d: up after Ctrl-C to its process group: %v, want exit 0\n%s", runs, err, stderr.String())
			}
		case <-time.After(30 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-exited
			t.Fatalf("run %d: up did not stop within 30 s of Ctrl-C\n%s", runs, stderr.String())
		}
		if n := strings.Count(upLogs(t, logDir), `"msg":"stopped"`); n != 3 {
			t.Errorf("run %d: %d services logged a clean stop, want 3:\n%s", runs, n, upLogs(t, logDir))
		}
	}
	t.Logf("%d Ctrl-Cs in %v", runs, time.Since(start).Round(time.Second))
}

// childPid finds the process, a child of parent, serving gRPC on addr.
func childPid(t *testing.T, parent int, addr string) int {
	t.Helper()
	want := []byte("--grpc-addr\x00" + addr + "\x00")
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Skipf("no /proc: %v", err)
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !bytes.Contains(cmdline, want) {
			continue
		}
		st, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		f := strings.Fields(string(st[bytes.LastIndexByte(st, ')')+1:]))
		if ppid, _ := strconv.Atoi(f[1]); ppid == parent && f[0] != "Z" {
			return pid
		}
	}
	return 0
}

// childrenOf returns parent's live child processes, pid to process group.
func childrenOf(t *testing.T, parent int) map[int]int {
	t.Helper()
	out := map[int]int{}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Skipf("no /proc: %v", err)
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		f := strings.Fields(string(st[bytes.LastIndexByte(st, ')')+1:]))
		ppid, _ := strconv.Atoi(f[1])
		pgrp, _ := strconv.Atoi(f[2])
		if ppid == parent && f[0] != "Z" {
			out[pid] = pgrp
		}
	}
	return out
}

// ready reports whether the service at httpAddr answers /health/ready 200.
func ready(httpAddr string) bool {
	c := http.Client{Timeout: time.Second}
	resp, err := c.Get("http://" + httpAddr + "/health/ready")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// finishedAt sums baton_requests_finished_total at httpAddr; -1 when the
// service does not answer.
func finishedAt(httpAddr string) float64 {
	c := http.Client{Timeout: time.Second}
	resp, err := c.Get("http://" + httpAddr + "/metrics")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	sum := 0.0
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "baton_requests_finished_total") {
			continue
		}
		if f := strings.Fields(line); len(f) == 2 {
			v, _ := strconv.ParseFloat(f[1], 64)
			sum += v
		}
	}
	return sum
}

// lockedBuffer is a bytes.Buffer safe for a process's writes and the
// test's reads.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

//go:build linux

package up

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// upFakes runs `up` over the fake services with the given worker counts
// and waits for its banner. It returns the layout, the log directory, the
// captured stderr, a channel that closes when up has exited, its exit code
// (valid then) and its cancel (Ctrl-C).
func upFakes(t *testing.T, prefill, decode int) (Ports, string, *syncBuffer, <-chan struct{}, *int, context.CancelFunc) {
	t.Helper()
	bin := fakeBinDir(t)
	t.Setenv(fakeEnv, t.TempDir())
	base := freeRun(t, Layout(0, prefill, decode).Len())
	l := Layout(base, prefill, decode)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	var stdout syncBuffer
	stderr := &syncBuffer{}
	done := make(chan struct{})
	var code int
	logDir := filepath.Join(t.TempDir(), "logs")
	go func() {
		defer close(done)
		code = Run(ctx, &stdout, stderr, []string{"--port-base", strconv.Itoa(base),
			"--prefill-workers", strconv.Itoa(prefill), "--decode-workers", strconv.Itoa(decode), "--bin-dir", bin,
			"--ready-timeout", "20s", "--stop-timeout", "10s", "--log-dir", logDir})
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Error("up did not stop")
		}
	})
	deadline := time.After(30 * time.Second)
	for !strings.Contains(stdout.String(), "Baton is up") {
		select {
		case <-done:
			t.Fatalf("up exited %d before it was up:\n%s", code, stderr.String())
		case <-deadline:
			t.Fatalf("not up in time:\n%s\n%s", stdout.String(), stderr.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
	return l, logDir, stderr, done, &code, cancel
}

// servicePid finds the pid of this process's child listening on gRPC port
// port (from its command line), or 0.
func servicePid(t *testing.T, port int) int {
	t.Helper()
	want := []byte("--grpc-addr\x00127.0.0.1:" + strconv.Itoa(port) + "\x00")
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
		if st := procStat(pid); st.ppid == os.Getpid() && st.state != "Z" {
			return pid
		}
	}
	return 0
}

type stat struct {
	state      string
	ppid, pgrp int
}

// procStat reads the state, parent and process group of pid.
func procStat(pid int) stat {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return stat{}
	}
	// pid (comm) state ppid pgrp ...; comm may hold spaces.
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	ppid, _ := strconv.Atoi(f[1])
	pgrp, _ := strconv.Atoi(f[2])
	return stat{state: f[0], ppid: ppid, pgrp: pgrp}
}

// waitNewPid waits until a process other than old serves port's worker
// and answers /health/ready on its HTTP port.
func waitNewPid(t *testing.T, w WorkerPorts, old int, within time.Duration) int {
	t.Helper()
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		if pid := servicePid(t, w.GRPC); pid != 0 && pid != old {
			resp, err := http.Get("http://127.0.0.1:" + strconv.Itoa(w.HTTP) + "/health/ready")
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					return pid
				}
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("no new process serving gRPC port %d within %v", w.GRPC, within)
	return 0
}

// TestUpRestartsDeadWorker: kill -9 of one decode worker of two leaves up
// and every other service running; the dead one is started again on its
// ports, its log continued, and Ctrl-C still stops everything cleanly.
func TestUpRestartsDeadWorker(t *testing.T) {
	l, logDir, stderr, done, code, cancel := upFakes(t, 1, 2)
	others := map[int]int{} // gRPC port → pid, of every service but the victim
	for _, p := range []int{l.RouterGRPC, l.Prefill[0].GRPC, l.Decode[1].GRPC} {
		if others[p] = servicePid(t, p); others[p] == 0 {
			t.Fatalf("no process found for gRPC port %d", p)
		}
	}
	victim := servicePid(t, l.Decode[0].GRPC)
	if victim == 0 {
		t.Fatal("no process found for decode-svc#1")
	}
	// Each service has its own process group: a terminal's Ctrl-C reaches
	// batonctl alone.
	if st := procStat(victim); st.pgrp == procStat(os.Getpid()).pgrp || st.pgrp != victim {
		t.Errorf("decode-svc#1 (pid %d) is in process group %d; want its own", victim, st.pgrp)
	}
	if err := syscall.Kill(victim, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	back := waitNewPid(t, l.Decode[0], victim, 15*time.Second)
	select {
	case <-done:
		t.Fatalf("up exited %d after kill -9 of one decode worker:\n%s", *code, stderr.String())
	default:
	}
	for p, pid := range others {
		if now := servicePid(t, p); now != pid {
			t.Errorf("the service on gRPC port %d changed from pid %d to %d: only the dead worker may restart", p, pid, now)
		}
	}
	for _, want := range []string{"decode-svc#1 exited unexpectedly (signal: killed)", "decode-svc#1 restarted (pid " + strconv.Itoa(back) + ")"} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("stderr lacks %q:\n%s", want, stderr.String())
		}
	}
	cancel()
	select {
	case <-done:
		if *code != 0 {
			t.Errorf("up exited %d after Ctrl-C, want 0:\n%s", *code, stderr.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatal("up did not stop")
	}
	b, err := os.ReadFile(filepath.Join(logDir, "decode-svc-1.log"))
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(b), `{"msg":"serving"}`); n != 2 || !strings.HasSuffix(string(b), "{\"msg\":\"stopped\"}\n") {
		t.Errorf("decode-svc-1.log = %q; want both processes' lines, the second one's clean stop last", b)
	}
}

// TestUpRouterKeepsDying: a router that dies every time it is restarted
// ends up with an error after routerRestarts restarts, and every worker is
// stopped.
func TestUpRouterKeepsDying(t *testing.T) {
	l, _, stderr, done, code, _ := upFakes(t, 1, 1)
	pid := servicePid(t, l.RouterGRPC)
	for kill := 0; ; kill++ {
		if pid == 0 {
			t.Fatalf("no router process before kill %d:\n%s", kill+1, stderr.String())
		}
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		if kill == routerRestarts {
			break
		}
		pid = waitNewPid(t, WorkerPorts{l.RouterGRPC, l.RouterHTTP}, pid, 15*time.Second)
	}
	select {
	case <-done:
		if *code != 1 || !strings.Contains(stderr.String(), "router-svc exited 4 times in a row") {
			t.Errorf("up exited %d, want 1 naming the router's exits:\n%s", *code, stderr.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("up still running after the router died %d times:\n%s", routerRestarts+1, stderr.String())
	}
	for _, p := range []int{l.Prefill[0].GRPC, l.Decode[0].GRPC} {
		if pid := servicePid(t, p); pid != 0 {
			t.Errorf("worker on gRPC port %d (pid %d) still running after up exited", p, pid)
		}
	}
}

// TestUpCtrlCWhileRestarting: Ctrl-C while a dead worker waits for its
// restart stops the rest cleanly (exit 0; the death was reported when it
// happened) and starts nothing more.
func TestUpCtrlCWhileRestarting(t *testing.T) {
	l, _, stderr, done, code, cancel := upFakes(t, 1, 1)
	victim := servicePid(t, l.Decode[0].GRPC)
	if victim == 0 {
		t.Fatal("no decode-svc process")
	}
	if err := syscall.Kill(victim, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for !strings.Contains(stderr.String(), "decode-svc exited unexpectedly") {
		time.Sleep(5 * time.Millisecond)
	}
	cancel() // within the first restart's backoff
	select {
	case <-done:
		if *code != 0 {
			t.Errorf("up exited %d after Ctrl-C during a restart's backoff, want 0:\n%s", *code, stderr.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatal("up did not stop")
	}
	time.Sleep(2 * restartBackoff)
	for _, p := range []int{l.RouterGRPC, l.Prefill[0].GRPC, l.Decode[0].GRPC} {
		if pid := servicePid(t, p); pid != 0 {
			t.Errorf("a service on gRPC port %d (pid %d) runs after up exited", p, pid)
		}
	}
}

// TestSuperviseRouterCannotRestart: a router whose restarts cannot even
// start (its binary gone, its port taken) counts each failed start as an
// exit, so up gives up after routerRestarts instead of retrying forever.
func TestSuperviseRouterCannotRestart(t *testing.T) {
	cmd := exec.Command("true")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	router := &child{name: "router-svc", cmd: cmd, done: make(chan struct{})}
	go func() { router.err = cmd.Wait(); close(router.done) }()
	var starts atomic.Int32
	respawn := func(old *child) (*child, error) {
		starts.Add(1)
		return nil, errors.New("exec: no such file")
	}
	var stderr syncBuffer
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ended := make(chan error, 1)
	go func() { ended <- supervise(ctx, []*child{router}, respawn, time.Second, &stderr) }()
	select {
	case err := <-ended:
		if err == nil || !strings.Contains(err.Error(), "could not be restarted") {
			t.Errorf("supervise = %v, want an error saying the router could not be restarted", err)
		}
	case <-time.After(30 * time.Second):
		cancel()
		<-ended
		t.Fatalf("supervise still retrying the router after 30 s (%d failed starts); it said: %s", starts.Load(), stderr.String())
	}
}

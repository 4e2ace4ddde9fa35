package up

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// The test binary doubles as a fake router-svc, prefill-svc and decode-svc:
// linked under those names into a --bin-dir, and started with fakeEnv set,
// it listens on its --grpc-addr and --http-addr, answers /health/ready,
// records its arguments and exits 0 on SIGTERM — what `batonctl up` relies
// on, without a model.
const (
	fakeEnv     = "UP_TEST_FAKE_SERVICE_DIR" // where the fakes record themselves
	fakeFailEnv = "UP_TEST_FAKE_FAIL_PORT"   // a fake given this gRPC port fails to start
)

func TestMain(m *testing.M) {
	if dir := os.Getenv(fakeEnv); dir != "" {
		os.Exit(fakeService(dir, filepath.Base(os.Args[0]), os.Args[1:]))
	}
	os.Exit(m.Run())
}

func fakeService(dir, name string, args []string) int {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	grpcAddr := fs.String("grpc-addr", "", "")
	httpAddr := fs.String("http-addr", "", "")
	fs.String("admin-addr", "", "")
	fs.String("log-level", "", "")
	fs.String("model", "", "")
	fs.String("prefill", "", "")
	fs.String("decode", "", "")
	fs.String("prefill-allow", "", "")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	_, port, _ := net.SplitHostPort(*grpcAddr)
	if port == os.Getenv(fakeFailEnv) {
		fmt.Fprintf(os.Stderr, "%s: --grpc-addr %s: address already in use\n", name, *grpcAddr)
		return 1
	}
	record := filepath.Join(dir, name+"-"+port)
	if err := os.WriteFile(record+".args", []byte(strings.Join(args, "\n")), 0o600); err != nil {
		return 1
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, os.Interrupt)
	gl, err := net.Listen("tcp", *grpcAddr)
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		return 1
	}
	defer gl.Close()
	hl, err := net.Listen("tcp", *httpAddr)
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		return 1
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/health/ready" {
			http.NotFound(w, r)
		}
	})}
	go srv.Serve(hl)
	fmt.Fprintln(os.Stderr, `{"msg":"serving"}`)
	<-stop
	srv.Close()
	fmt.Fprintln(os.Stderr, `{"msg":"stopped"}`)
	return 0
}

// fakeBinDir links the test binary under the three services' names.
func fakeBinDir(t *testing.T) string {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for _, name := range []string{"router-svc", "prefill-svc", "decode-svc"} {
		if err := os.Symlink(exe, filepath.Join(dir, name)); err != nil {
			t.Skipf("cannot link the fake services: %v", err)
		}
	}
	return dir
}

// freeRun finds a base port whose next n ports are free.
func freeRun(t *testing.T, n int) int {
	t.Helper()
	for try := range 50 {
		// Below the kernel's ephemeral range (32768 and up by default): a
		// port free there cannot be taken meanwhile as the local port of an
		// outgoing connection.
		base := 10000 + (os.Getpid()*13+try*131)%(32768-10000-n)
		var ls []net.Listener
		ok := true
		for i := range n {
			l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(base+i))
			if err != nil {
				ok = false
				break
			}
			ls = append(ls, l)
		}
		for _, l := range ls {
			l.Close()
		}
		if ok {
			return base
		}
	}
	t.Fatal("no run of free ports")
	return 0
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestLayout(t *testing.T) {
	// One of each: the six ports documented since the first release.
	if got, want := Layout(8080, 1, 1), (Ports{8080, 8081, []WorkerPorts{{8082, 8083}}, []WorkerPorts{{8084, 8085}}}); !equalPorts(got, want) {
		t.Errorf("Layout(8080, 1, 1) = %+v, want %+v", got, want)
	}
	tests := []struct {
		prefill, decode int
		want            Ports
	}{
		{2, 1, Ports{100, 101, []WorkerPorts{{102, 103}, {106, 107}}, []WorkerPorts{{104, 105}}}},
		{1, 3, Ports{100, 101, []WorkerPorts{{102, 103}}, []WorkerPorts{{104, 105}, {106, 107}, {108, 109}}}},
		{2, 2, Ports{100, 101, []WorkerPorts{{102, 103}, {106, 107}}, []WorkerPorts{{104, 105}, {108, 109}}}},
	}
	for _, tc := range tests {
		got := Layout(100, tc.prefill, tc.decode)
		if !equalPorts(got, tc.want) {
			t.Errorf("Layout(100, %d, %d) = %+v, want %+v", tc.prefill, tc.decode, got, tc.want)
		}
	}
	// Any counts: the ports are exactly base .. base+Len()-1, each once.
	for _, n := range [][2]int{{1, 1}, {3, 5}, {MaxWorkers, MaxWorkers}} {
		l := Layout(1000, n[0], n[1])
		all := []int{l.RouterHTTP, l.RouterGRPC}
		for _, w := range slices.Concat(l.Prefill, l.Decode) {
			all = append(all, w.GRPC, w.HTTP)
		}
		ra, pa, da := l.Admin()
		all = append(append(append(all, ra), pa...), da...)
		slices.Sort(all)
		if len(all) != l.Len() || all[0] != 1000 || all[len(all)-1] != 1000+l.Len()-1 || len(slices.Compact(all)) != l.Len() {
			t.Errorf("Layout(1000, %d, %d): ports %v are not %d consecutive distinct ports", n[0], n[1], all, l.Len())
		}
	}
}

func equalPorts(a, b Ports) bool {
	return a.RouterHTTP == b.RouterHTTP && a.RouterGRPC == b.RouterGRPC &&
		slices.Equal(a.Prefill, b.Prefill) && slices.Equal(a.Decode, b.Decode)
}

func TestRunRejectsBadFlags(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"--prefill-workers", "0"}, "--prefill-workers 0: must be in 1-64"},
		{[]string{"--decode-workers", "65"}, "--decode-workers 65: must be in 1-64"},
		{[]string{"--port-base", "65531"}, "--port-base 65531: must be in 1-65527 for 9 ports"},
		{[]string{"--port-base", "65527", "--decode-workers", "3"}, "must be in 1-65521 for 15 ports"},
		{[]string{"--host", "example"}, "not an IP address"},
	}
	for _, tc := range tests {
		var stdout, stderr bytes.Buffer
		if code := Run(context.Background(), &stdout, &stderr, tc.args); code != 2 || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("Run(%q) = %d, %q; want 2 and %q", tc.args, code, stderr.String(), tc.want)
		}
	}
}

// TestUpManyWorkers starts two prefill and three decode fakes behind a fake
// router and checks the processes, their ports and the router's worker lists,
// then that cancelling stops every one of them.
func TestUpManyWorkers(t *testing.T) {
	bin := fakeBinDir(t)
	rec := t.TempDir()
	t.Setenv(fakeEnv, rec)
	l := Layout(0, 2, 3)
	base := freeRun(t, l.Len())
	l = Layout(base, 2, 3)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stdout, stderr syncBuffer
	done := make(chan int, 1)
	logDir := filepath.Join(t.TempDir(), "logs") // created by up
	go func() {
		done <- Run(ctx, &stdout, &stderr, []string{"--port-base", strconv.Itoa(base),
			"--prefill-workers", "2", "--decode-workers", "3", "--bin-dir", bin, "--ready-timeout", "20s", "--stop-timeout", "10s",
			"--log-dir", logDir})
	}()
	deadline := time.After(30 * time.Second)
	for !strings.Contains(stdout.String(), "Baton is up") {
		select {
		case code := <-done:
			t.Fatalf("up exited %d before it was up:\n%s", code, stderr.String())
		case <-deadline:
			t.Fatalf("not up in time:\n%s\n%s", stdout.String(), stderr.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
	addr := func(p int) string { return "127.0.0.1:" + strconv.Itoa(p) }
	var prefills, decodes []string
	for _, w := range l.Prefill {
		prefills = append(prefills, addr(w.GRPC))
	}
	for _, w := range l.Decode {
		decodes = append(decodes, addr(w.GRPC))
	}
	type want struct {
		name string
		w    WorkerPorts
		args []string
	}
	wants := []want{{"router-svc", WorkerPorts{l.RouterGRPC, l.RouterHTTP},
		[]string{"--prefill", strings.Join(prefills, ","), "--decode", strings.Join(decodes, ",")}}}
	for i, w := range l.Prefill {
		wants = append(wants, want{"prefill-svc", w, nil})
		if !bannerLists(stdout.String(), fmt.Sprintf("prefill#%d", i+1), addr(w.GRPC), addr(w.HTTP)) {
			t.Errorf("the banner does not list prefill worker %d:\n%s", i+1, stdout.String())
		}
	}
	for i, w := range l.Decode {
		// Decode may dial only the prefill workers up started.
		wants = append(wants, want{"decode-svc", w, []string{"--prefill-allow", strings.Join(prefills, ",")}})
		if !bannerLists(stdout.String(), fmt.Sprintf("decode#%d", i+1), addr(w.GRPC), addr(w.HTTP)) {
			t.Errorf("the banner does not list decode worker %d:\n%s", i+1, stdout.String())
		}
	}
	for _, w := range wants {
		b, err := os.ReadFile(filepath.Join(rec, fmt.Sprintf("%s-%d.args", w.name, w.w.GRPC)))
		if err != nil {
			t.Errorf("%s on gRPC port %d was not started: %v", w.name, w.w.GRPC, err)
			continue
		}
		args := strings.Split(string(b), "\n")
		for _, sub := range [][]string{{"--grpc-addr", addr(w.w.GRPC)}, {"--http-addr", addr(w.w.HTTP)}, w.args} {
			if len(sub) > 0 && !containsSeq(args, sub) {
				t.Errorf("%s args %q lack %q", w.name, args, sub)
			}
		}
	}
	if n := countFiles(t, rec, ".args"); n != 6 {
		t.Errorf("%d processes started, want 6", n)
	}

	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Errorf("up exited %d after Ctrl-C, want 0:\n%s", code, stderr.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatal("up did not stop")
	}
	// Each service logged to its own file, listed in the banner, and none
	// of it reached the terminal.
	logs := []string{"router-svc.log", "prefill-svc-1.log", "prefill-svc-2.log", "decode-svc-1.log", "decode-svc-2.log", "decode-svc-3.log"}
	for _, name := range logs {
		path := filepath.Join(logDir, name)
		b, err := os.ReadFile(path)
		if err != nil {
			t.Errorf("log %s: %v", name, err)
			continue
		}
		if lines := strings.Split(strings.TrimSpace(string(b)), "\n"); !slices.Equal(lines, []string{`{"msg":"serving"}`, `{"msg":"stopped"}`}) {
			t.Errorf("log %s holds %q, want the service's two lines, unprefixed", name, lines)
		}
		if !strings.Contains(stdout.String(), " "+path+"\n") {
			t.Errorf("the banner does not list %s:\n%s", path, stdout.String())
		}
	}
	if n := countFiles(t, logDir, ".log"); n != len(logs) {
		t.Errorf("%d log files, want %d", n, len(logs))
	}
	if strings.Contains(stderr.String(), `"msg"`) || !strings.Contains(stderr.String(), "service logs in "+logDir) {
		t.Errorf("stderr should name the log directory and hold no service logs:\n%s", stderr.String())
	}
	for p := base; p < base+l.Len(); p++ {
		if c, err := net.DialTimeout("tcp", addr(p), 200*time.Millisecond); err == nil {
			c.Close()
			t.Errorf("port %d still accepts connections after up stopped", p)
		}
	}
}

// TestUpWorkerFails checks that a worker that cannot start fails `up` with
// its own message, naming which of the workers it was, and that the others
// are stopped.
func TestUpWorkerFails(t *testing.T) {
	bin := fakeBinDir(t)
	rec := t.TempDir()
	t.Setenv(fakeEnv, rec)
	base := freeRun(t, Layout(0, 1, 2).Len())
	l := Layout(base, 1, 2)
	t.Setenv(fakeFailEnv, strconv.Itoa(l.Decode[1].GRPC))
	var stdout, stderr syncBuffer
	code := Run(context.Background(), &stdout, &stderr, []string{"--port-base", strconv.Itoa(base),
		"--decode-workers", "2", "--bin-dir", bin, "--ready-timeout", "20s", "--stop-timeout", "10s", "--log-dir", LogToStderr})
	if code != 1 {
		t.Fatalf("up exited %d, want 1:\n%s", code, stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
	last := lines[len(lines)-1]
	for _, w := range []string{"decode-svc#2", "address already in use"} {
		if !strings.Contains(last, w) {
			t.Errorf("last line %q does not mention %q", last, w)
		}
	}
	if n := strings.Count(stderr.String(), `{"msg":"stopped"}`); n != countFiles(t, rec, ".args") {
		t.Errorf("%d processes stopped, %d started:\n%s", n, countFiles(t, rec, ".args"), stderr.String())
	}
	// --log-dir - keeps the logs on stderr, each line naming its service.
	if !strings.Contains(stderr.String(), `[decode-svc#1] {"msg":"stopped"}`) {
		t.Errorf("stderr lacks decode-svc#1's prefixed log lines:\n%s", stderr.String())
	}
}

// TestLogDirDefault: without --log-dir, each run gets a new directory in the
// OS temp directory.
func TestLogDirDefault(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	a, err := openLogDir("")
	if err != nil {
		t.Fatal(err)
	}
	b, err := openLogDir("")
	if err != nil {
		t.Fatal(err)
	}
	if a == b || filepath.Dir(a) != tmp || !strings.HasPrefix(filepath.Base(a), "baton-up-") {
		t.Errorf("log directories %q and %q, want two new baton-up-* in %s", a, b, tmp)
	}
	if d, err := openLogDir(LogToStderr); d != "" || err != nil {
		t.Errorf("openLogDir(-) = %q, %v; want stderr", d, err)
	}
}

// TestCommandFor: the hint names the binary as the user can type it.
func TestCommandFor(t *testing.T) {
	root := t.TempDir()
	exe := filepath.Join(root, "bin", "batonctl")
	if err := os.MkdirAll(filepath.Dir(exe), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(exe, nil, 0o755); err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(t.TempDir(), "batonctl")
	if err := os.WriteFile(other, nil, 0o755); err != nil {
		t.Fatal(err)
	}
	found := func(p string) func(string) (string, error) {
		return func(string) (string, error) { return p, nil }
	}
	notFound := func(string) (string, error) { return "", errors.New("not found") }
	for _, tc := range []struct {
		wd   string
		look func(string) (string, error)
		want string
	}{
		{root, notFound, filepath.Join("bin", "batonctl")},
		{filepath.Join(root, "bin"), notFound, "./batonctl"},
		{t.TempDir(), notFound, exe},
		{string(filepath.Separator), notFound, exe},
		{t.TempDir(), found(exe), "batonctl"},
		{root, found(other), filepath.Join("bin", "batonctl")}, // $PATH has another batonctl
	} {
		if got := commandFor(exe, tc.wd, tc.look); got != tc.want {
			t.Errorf("commandFor(%s, wd %s) = %q, want %q", exe, tc.wd, got, tc.want)
		}
	}
}

// bannerLists reports whether the banner has a line for the worker.
func bannerLists(banner, label, grpcAddr, httpAddr string) bool {
	want := []string{label, "gRPC", grpcAddr, "HTTP", "http://" + httpAddr}
	for _, line := range strings.Split(banner, "\n") {
		if slices.Equal(strings.Fields(line), want) {
			return true
		}
	}
	return false
}

func containsSeq(s, sub []string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if slices.Equal(s[i:i+len(sub)], sub) {
			return true
		}
	}
	return false
}

func countFiles(t *testing.T, dir, suffix string) int {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	n := 0
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), suffix) {
			n++
		}
	}
	return n
}

// TestStopAllKillsEveryStraggler: when several services ignore SIGTERM,
// each is killed once --stop-timeout has passed. (A single deadline channel
// fires once: the second straggler was waited for until it exited by
// itself.)
func TestStopAllKillsEveryStraggler(t *testing.T) {
	var children []*child
	for i := range 2 {
		cmd := exec.Command("sh", "-c", "trap '' TERM; sleep 60")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		c := &child{name: fmt.Sprintf("straggler#%d", i), cmd: cmd, done: make(chan struct{})}
		go func() { c.err = cmd.Wait(); close(c.done) }()
		children = append(children, c)
	}
	// Let the shells install their trap before they are signalled.
	time.Sleep(200 * time.Millisecond)
	var stderr bytes.Buffer
	returned := make(chan struct{})
	go func() {
		defer close(returned)
		_ = stopAll(children, 300*time.Millisecond, &stderr)
	}()
	select {
	case <-returned:
	case <-time.After(20 * time.Second):
		for _, c := range children {
			_ = c.cmd.Process.Kill()
		}
		<-returned
		t.Fatalf("stopAll still waiting 20 s after its 300ms stop timeout; it said: %s", stderr.String())
	}
	if n := strings.Count(stderr.String(), "killing it"); n != 2 {
		t.Errorf("stopAll killed %d stragglers, want 2; it said: %s", n, stderr.String())
	}
}

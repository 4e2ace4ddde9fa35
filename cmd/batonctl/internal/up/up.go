// Package up implements `batonctl up`: it starts the router and N prefill and
// M decode workers (one of each by default) as separate processes on
// loopback, the router given every worker's address, waits until each is
// ready, prints the endpoints and stops them all on Ctrl-C or SIGTERM.
package up

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/baton-serving/baton/cmd/batonctl/internal/generate"
	"github.com/baton-serving/baton/cmd/batonctl/internal/loopback"
	"github.com/baton-serving/baton/engine/modelfile"
	"github.com/baton-serving/baton/svckit"
	"github.com/baton-serving/baton/svckit/tlsconf"
)

// Options configure `batonctl up`.
type Options struct {
	PortBase       int
	PrefillWorkers int
	DecodeWorkers  int
	Host           string
	Model          string
	BinDir         string
	ReadyTimeout   time.Duration
	StopTimeout    time.Duration
	LogLevel       string
	// LogDir receives one log file per service; LogToStderr ("-") keeps
	// them on stderr, each line prefixed with the service's name; "" is a
	// new directory under the OS temp directory.
	LogDir string
	Demo   string
	// TLS starts the services with mutual TLS between them: certificates
	// from a new development CA (tlsconf.WriteDevCerts) in the log
	// directory's certs/ (or a new temporary directory).
	TLS bool
}

// LogToStderr as --log-dir sends the services' logs to batonctl's stderr.
const LogToStderr = "-"

// MaxWorkers bounds --prefill-workers and --decode-workers: each worker is a
// process holding a model and a KV cache.
const MaxWorkers = 64

// WorkerPorts are one worker's listen ports.
type WorkerPorts struct{ GRPC, HTTP int }

// Ports is the port layout for a base port P: router HTTP P, router gRPC P+1,
// the first prefill worker's gRPC P+2 and HTTP P+3, the first decode worker's
// gRPC P+4 and HTTP P+5 — with one worker of each, exactly six ports — then
// two ports (gRPC, HTTP) for each further prefill worker from P+6, then two
// for each further decode worker.
type Ports struct {
	RouterHTTP, RouterGRPC int
	Prefill, Decode        []WorkerPorts
}

// Layout returns the ports for base port p with the given numbers of prefill
// and decode workers (each at least 1).
func Layout(p, prefill, decode int) Ports {
	l := Ports{RouterHTTP: p, RouterGRPC: p + 1,
		Prefill: []WorkerPorts{{p + 2, p + 3}}, Decode: []WorkerPorts{{p + 4, p + 5}}}
	next := p + 6
	for range prefill - 1 {
		l.Prefill = append(l.Prefill, WorkerPorts{next, next + 1})
		next += 2
	}
	for range decode - 1 {
		l.Decode = append(l.Decode, WorkerPorts{next, next + 1})
		next += 2
	}
	return l
}

// mainLen is the number of gRPC and HTTP ports.
func (l Ports) mainLen() int { return 2 + 2*len(l.Prefill) + 2*len(l.Decode) }

// Len is the number of consecutive ports the layout takes from its base:
// the gRPC and HTTP ports, then one admin port per service (Admin).
func (l Ports) Len() int { return l.mainLen() + 1 + len(l.Prefill) + len(l.Decode) }

// Admin returns the admin listeners' ports (--admin-addr, /debug/*): after
// the gRPC and HTTP ports, the router's, then each prefill worker's, then
// each decode worker's.
func (l Ports) Admin() (router int, prefill, decode []int) {
	next := l.RouterHTTP + l.mainLen()
	router = next
	for range l.Prefill {
		next++
		prefill = append(prefill, next)
	}
	for range l.Decode {
		next++
		decode = append(decode, next)
	}
	return router, prefill, decode
}

// Run is the `batonctl up` command.
func Run(ctx context.Context, stdout, stderr io.Writer, args []string) int {
	var o Options
	fs := flag.NewFlagSet("batonctl up", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.IntVar(&o.PortBase, "port-base", loopback.PortBase, "first of the consecutive ports: router HTTP P, router gRPC P+1, prefill gRPC P+2, prefill HTTP P+3, decode gRPC P+4, decode HTTP P+5, then gRPC and HTTP of each further prefill worker from P+6, then of each further decode worker, then the admin port (/debug/*) of the router, of each prefill and of each decode worker")
	fs.IntVar(&o.PrefillWorkers, "prefill-workers", 1, "prefill worker processes to start")
	fs.IntVar(&o.DecodeWorkers, "decode-workers", 1, "decode worker processes to start")
	fs.StringVar(&o.Host, "host", loopback.Host, "address the services listen on")
	fs.StringVar(&o.Model, "model", "", "GGUF model for all three services: a path or hf://OWNER/REPO/FILE.gguf (default: $BATON_MODEL, else "+modelfile.DefaultHelp+")")
	fs.StringVar(&o.BinDir, "bin-dir", "", "directory holding router-svc, prefill-svc and decode-svc (default: batonctl's own directory, then $PATH)")
	fs.DurationVar(&o.ReadyTimeout, "ready-timeout", 60*time.Second, "how long each service gets to become ready")
	fs.DurationVar(&o.StopTimeout, "stop-timeout", 15*time.Second, "how long the services get to stop after SIGTERM before they are killed")
	fs.StringVar(&o.LogLevel, "log-level", "info", "services' log level: debug, info, warn or error")
	fs.StringVar(&o.LogDir, "log-dir", "", "directory for the services' logs, one file per service (router-svc.log, prefill-svc.log, decode-svc.log, decode-svc-2.log, ...), kept after exit (default: a new baton-up-* directory in the OS temp directory); - writes them to stderr, each line prefixed with [service]")
	fs.BoolVar(&o.TLS, "tls", false, "mutual TLS between router, prefill and decode: write a development CA and per-role certificates (batonctl certs) into the log directory's certs/ and start each service with --tls-cert, --tls-key and --tls-ca; workers' gRPC ports then refuse clients without a certificate (the router's ports stay plaintext)")
	fs.StringVar(&o.Demo, "demo", "", "once up, send this prompt through the router (greedy, 64 tokens) and print the completion")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: batonctl up [flags]\n\nStarts router-svc and prefill-svc and decode-svc workers on loopback and stops them on Ctrl-C.\nWorkers take other flags from the environment (BATON_THREADS=1, BATON_KV_CACHE_BYTES=256MiB, ...).\n\nFlags:")
		fs.PrintDefaults()
	}
	if err := svckit.ParseFlags(fs, args, nil); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintf(stderr, "batonctl up: %v\n", err)
		return 2
	}
	for _, w := range []struct {
		flag string
		n    int
	}{{"--prefill-workers", o.PrefillWorkers}, {"--decode-workers", o.DecodeWorkers}} {
		if w.n < 1 || w.n > MaxWorkers {
			fmt.Fprintf(stderr, "batonctl up: %s %d: must be in 1-%d\n", w.flag, w.n, MaxWorkers)
			return 2
		}
	}
	if n := Layout(o.PortBase, o.PrefillWorkers, o.DecodeWorkers).Len(); o.PortBase < 1 || o.PortBase > 65536-n {
		fmt.Fprintf(stderr, "batonctl up: --port-base %d: must be in 1-%d for %d ports\n", o.PortBase, 65536-n, n)
		return 2
	}
	if net.ParseIP(o.Host) == nil && o.Host != "localhost" {
		fmt.Fprintf(stderr, "batonctl up: --host %q: not an IP address\n", o.Host)
		return 2
	}
	if err := up(ctx, o, stdout, stderr); err != nil {
		fmt.Fprintf(stderr, "batonctl up: %v\n", err)
		return 1
	}
	return 0
}

type child struct {
	name     string
	label    string
	httpAddr string
	grpcAddr string
	logPath  string // "" when the log goes to stderr
	cmd      *exec.Cmd
	done     chan struct{} // closed when the process has exited
	err      error         // exit status, valid after done
	mu       sync.Mutex
	lastLine string // last line the process wrote to stderr
}

func (c *child) last() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lastLine
}

func up(ctx context.Context, o Options, stdout, stderr io.Writer) error {
	p := Layout(o.PortBase, o.PrefillWorkers, o.DecodeWorkers)
	addr := func(port int) string { return net.JoinHostPort(o.Host, strconv.Itoa(port)) }
	common := []string{"--log-level", o.LogLevel}
	if o.Model != "" {
		common = append(common, "--model", o.Model)
	}
	type spec struct {
		bin, name, label  string // binary; name in logs and errors; label in the banner
		grpc, http, admin string
		extra             []string
	}
	var specs []spec
	var prefills, decodes []string
	routerAdmin, prefillAdmin, decodeAdmin := p.Admin()
	for _, role := range []struct {
		bin   string
		ports []WorkerPorts
		admin []int
		addrs *[]string
	}{{"prefill-svc", p.Prefill, prefillAdmin, &prefills}, {"decode-svc", p.Decode, decodeAdmin, &decodes}} {
		for i, wp := range role.ports {
			s := spec{bin: role.bin, name: role.bin, label: strings.TrimSuffix(role.bin, "-svc"),
				grpc: addr(wp.GRPC), http: addr(wp.HTTP), admin: addr(role.admin[i])}
			if len(role.ports) > 1 {
				// Numbered from 1 as the operator counts them.
				s.name = fmt.Sprintf("%s#%d", role.bin, i+1)
				s.label = fmt.Sprintf("%s#%d", s.label, i+1)
			}
			specs = append(specs, s)
			*role.addrs = append(*role.addrs, s.grpc)
		}
	}
	// Decode may dial only the prefill workers started here
	// (--prefill-allow; docs/reliability.md).
	for i := range specs {
		if specs[i].bin == "decode-svc" {
			specs[i].extra = []string{"--prefill-allow", strings.Join(prefills, ",")}
		}
	}
	// The router last: it is ready only once it sees ready workers.
	specs = append(specs, spec{bin: "router-svc", name: "router-svc", label: "router",
		grpc: addr(p.RouterGRPC), http: addr(p.RouterHTTP), admin: addr(routerAdmin),
		extra: []string{"--prefill", strings.Join(prefills, ","), "--decode", strings.Join(decodes, ",")}})
	var children []*child
	var logs sync.WaitGroup
	defer logs.Wait()
	// stopAll is the one release path for the processes, whatever happens.
	defer func() { stopAll(children, o.StopTimeout, stderr) }()

	logDir, err := openLogDir(o.LogDir)
	if err != nil {
		return err
	}
	if logDir != "" {
		fmt.Fprintf(stderr, "batonctl up: service logs in %s\n", logDir)
	}

	certArgs, err := writeCerts(o.TLS, logDir, stderr)
	if err != nil {
		return err
	}

	bins := map[string]string{}
	for _, s := range specs {
		if _, ok := bins[s.bin]; ok {
			continue
		}
		bin, err := findBinary(o.BinDir, s.bin)
		if err != nil {
			return err
		}
		bins[s.bin] = bin
	}
	for _, s := range specs {
		args := append([]string{"--grpc-addr", s.grpc, "--http-addr", s.http, "--admin-addr", s.admin}, common...)
		args = append(args, s.extra...)
		args = append(args, certArgs[s.bin]...)
		sink, err := newLogSink(logDir, s.name, stderr)
		if err != nil {
			return err
		}
		c, err := start(bins[s.bin], s.name, args, sink, &logs)
		if err != nil {
			return err
		}
		c.grpcAddr, c.httpAddr, c.label = s.grpc, s.http, s.label
		children = append(children, c)
	}
	for _, c := range children {
		if err := waitReady(ctx, c, o.ReadyTimeout); err != nil {
			return err
		}
	}
	width := 8
	for _, c := range children {
		width = max(width, len(c.label)+1)
	}
	fmt.Fprintf(stdout, "Baton is up (Ctrl-C stops it):\n")
	fmt.Fprintf(stdout, "  %-*s HTTP  http://%s  (REST /v1/..., /metrics, /health/ready)\n", width, "router", addr(p.RouterHTTP))
	fmt.Fprintf(stdout, "  %-*s gRPC  %s\n", width, "router", addr(p.RouterGRPC))
	fmt.Fprintf(stdout, "  %-*s admin http://%s  (/debug/requests, /debug/workers; batonctl diagnose --router-admin)\n", width, "router", addr(routerAdmin))
	for _, c := range children {
		if c.name != "router-svc" {
			fmt.Fprintf(stdout, "  %-*s gRPC  %s   HTTP http://%s\n", width, c.label, c.grpcAddr, c.httpAddr)
		}
	}
	if logDir != "" {
		fmt.Fprintf(stdout, "Logs (one file per service):\n")
		for _, c := range children {
			fmt.Fprintf(stdout, "  %-*s %s\n", width, c.label, c.logPath)
		}
	}

	if o.Demo != "" {
		fmt.Fprintf(stdout, "\nDemo request through the router (prefill computes the prompt, decode generates):\n> %s", o.Demo)
		if code := generate.Run(ctx, stdout, stderr, []string{"--router", addr(p.RouterGRPC), "--prompt", o.Demo, "-n", "64", "--temperature", "0"}); code != 0 {
			return fmt.Errorf("demo request failed (exit %d)", code)
		}
		fmt.Fprintf(stdout, "\nTry: %s generate --router %s --prompt \"Lily and Tom\"\n", selfCommand(), addr(p.RouterGRPC))
	}

	// From here a service that exits is restarted (supervise.go).
	return supervise(ctx, children, respawner(logDir, stderr, &logs), o.StopTimeout, stderr)
}

func findBinary(dir, name string) (string, error) {
	if dir != "" {
		p := filepath.Join(dir, name)
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("--bin-dir: %s not found in %s", name, dir)
		}
		return p, nil
	}
	if exe, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(exe), name)
		if st, err := os.Stat(p); err == nil && !st.IsDir() {
			return p, nil
		}
	}
	p, err := exec.LookPath(name)
	if err != nil {
		return "", fmt.Errorf("%s not found next to batonctl or in $PATH; build it (go build -o bin/ ./router-svc ./prefill-svc ./decode-svc ./cmd/batonctl) or pass --bin-dir", name)
	}
	return p, nil
}

// start runs bin and copies its stderr, line by line, to the sink, keeping
// the last line for error messages. It closes the sink when the process has
// exited.
// selfCommand is how the user can run this batonctl again, for the hints
// printed once up: "batonctl" when $PATH finds this very binary, else its
// path relative to the working directory when it lies below it
// (bin/batonctl), else its absolute path.
func selfCommand() string {
	exe, err := os.Executable()
	if err != nil {
		return "batonctl"
	}
	wd, _ := os.Getwd()
	return commandFor(exe, wd, exec.LookPath)
}

func commandFor(exe, wd string, lookPath func(string) (string, error)) string {
	if p, err := lookPath("batonctl"); err == nil {
		a, errA := os.Stat(p)
		b, errB := os.Stat(exe)
		if errA == nil && errB == nil && os.SameFile(a, b) {
			return "batonctl"
		}
	}
	// From the filesystem's root a relative path reads as a typo.
	if wd != "" && filepath.Dir(wd) != wd {
		if rel, err := filepath.Rel(wd, exe); err == nil && filepath.IsLocal(rel) {
			if !strings.ContainsRune(rel, filepath.Separator) {
				rel = "." + string(filepath.Separator) + rel
			}
			return rel
		}
	}
	return exe
}

func start(bin, name string, args []string, sink *logSink, logs *sync.WaitGroup) (*child, error) {
	c := &child{name: name, logPath: sink.path, done: make(chan struct{})}
	c.cmd = exec.Command(bin, args...)
	c.cmd.SysProcAttr = sysProcAttr()
	pipe, err := c.cmd.StderrPipe()
	if err != nil {
		sink.Close()
		return nil, err
	}
	c.cmd.Stdout = sink.w
	if err := c.cmd.Start(); err != nil {
		sink.Close()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	logs.Add(1)
	go func() {
		defer logs.Done()
		sc := bufio.NewScanner(pipe)
		sc.Buffer(make([]byte, 64*1024), 1024*1024)
		for sc.Scan() {
			line := sc.Text()
			c.mu.Lock()
			c.lastLine = line
			c.mu.Unlock()
			fmt.Fprintf(sink.w, "%s%s\n", sink.prefix, line)
		}
		// Wait only after the pipe is drained: it closes the pipe.
		c.err = c.cmd.Wait()
		sink.Close()
		close(c.done)
	}()
	return c, nil
}

func waitReady(ctx context.Context, c *child, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	url := "http://" + c.httpAddr + "/health/ready"
	client := &http.Client{Timeout: time.Second}
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if resp, err := client.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-c.done:
			return fmt.Errorf("%s failed to start (%v): %s", c.name, c.err, c.last())
		case <-ctx.Done():
			return fmt.Errorf("interrupted while waiting for %s", c.name)
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready after %v (%s)", c.name, timeout, url)
		}
	}
}

// stopAll sends SIGTERM to every running child, waits up to timeout, then
// kills what is left. It returns an error if a child did not exit cleanly.
// Safe to call more than once.
func stopAll(children []*child, timeout time.Duration, stderr io.Writer) error {
	for _, c := range children {
		select {
		case <-c.done:
		default:
			_ = c.cmd.Process.Signal(syscall.SIGTERM)
		}
	}
	var errs []error
	// One deadline for all: a timer channel delivers once, so each wait
	// gets its own channel for the time left (none left: kill at once).
	deadline := time.Now().Add(timeout)
	for _, c := range children {
		t := time.NewTimer(time.Until(deadline))
		select {
		case <-c.done:
		case <-t.C:
			fmt.Fprintf(stderr, "batonctl up: %s did not stop within %v; killing it\n", c.name, timeout)
			_ = c.cmd.Process.Kill()
			<-c.done
		}
		t.Stop()
		if c.err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", c.name, c.err))
		}
	}
	return errors.Join(errs...)
}

// writeCerts writes, when on, a development CA and per-role certificates
// into logDir/certs (a new temporary directory when logs go to stderr) and
// returns each binary's --tls-* arguments.
func writeCerts(on bool, logDir string, stderr io.Writer) (map[string][]string, error) {
	if !on {
		return nil, nil
	}
	dir := filepath.Join(logDir, "certs")
	if logDir == "" {
		var err error
		if dir, err = os.MkdirTemp("", "baton-up-certs-*"); err != nil {
			return nil, fmt.Errorf("--tls: %w", err)
		}
	}
	if err := tlsconf.WriteDevCerts(dir, tlsconf.DevOptions{}); err != nil {
		return nil, fmt.Errorf("--tls: writing certificates: %w", err)
	}
	fmt.Fprintf(stderr, "batonctl up: mutual TLS on; certificates in %s\n", dir)
	args := map[string][]string{}
	for bin, role := range map[string]tlsconf.Role{"router-svc": tlsconf.Router, "prefill-svc": tlsconf.Prefill, "decode-svc": tlsconf.Decode} {
		f := tlsconf.FilesIn(dir, role)
		args[bin] = []string{"--tls-cert", f.Cert, "--tls-key", f.Key, "--tls-ca", f.CA}
	}
	return args, nil
}

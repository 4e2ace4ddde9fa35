//go:build e2e

package tests

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/baton-serving/baton/engine/refdata"
)

// sdkDir holds the node:test suite that drives the router with the
// official openai npm package (package.json pins it; package-lock.json
// makes `npm ci --prefix tests/sdk` install exactly that, which
// scripts/test.sh runs before this suite).
const sdkDir = "sdk"

// TestOpenAISDK runs tests/sdk with node against the real binaries in PD
// mode (prefill + decode + router on stories260K): a user's program, not a
// hand-written HTTP client, calling logprobs, echo, strict fields,
// structured output, tools, and a stream cut by SIGTERM. It fails when node
// fails, printing node's output. The SIGTERM case gets a router of its own
// (the JS side sends the SIGTERM, so it needs the pid) with a short
// --shutdown-timeout, and the decode worker serves the freeze hook the case
// uses to keep a stream going past it.
func TestOpenAISDK(t *testing.T) {
	nodeBin, err := exec.LookPath("node")
	if err != nil {
		t.Fatalf("node is not on PATH (Node.js 20 runs tests/sdk): %v", err)
	}
	if _, err := os.Stat(filepath.Join(sdkDir, "node_modules", "openai", "package.json")); err != nil {
		t.Fatalf("tests/sdk has no node_modules/openai: run `npm ci --prefix tests/sdk` first (scripts/test.sh does): %v", err)
	}
	c := startCluster(t, map[string][]string{
		"prefill": workerFlags["prefill"],
		"decode":  append([]string{"--debug-hooks"}, workerFlags["decode"]...),
	})
	ports := freePorts(t, 2)
	cut := node{name: "router-svc", grpc: "127.0.0.1:" + strconv.Itoa(ports[0]), http: "127.0.0.1:" + strconv.Itoa(ports[1])}
	cut.p = startProc(t, cut.name, "--grpc-addr", cut.grpc, "--http-addr", cut.http, "--model", refdata.Model(t),
		"--context-length", "512", "--prefill", c.prefill.grpc, "--decode", c.decode.grpc, "--load-interval", "100ms",
		"--shutdown-timeout", "2s", "--log-level", "warn")
	waitHTTP(t, cut.p, "http://"+cut.http+"/health/ready", 30*time.Second)

	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, nodeBin, "--test", "--test-concurrency=1")
	cmd.Dir = sdkDir
	cmd.Env = append(os.Environ(),
		"OPENAI_BASE_URL=http://"+c.router.http+"/v1",
		"OPENAI_API_KEY=sk-baton-sdk-test",
		"BATON_MODEL=stories260K",
		"BATON_SIGTERM_BASE_URL=http://"+cut.http+"/v1",
		"BATON_SIGTERM_PID="+strconv.Itoa(cut.p.cmd.Process.Pid),
		"BATON_DECODE_ADMIN="+adminOf(c.decode.http),
	)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Errorf("node --test in tests/sdk: %v\n%s", err, out)
	} else {
		t.Logf("node --test in tests/sdk:\n%s", lastLines(string(out), 12))
	}
	select {
	case <-cut.p.done:
		if code := cut.p.cmd.ProcessState.ExitCode(); code != 0 {
			t.Errorf("the router the SIGTERM case stopped exited %d, want 0\n%s", code, cut.p.Stderr())
		}
	case <-time.After(10 * time.Second):
		t.Errorf("the router of the SIGTERM case is still running 10 s after node ended")
	}
	c.waitIdle(t, 5*time.Second)
}

// lastLines is the last n lines of s.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

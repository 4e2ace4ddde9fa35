package benchengine

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// storiesModel returns ../shared/models/stories260K.gguf beside the
// workspace root, skipping when it is absent (failing under CI).
func storiesModel(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.work")); err == nil {
			break
		}
		if filepath.Dir(dir) == dir {
			skipOrFail(t, "no go.work above the test directory")
		}
		dir = filepath.Dir(dir)
	}
	path := filepath.Join(filepath.Dir(dir), "shared", "models", "stories260K.gguf")
	if _, err := os.Stat(path); err != nil {
		skipOrFail(t, path+" is absent")
	}
	return path
}

func skipOrFail(t *testing.T, why string) {
	t.Helper()
	if os.Getenv("CI") != "" {
		t.Fatalf("%s (CI is set, so this is a failure)", why)
	}
	t.Skipf("%s; skipping", why)
}

func run(args ...string) (int, string, string) {
	var out, errb bytes.Buffer
	code := Run(context.Background(), &out, &errb, args)
	return code, out.String(), errb.String()
}

func TestBenchJSON(t *testing.T) {
	path := storiesModel(t)
	code, out, stderr := run("--model", path, "--batch", "1,3", "-n", "5", "-p", "7", "-r", "2", "--threads", "1", "--kv-type", "f16", "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var rep Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("%q: %v", out, err)
	}
	if rep.Threads != 1 || rep.KVType != "F16" || rep.PageSize != 16 || rep.Layers != 5 || len(rep.Results) != 4 {
		t.Fatalf("report %+v", rep)
	}
	want := []struct {
		batch int
		test  string
	}{{1, "pp7"}, {1, "tg5"}, {3, "pp7"}, {3, "tg5"}}
	for i, r := range rep.Results {
		if r.Batch != want[i].batch || r.Test != want[i].test || r.Repetitions != 2 || len(r.Samples) != 2 {
			t.Errorf("result %d: %+v", i, r)
		}
		tg, pp := r.TGPerSecond, r.PPPerSecond
		if strings.HasPrefix(r.Test, "tg") && (tg == nil || *tg <= 0 || pp != nil || r.NGen != 5) ||
			strings.HasPrefix(r.Test, "pp") && (pp == nil || *pp <= 0 || tg != nil || r.NPrompt != 7) {
			t.Errorf("result %d: speeds %v %v", i, tg, pp)
		}
	}
}

func TestBenchTable(t *testing.T) {
	path := storiesModel(t)
	code, out, stderr := run("--model", path, "-n", "3")
	if code != 0 || !strings.Contains(out, "|     1 | tg3     |") || !strings.Contains(stderr, "batch 1 tg3") {
		t.Errorf("exit %d, stdout %q, stderr %q", code, out, stderr)
	}
}

func TestBenchFlags(t *testing.T) {
	tests := [][]string{
		{"--batch", "0"},
		{"--batch", "1,x"},
		{"-n", "0"},
		{"-n", "-1"},
		{"-r", "0"},
		{"--kv-type", "Q8_0"},
		{"--page-size", "0"},
		{"--threads", "-2"},
		{"extra"},
	}
	for _, args := range tests {
		if code, _, stderr := run(args...); code != 2 || !strings.Contains(stderr, "bench-engine") {
			t.Errorf("%v: exit %d, stderr %q", args, code, stderr)
		}
	}
	if code, _, stderr := run("--help"); code != 0 || !strings.Contains(stderr, "tg_tokens_per_second") {
		t.Errorf("--help: exit %d, %q", code, stderr)
	}
	// A context window too small for the test is an error, not a crash.
	path := storiesModel(t)
	if code, _, stderr := run("--model", path, "-n", "500"); code != 1 || !strings.Contains(stderr, "context window") {
		t.Errorf("-n 500: exit %d, %q", code, stderr)
	}
}

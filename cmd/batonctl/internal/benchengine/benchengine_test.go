package benchengine

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/baton-serving/baton/engine/refdata"
)

func run(args ...string) (int, string, string) {
	var out, errb bytes.Buffer
	code := Run(context.Background(), &out, &errb, args)
	return code, out.String(), errb.String()
}

func TestBenchJSON(t *testing.T) {
	path := refdata.Model(t)
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
	path := refdata.Model(t)
	code, out, stderr := run("--model", path, "--batch", "1", "-n", "3", "-r", "1")
	if code != 0 || !strings.Contains(out, "|     1 | tg3     |") || !strings.Contains(stderr, "batch 1 tg3") {
		t.Errorf("exit %d, stdout %q, stderr %q", code, out, stderr)
	}
}

func TestBenchFlags(t *testing.T) {
	tests := [][]string{
		{"--batch", "0"},
		{"--batch", "1,x"},
		{"-n", "0", "-p", "0"},
		{"--batch", "2", "-n", "0"},
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
	path := refdata.Model(t)
	for _, args := range [][]string{{"-n", "500"}, {"--batch", "1", "-n", "500"}} {
		if code, _, stderr := run(append([]string{"--model", path}, args...)...); code != 1 || !strings.Contains(stderr, "context window") {
			t.Errorf("%v: exit %d, %q", args, code, stderr)
		}
	}
}

// TestSingleJSON checks the llama-bench-style mode (no --batch): one object
// with the speeds, their spread, every sample and the memory figures.
func TestSingleJSON(t *testing.T) {
	path := refdata.Model(t)
	code, out, stderr := run("--model", path, "-p", "16", "-n", "8", "-r", "2", "--threads", "1", "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var rep SingleReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("%q: %v", out, err)
	}
	if rep.Threads != 1 || rep.NPrompt != 16 || rep.NGen != 8 || rep.Repetitions != 2 || rep.WeightType != "F32" || rep.Kernels == "" {
		t.Fatalf("report %+v", rep)
	}
	if len(rep.PPSamples) != 2 || len(rep.TGSamples) != 2 || rep.PPPerSecond <= 0 || rep.TGPerSecond <= 0 {
		t.Fatalf("samples: pp %v tg %v", rep.PPSamples, rep.TGSamples)
	}
	if m := (rep.TGSamples[0] + rep.TGSamples[1]) / 2; math.Abs(m-rep.TGPerSecond) > 1e-9*m {
		t.Errorf("tg mean %v, samples %v", rep.TGPerSecond, rep.TGSamples)
	}
	// stories260K: 292,800 parameters, all F32, with an output matrix of
	// its own, so a decode step reads one row of the 512×64 embedding.
	if rep.Params != 292800 || rep.BytesPerToken != 4*(292800-512*64+64) || rep.FileBytes < rep.BytesPerToken {
		t.Errorf("params %d, bytes per token %d, file %d", rep.Params, rep.BytesPerToken, rep.FileBytes)
	}
	if rep.TGGBPerSecond <= 0 || (runtime.GOOS == "linux" && (rep.MaxRSSAfterLoad <= 0 || rep.MaxRSS < rep.MaxRSSAfterLoad)) {
		t.Errorf("bandwidth %v, max RSS %d then %d", rep.TGGBPerSecond, rep.MaxRSSAfterLoad, rep.MaxRSS)
	}
	// The table form, with the defaults -p 128 -n 64 -r 3 shortened.
	code, out, stderr = run("--model", path, "-n", "4", "-r", "1")
	if code != 0 || !strings.Contains(out, "pp128") || !strings.Contains(out, "tg4") || !strings.Contains(out, "ru_maxrss") {
		t.Errorf("exit %d, stdout %q, stderr %q", code, out, stderr)
	}
}

// TestReadBandwidth checks the decode-ceiling measurement on a small
// buffer: a positive rate from every thread count, and --membw refused
// where it does not apply.
func TestReadBandwidth(t *testing.T) {
	for _, threads := range []int{1, 2, 3} {
		if bw := readBandwidth(4<<20, threads, 2); !(bw > 0) || math.IsInf(bw, 0) {
			t.Errorf("%d threads: %v B/s", threads, bw)
		}
	}
	if code, _, stderr := run("--model", refdata.Model(t), "--batch", "1", "--membw"); code != exitUsage || !strings.Contains(stderr, "--membw") {
		t.Errorf("--membw with --batch: exit %d, %q", code, stderr)
	}
}

// TestBenchConstrained: --grammar (and $BATON_JSON_SCHEMA) constrain every
// sequence: a one-sentence grammar ends each after its tokens, and tg
// counts the tokens generated; a bad grammar or both files fail.
func TestBenchConstrained(t *testing.T) {
	path := refdata.Model(t)
	dir := t.TempDir()
	g := filepath.Join(dir, "g.gbnf")
	if err := os.WriteFile(g, []byte(`root ::= "Once upon"`), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, stderr := run("--model", path, "--batch", "2", "-n", "20", "-r", "1", "--threads", "1", "--json", "--grammar", g)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var rep Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("%q: %v", out, err)
	}
	if len(rep.Results) != 1 || rep.Results[0].GeneratedPerSeq <= 0 || rep.Results[0].GeneratedPerSeq >= 20 {
		t.Fatalf("results %+v: want tg with fewer than 20 tokens per sequence", rep.Results)
	}

	s := filepath.Join(dir, "s.json")
	if err := os.WriteFile(s, []byte(`{"type": "object", "properties": {"a": {"type": "boolean"}}, "required": ["a"], "additionalProperties": false}`), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("BATON_JSON_SCHEMA", s)
	if code, _, stderr := run("--model", path, "--batch", "1", "-n", "30", "-r", "1", "--threads", "1"); code != 0 || !strings.Contains(stderr, "tokens per sequence") {
		t.Fatalf("$BATON_JSON_SCHEMA: exit %d, %q", code, stderr)
	}
	if code, _, stderr := run("--model", path, "--batch", "1", "--grammar", g); code != 2 || !strings.Contains(stderr, "at most one") {
		t.Errorf("both: exit %d, %q", code, stderr)
	}
	t.Setenv("BATON_JSON_SCHEMA", "") // empty: none
	if err := os.WriteFile(g, []byte(`root ::= (`), 0o644); err != nil {
		t.Fatal(err)
	}
	if code, _, stderr := run("--model", path, "--batch", "1", "--grammar", g); code != 1 || !strings.Contains(stderr, "sampling.grammar") {
		t.Errorf("bad grammar: exit %d, %q", code, stderr)
	}
	// An empty file would run unconstrained, reporting a speed that is
	// not the constrained one: refused.
	if err := os.WriteFile(g, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if code, _, stderr := run("--model", path, "--batch", "1", "-n", "4", "-r", "1", "--threads", "1", "--grammar", g); code != 1 || !strings.Contains(stderr, "empty") {
		t.Errorf("empty grammar file: exit %d, %q", code, stderr)
	}
}

package enginehost

import (
	"strings"
	"testing"
	"time"

	"github.com/baton-serving/baton/engine/sched"
)

func TestStalled(t *testing.T) {
	now := time.Now()
	req := func(id string, m sched.Mode, s sched.State, age time.Duration) sched.RequestInfo {
		return sched.RequestInfo{ID: id, Mode: m, State: s, Age: age}
	}
	cases := []struct {
		name string
		snap sched.Snapshot
		want string // substring; "" = not stalled
	}{
		{"idle", sched.Snapshot{At: now, LastStep: now.Add(-time.Hour)}, ""},
		{"busy and stepping", sched.Snapshot{At: now, LastStep: now.Add(-time.Second),
			Requests: []sched.RequestInfo{req("a", sched.ModeGenerate, sched.StateRunning, time.Minute)}}, ""},
		{"running, no step for 12s", sched.Snapshot{At: now, LastStep: now.Add(-12 * time.Second),
			Requests: []sched.RequestInfo{req("a", sched.ModeGenerate, sched.StateRunning, time.Minute)}}, "no forward step for 12s with 1 requests to compute: a (running"},
		// The regression: after an hour idle, a long prompt's first step
		// is in progress; the request is 2 s old, so nothing is stalled.
		{"idle for an hour, new request in its first step", sched.Snapshot{At: now, LastStep: now.Add(-time.Hour), StepRunning: 2 * time.Second,
			Requests: []sched.RequestInfo{req("n", sched.ModePrefillOnly, sched.StatePrefilling, 2*time.Second)}}, ""},
		{"idle for an hour, request starved for 11s", sched.Snapshot{At: now, LastStep: now.Add(-time.Hour),
			Requests: []sched.RequestInfo{req("s", sched.ModeGenerate, sched.StateWaiting, 11*time.Second)}}, "no forward step for 11s with 1 requests to compute: s (waiting"},
		{"never stepped, old request", sched.Snapshot{At: now,
			Requests: []sched.RequestInfo{req("q", sched.ModePrefillOnly, sched.StateWaiting, 11*time.Second)}}, "q (waiting"},
		{"only transfers pending", sched.Snapshot{At: now, LastStep: now.Add(-time.Hour), Requests: []sched.RequestInfo{
			req("t", sched.ModeDecodeImported, sched.StateTransferring, time.Minute),
			req("p", sched.ModeDecodeImported, sched.StateWaiting, time.Minute),
			req("h", sched.ModePrefillOnly, sched.StateHandingOver, time.Minute)}}, ""},
		{"names at most three", sched.Snapshot{At: now, LastStep: now.Add(-time.Minute), Requests: []sched.RequestInfo{
			req("1", sched.ModeGenerate, sched.StateRunning, time.Minute), req("2", sched.ModeGenerate, sched.StateRunning, time.Minute),
			req("3", sched.ModeGenerate, sched.StateRunning, time.Minute), req("4", sched.ModeGenerate, sched.StateWaiting, time.Minute)}}, "and 1 more"},
	}
	for _, c := range cases {
		got := stalled(c.snap, 10*time.Second)
		if (c.want == "") != (got == "") || !strings.Contains(got, c.want) {
			t.Errorf("%s: stalled = %q, want %q", c.name, got, c.want)
		}
	}
}

func TestByteSize(t *testing.T) {
	for in, want := range map[string]int64{"1024": 1024, "512MiB": 512 << 20, "4GiB": 4 << 30, "1.5KiB": 1536, "100MB": 100e6} {
		var b ByteSize
		if err := b.Set(in); err != nil || int64(b) != want {
			t.Errorf("Set(%q) = %d, %v; want %d", in, b, err, want)
		}
	}
	for _, bad := range []string{"", "-1", "0", "lots", "5XB"} {
		var b ByteSize
		if err := b.Set(bad); err == nil {
			t.Errorf("Set(%q) accepted", bad)
		}
	}
}

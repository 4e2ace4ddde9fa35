package diagnose

import (
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
)

var t0 = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

// svc builds a service observed in n identical samples.
func svc(name string, role Role, n int, s Sample) ServiceObs {
	o := ServiceObs{Service: Service{Name: name, Role: role, HTTP: "http://" + name}}
	for i := range n {
		c := s
		c.At = t0.Add(time.Duration(i) * time.Second)
		o.Samples = append(o.Samples, c)
	}
	return o
}

func idle() Sample {
	return Sample{Ready: true, RequestsRead: true, Metrics: map[string]float64{"baton_kv_pages_leaked": 0}}
}

func with(s Sample, f func(*Sample)) Sample { f(&s); return s }

func down(err string) Sample { return Sample{Err: err} }

func stuck(n int, state string, since float64, traces ...string) []Request {
	var out []Request
	for i := range n {
		r := Request{ID: "req-" + string(rune('a'+i)), State: state, AgeSeconds: since + float64(n-i), SinceProgress: since}
		if i < len(traces) {
			r.TraceID = traces[i]
		}
		out = append(out, r)
	}
	return out
}

func probeOK() *ProbeResult {
	return &ProbeResult{RequestID: "diagnose-1", TraceID: "feedfacefeedfacefeedfacefeedface", OK: true, Took: 120 * time.Millisecond}
}

func TestAnalyze(t *testing.T) {
	const trace = "5f2c0a9e8d7c6b5a49382716a5b4c3d2"
	cases := []struct {
		name        string
		obs         Observation
		status      Status
		summary     []string // substrings of the summary, in order
		service     string   // a service whose verdict is checked
		stage       string
		stalled     bool
		down        bool
		probeStage  string
		problemWord string // a substring of one of service's problems
	}{
		{
			name: "healthy",
			obs: Observation{Services: []ServiceObs{
				svc("router", RoleRouter, 3, idle()), svc("prefill-0", RolePrefill, 3, idle()), svc("decode-0", RoleDecode, 3, idle())},
				Probe: probeOK()},
			status:  Healthy,
			summary: []string{"router, prefill-0, decode-0 healthy", "probe ok in 120 ms"},
		},
		{
			name: "the incident: zombies in decode's transfer queue, probe stalls in prealloc",
			obs: Observation{Services: []ServiceObs{
				svc("router", RoleRouter, 3, idle()),
				svc("prefill-0", RolePrefill, 3, idle()),
				svc("decode-0", RoleDecode, 3, with(idle(), func(s *Sample) {
					s.Requests = append(stuck(3, "TRANSFERRING", 42, trace), Request{ID: "diagnose-1", State: "PREALLOC", SinceProgress: 4})
				}))},
				Probe: &ProbeResult{RequestID: "diagnose-1", TraceID: trace, TimedOut: true, Code: "DEADLINE_EXCEEDED", Took: 5 * time.Second,
					Sightings: []Sighting{
						{At: t0, Service: "router", Role: RoleRouter, State: "ROUTING"},
						{At: t0.Add(time.Second), Service: "router", Role: RoleRouter, State: "PREALLOC"},
						{At: t0.Add(time.Second), Service: "decode-0", Role: RoleDecode, State: "PREALLOC"},
					}}},
			status:     Wedged,
			summary:    []string{"router, prefill-0 healthy", "decode-0: 3 requests in transfer queue, no progress for 42 s, oldest 5f2c0a9e…", "probe stalled at prealloc_wait on decode-0"},
			service:    "decode-0",
			stage:      "transfer queue",
			stalled:    true,
			probeStage: "prealloc_wait",
		},
		{
			name: "frozen scheduler on one of two pairs: degraded, named",
			obs: Observation{Services: []ServiceObs{
				svc("router", RoleRouter, 3, idle()),
				svc("prefill-0", RolePrefill, 3, idle()), svc("prefill-1", RolePrefill, 3, idle()),
				svc("decode-0", RoleDecode, 3, with(idle(), func(s *Sample) {
					s.Ready, s.NotReady = false, "scheduler: no forward step for 12s with 2 requests to compute"
					s.Metrics["baton_scheduler_stalled"] = 1
					s.Requests = stuck(2, "RUNNING", 12, trace)
				})),
				svc("decode-1", RoleDecode, 3, idle())},
				Probe: probeOK()},
			status:      Degraded,
			summary:     []string{"router, prefill-0, prefill-1 healthy", "decode-0: 2 requests in running batch, no progress for 12 s", "not ready (scheduler: no forward step", "decode-1 healthy", "probe ok"},
			service:     "decode-0",
			stage:       "running batch",
			stalled:     true,
			problemWord: "scheduler stalled",
		},
		{
			name: "stalled scheduler before any request is listed: the watchdog gauge alone",
			obs: Observation{Services: []ServiceObs{
				svc("decode-0", RoleDecode, 2, with(idle(), func(s *Sample) { s.Metrics["baton_scheduler_stalled"] = 1 }))}},
			status:  Wedged, // no probe, and the only decode is unusable
			service: "decode-0",
			stage:   "scheduler",
			stalled: true,
		},
		{
			name: "the only decode is down: the probe fails fast",
			obs: Observation{Services: []ServiceObs{
				svc("router", RoleRouter, 3, idle()), svc("prefill-0", RolePrefill, 3, idle()),
				svc("decode-0", RoleDecode, 3, down("connect: connection refused"))},
				Probe: &ProbeResult{Code: "UNAVAILABLE", Error: "no ready decode worker", Took: 30 * time.Millisecond}},
			status:  Wedged,
			summary: []string{"decode-0: unreachable (connect: connection refused)", "probe failed: UNAVAILABLE no ready decode worker"},
			service: "decode-0",
			down:    true,
		},
		{
			name: "one of two decodes down, the probe is served",
			obs: Observation{Services: []ServiceObs{
				svc("router", RoleRouter, 3, idle()),
				svc("decode-0", RoleDecode, 3, down("connection refused")), svc("decode-1", RoleDecode, 3, idle())},
				Probe: probeOK()},
			status:  Degraded,
			service: "decode-0",
			down:    true,
		},
		{
			name: "router orphans: it waits on requests no worker holds",
			obs: Observation{Services: []ServiceObs{
				svc("router", RoleRouter, 3, with(idle(), func(s *Sample) {
					s.Requests = stuck(2, "PREALLOC", 30, trace)
					s.Metrics["baton_router_inflight_requests"] = 2
				})),
				svc("prefill-0", RolePrefill, 3, idle()), svc("decode-0", RoleDecode, 3, idle())}},
			status:      Wedged,
			summary:     []string{"router: 2 requests in orphaned, no progress for 30 s, oldest 5f2c0a9e…", "2 requests hang with no worker holding them (orphans)"},
			service:     "router",
			stage:       "orphaned",
			stalled:     true,
			problemWord: "orphans",
		},
		{
			name: "router waits on a decode that holds them: not orphans",
			obs: Observation{Services: []ServiceObs{
				svc("router", RoleRouter, 3, with(idle(), func(s *Sample) { s.Requests = stuck(1, "PREALLOC", 30) })),
				svc("decode-0", RoleDecode, 3, with(idle(), func(s *Sample) { s.Requests = stuck(1, "TRANSFERRING", 30) }))},
				Probe: probeOK()},
			status:  Degraded,
			summary: []string{"router: 1 request in awaiting first token", "decode-0: 1 request in transfer queue"},
			service: "router",
			stage:   "awaiting first token",
			stalled: true,
		},
		{
			name: "router wedged in its own request path: its readiness names the stage",
			obs: Observation{Services: []ServiceObs{
				svc("router", RoleRouter, 3, with(idle(), func(s *Sample) {
					s.Ready, s.NotReady = false, "request-path: stuck at admission: self-probe canary-self-req-1 got no answer within 5s (--self-probe-timeout) (1.2s ago); "+
						"stuck at admission: the limiter is full (4 of 4 slots, --max-concurrent-requests) and no request finished or progressed for 12s"
				})),
				svc("prefill-0", RolePrefill, 3, idle()), svc("decode-0", RoleDecode, 3, idle())},
				Probe: &ProbeResult{RequestID: "diagnose-1", TraceID: trace, TimedOut: true, Code: "DEADLINE_EXCEEDED", Took: 10 * time.Second}},
			status:      Wedged,
			summary:     []string{"router: request path stuck at admission", "prefill-0, decode-0 healthy", "probe got no answer"},
			service:     "router",
			stage:       "admission",
			stalled:     true,
			problemWord: "request path stuck at admission",
		},
		{
			name: "router requests cannot be judged while a worker is unreadable",
			obs: Observation{Services: []ServiceObs{
				svc("router", RoleRouter, 2, with(idle(), func(s *Sample) { s.Requests = stuck(1, "PREALLOC", 30) })),
				svc("decode-0", RoleDecode, 2, down("timeout"))},
				Probe: probeOK()},
			status:      Degraded,
			service:     "router",
			stage:       "awaiting first token",
			stalled:     true,
			problemWord: "while decode-0 could not be read",
		},
		{
			name: "counters stuck while the list is empty (drained zombies)",
			obs: Observation{Services: []ServiceObs{
				svc("decode-0", RoleDecode, 3, with(idle(), func(s *Sample) { s.Metrics["baton:num_decode_transfer_queue_reqs"] = 3 }))},
				Probe: probeOK()},
			status:      Degraded,
			service:     "decode-0",
			problemWord: "baton:num_decode_transfer_queue_reqs stuck at 3 while 0 such requests are live",
		},
		{
			name: "one sample proves nothing about counters",
			obs: Observation{Services: []ServiceObs{
				svc("decode-0", RoleDecode, 1, with(idle(), func(s *Sample) { s.Metrics["baton:num_decode_transfer_queue_reqs"] = 3 }))},
				Probe: probeOK()},
			status: Healthy,
		},
		{
			name: "leaked pages and invariant violations",
			obs: Observation{Services: []ServiceObs{
				svc("prefill-0", RolePrefill, 2, with(idle(), func(s *Sample) {
					s.Metrics["baton_kv_pages_leaked"] = 4
					s.Metrics["baton_invariant_violations_total"] = 1
				}))},
				Probe: probeOK()},
			status:      Degraded,
			summary:     []string{"prefill-0: 4 KV pages leaked, 1 scheduler invariant violations"},
			service:     "prefill-0",
			problemWord: "4 KV pages leaked",
		},
		{
			name: "quarantined by the canary while its own readiness passes",
			obs: Observation{Services: []ServiceObs{
				svc("router", RoleRouter, 2, idle()),
				func() ServiceObs {
					o := svc("decode-0", RoleDecode, 2, idle())
					o.Quarantine = "10.0.0.1:8082->10.0.0.2:8084: canary deadline exceeded"
					return o
				}(),
				svc("decode-1", RoleDecode, 2, idle())},
				Probe: probeOK()},
			status:      Degraded,
			summary:     []string{"decode-0: quarantined by the router's canary (10.0.0.1:8082->10.0.0.2:8084: canary deadline exceeded)"},
			service:     "decode-0",
			problemWord: "quarantined",
		},
		{
			name: "busy, not wedged: the probe is refused for load",
			obs: Observation{Services: []ServiceObs{svc("router", RoleRouter, 1, idle())},
				Probe: &ProbeResult{Code: "RESOURCE_EXHAUSTED", Error: "too many requests"}},
			status: Degraded,
		},
		{
			name: "router not ready",
			obs: Observation{Services: []ServiceObs{
				svc("router", RoleRouter, 2, with(idle(), func(s *Sample) { s.Ready, s.NotReady = false, "workers: no ready decode worker" }))},
				Probe: probeOK()},
			status:  Wedged,
			summary: []string{"router: not ready (workers: no ready decode worker)"},
		},
		{
			name: "probe stuck behind prefill's compute",
			obs: Observation{Services: []ServiceObs{svc("router", RoleRouter, 1, idle())},
				Probe: &ProbeResult{TraceID: trace, TimedOut: true, Took: 5 * time.Second, Sightings: []Sighting{
					{At: t0, Service: "decode-0", Role: RoleDecode, State: "PREALLOC"},
					{At: t0.Add(time.Second), Service: "router", Role: RoleRouter, State: "PREALLOC"},
					{At: t0.Add(time.Second), Service: "decode-0", Role: RoleDecode, State: "TRANSFERRING"},
					{At: t0.Add(time.Second), Service: "prefill-0", Role: RolePrefill, State: "PREFILLING"},
				}}},
			status:     Wedged,
			summary:    []string{"probe stalled at forward on prefill-0"},
			probeStage: "forward",
		},
		{
			name: "probe decoding when it timed out: decode's stage wins",
			obs: Observation{Services: []ServiceObs{svc("router", RoleRouter, 1, idle())},
				Probe: &ProbeResult{TimedOut: true, Sightings: []Sighting{
					{At: t0, Service: "prefill-0", Role: RolePrefill, State: "TRANSFERRING"},
					{At: t0, Service: "decode-0", Role: RoleDecode, State: "RUNNING"},
				}}},
			status:     Wedged,
			probeStage: "decode",
		},
		{
			name: "flapping: unreachable in one sample of three",
			obs: Observation{Services: []ServiceObs{{Service: Service{Name: "prefill-0", Role: RolePrefill},
				Samples: []Sample{idle(), down("i/o timeout"), idle()}}}, Probe: probeOK()},
			status:      Degraded,
			service:     "prefill-0",
			problemWord: "unreachable in 1 of 3 samples (i/o timeout)",
		},
		{
			name: "no probe, one decode stalled of two: degraded",
			obs: Observation{Services: []ServiceObs{
				svc("decode-0", RoleDecode, 2, with(idle(), func(s *Sample) { s.Requests = stuck(1, "RUNNING", 20) })),
				svc("decode-1", RoleDecode, 2, idle())}},
			status:  Degraded,
			service: "decode-0",
			stage:   "running batch",
			stalled: true,
		},
		{
			name: "no probe, every decode unusable: wedged",
			obs: Observation{Services: []ServiceObs{
				svc("decode-0", RoleDecode, 2, with(idle(), func(s *Sample) { s.Requests = stuck(1, "PREALLOC", 20) })),
				svc("decode-1", RoleDecode, 2, down("refused"))}},
			status:  Wedged,
			service: "decode-0",
			stage:   "prealloc queue",
			stalled: true,
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			v := Analyze(c.obs, Options{StuckAfter: 5 * time.Second})
			if v.Status != c.status || v.ExitCode != c.status.ExitCode() {
				t.Errorf("status %s (exit %d), want %s; summary: %s", v.Status, v.ExitCode, c.status, v.Summary)
			}
			rest := v.Summary
			for _, want := range c.summary {
				i := strings.Index(rest, want)
				if i < 0 {
					t.Errorf("summary %q lacks %q (in order)", v.Summary, want)
					break
				}
				rest = rest[i+len(want):]
			}
			if c.service != "" {
				i := slices.IndexFunc(v.Services, func(s ServiceVerdict) bool { return s.Name == c.service })
				if i < 0 {
					t.Fatalf("no verdict for %s", c.service)
				}
				s := v.Services[i]
				if s.Stage != c.stage || s.Stalled != c.stalled || s.Down != c.down || s.Healthy {
					t.Errorf("%s: stage %q stalled %v down %v healthy %v; want stage %q stalled %v down %v, unhealthy",
						c.service, s.Stage, s.Stalled, s.Down, s.Healthy, c.stage, c.stalled, c.down)
				}
				if c.problemWord != "" && !slices.ContainsFunc(s.Problems, func(p string) bool { return strings.Contains(p, c.problemWord) }) {
					t.Errorf("%s problems %q lack %q", c.service, s.Problems, c.problemWord)
				}
			}
			if c.probeStage != "" && (v.Probe == nil || v.Probe.Stage != c.probeStage) {
				t.Errorf("probe verdict %+v, want stage %q", v.Probe, c.probeStage)
			}
		})
	}
}

// TestAnalyzeStuckOrder: stuck requests are listed oldest first with their
// trace ids, and only those past StuckAfter count.
func TestAnalyzeStuckOrder(t *testing.T) {
	reqs := []Request{
		{ID: "young", State: "RUNNING", AgeSeconds: 3, SinceProgress: 3},
		{ID: "mid", State: "RUNNING", AgeSeconds: 20, SinceProgress: 8, TraceID: "aa"},
		{ID: "old", State: "TRANSFERRING", AgeSeconds: 60, SinceProgress: 9, TraceID: "bb"},
	}
	v := Analyze(Observation{Services: []ServiceObs{svc("decode-0", RoleDecode, 1, with(idle(), func(s *Sample) { s.Requests = reqs }))}},
		Options{StuckAfter: 5 * time.Second})
	s := v.Services[0]
	var got []string
	for _, r := range s.Stuck {
		got = append(got, r.ID+"/"+r.TraceID)
	}
	if !slices.Equal(got, []string{"old/bb", "mid/aa"}) || s.NoProgressSeconds != 9 {
		t.Errorf("stuck %v, no progress %v; want [old/bb mid/aa], 9", got, s.NoProgressSeconds)
	}
	// A tie in counts goes to the oldest request's stage.
	if s.Stage != "transfer queue" {
		t.Errorf("stage %q, want transfer queue", s.Stage)
	}
}

// TestSecs: durations print with the precision their size needs; a 4 ms
// probe is not "0.0 s".
func TestSecs(t *testing.T) {
	for s, want := range map[float64]string{
		0: "0 ms", 0.0004: "0.4 ms", 0.004: "4 ms", 0.0042: "4.2 ms", 0.00999: "10 ms", 0.012: "12 ms",
		0.2504: "250 ms", 0.9996: "1.0 s", 2.54: "2.5 s", 9.96: "10 s", 42: "42 s",
	} {
		if got := secs(s); got != want {
			t.Errorf("secs(%v) = %q, want %q", s, got, want)
		}
	}
}

func TestCodeName(t *testing.T) {
	for c, want := range map[int]string{0: "OK", 4: "DEADLINE_EXCEEDED", 8: "RESOURCE_EXHAUSTED", 14: "UNAVAILABLE", 9: "FAILED_PRECONDITION"} {
		if got := codeName(codeOf(c)); got != want {
			t.Errorf("codeName(%d) = %q, want %q", c, got, want)
		}
	}
}

func codeOf(c int) codes.Code { return codes.Code(c) }

package diagnose

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
)

// Status is the overall verdict.
type Status string

// The verdicts, from best to worst.
const (
	// Healthy: every service is ready and making progress, and the probe
	// came back.
	Healthy Status = "healthy"
	// Degraded: requests are served (the probe came back), but some
	// service is down, stalled, not ready, leaking or inconsistent.
	Degraded Status = "degraded"
	// Wedged: a request sent now would not be served: the probe failed or
	// stalled, the router is down or not ready, or every worker of a role is.
	Wedged Status = "wedged"
)

// ExitCode is the process exit code for s: 0, 1 or 2.
func (s Status) ExitCode() int {
	switch s {
	case Healthy:
		return 0
	case Degraded:
		return 1
	}
	return 2
}

// StuckRequest is a request that made no progress for Options.StuckAfter.
type StuckRequest struct {
	ID            string  `json:"request_id"`
	State         string  `json:"state"`
	Stage         string  `json:"stage"`
	AgeSeconds    float64 `json:"age_seconds"`
	SinceProgress float64 `json:"since_progress_seconds"`
	TraceID       string  `json:"trace_id,omitempty"`
	Workers       string  `json:"workers,omitempty"`
}

// ServiceVerdict is what is wrong with one service, if anything.
type ServiceVerdict struct {
	Service
	Healthy bool `json:"healthy"`
	Down    bool `json:"down,omitempty"`
	// Stalled: requests made no progress for Options.StuckAfter, or the
	// scheduler's own watchdog says it is stalled.
	Stalled bool `json:"stalled,omitempty"`
	Ready   bool `json:"ready"`
	// Stage is where the stuck requests are (the stage most of them share).
	Stage             string         `json:"stage,omitempty"`
	NoProgressSeconds float64        `json:"no_progress_seconds,omitempty"`
	Stuck             []StuckRequest `json:"stuck,omitempty"`
	// Problems are the findings, one phrase each.
	Problems []string `json:"problems,omitempty"`
}

// ProbeVerdict is the probe's outcome and, when it did not come back, the
// stage (span name) it was last seen in.
type ProbeVerdict struct {
	RequestID string  `json:"request_id"`
	TraceID   string  `json:"trace_id"`
	OK        bool    `json:"ok"`
	Seconds   float64 `json:"seconds"`
	TimedOut  bool    `json:"timed_out,omitempty"`
	Code      string  `json:"code,omitempty"`
	Error     string  `json:"error,omitempty"`
	Service   string  `json:"service,omitempty"` // where it was last seen
	Stage     string  `json:"stage,omitempty"`
	Text      string  `json:"text,omitempty"`
}

// Verdict is diagnose's answer.
type Verdict struct {
	Status   Status           `json:"status"`
	ExitCode int              `json:"exit_code"`
	Summary  string           `json:"summary"`
	Services []ServiceVerdict `json:"services"`
	Probe    *ProbeVerdict    `json:"probe,omitempty"`
	Notes    []string         `json:"notes,omitempty"`
}

// Options tune the analysis.
type Options struct {
	// StuckAfter is how long a request may go without progress before it
	// counts as stuck.
	StuckAfter time.Duration
}

// Analyze turns what was observed into a verdict. It is a pure function of
// its input, so every rule can be tested with made-up observations.
func Analyze(obs Observation, opt Options) Verdict {
	if opt.StuckAfter <= 0 {
		opt.StuckAfter = 5 * time.Second
	}
	v := Verdict{}
	if obs.Discovery != "" {
		v.Notes = append(v.Notes, obs.Discovery)
	}
	for _, s := range obs.Services {
		v.Services = append(v.Services, analyzeService(s, opt))
	}
	findOrphans(obs, v.Services, opt)
	for i := range v.Services {
		sv := &v.Services[i]
		sv.Healthy = !sv.Down && !sv.Stalled && sv.Ready && len(sv.Problems) == 0
	}
	if obs.Probe != nil {
		v.Probe = probeVerdict(*obs.Probe)
	}
	v.Status = overall(v)
	v.ExitCode = v.Status.ExitCode()
	v.Summary = summary(v)
	return v
}

// analyzeService applies the per-service rules.
func analyzeService(s ServiceObs, opt Options) ServiceVerdict {
	sv := ServiceVerdict{Service: s.Service}
	var ok []Sample
	var lastErr string
	for _, smp := range s.Samples {
		if smp.Err != "" {
			lastErr = smp.Err
			continue
		}
		ok = append(ok, smp)
	}
	if len(ok) == 0 {
		sv.Down = true
		if lastErr == "" {
			lastErr = "not sampled"
		}
		sv.Problems = append(sv.Problems, "unreachable ("+lastErr+")")
		return sv
	}
	if n := len(s.Samples) - len(ok); n > 0 {
		sv.Problems = append(sv.Problems, fmt.Sprintf("unreachable in %d of %d samples (%s)", n, len(s.Samples), lastErr))
	}
	if s.Quarantine != "" {
		sv.Problems = append(sv.Problems, "quarantined by the router's canary ("+shorten(s.Quarantine, 160)+")")
	}
	last := ok[len(ok)-1]
	sv.Ready = last.Ready
	if s.Role == RoleRouter && !last.Ready {
		if stage := routerPathStage(last.NotReady); stage != "" {
			sv.Stalled, sv.Stage = true, stage
			sv.Problems = append(sv.Problems, "request path stuck at "+stage)
		}
	}
	if !last.Ready {
		sv.Problems = append(sv.Problems, "not ready ("+shorten(last.NotReady, 160)+")")
	}

	if last.RequestsRead {
		for _, r := range last.Requests {
			if r.SinceProgress < opt.StuckAfter.Seconds() {
				continue
			}
			sv.Stuck = append(sv.Stuck, StuckRequest{ID: r.ID, State: r.State, Stage: queueName(s.Role, r.State),
				AgeSeconds: r.AgeSeconds, SinceProgress: r.SinceProgress, TraceID: r.TraceID, Workers: r.Workers})
		}
	}
	if len(sv.Stuck) > 0 {
		sv.Stalled = true
		slices.SortStableFunc(sv.Stuck, func(a, b StuckRequest) int { return cmp.Compare(b.AgeSeconds, a.AgeSeconds) })
		sv.Stage = dominantStage(sv.Stuck)
		for _, r := range sv.Stuck {
			sv.NoProgressSeconds = max(sv.NoProgressSeconds, r.SinceProgress)
		}
	}

	if m := last.Metrics; m != nil {
		if m["baton_scheduler_stalled"] >= 1 {
			sv.Stalled = true
			if sv.Stage == "" {
				sv.Stage = "scheduler"
			}
			sv.Problems = append(sv.Problems, "scheduler stalled: no forward step with work waiting")
		}
		if n := m["baton_kv_pages_leaked"]; n > 0 {
			sv.Problems = append(sv.Problems, fmt.Sprintf("%s KV pages leaked", num(n)))
		}
		if n := m["baton_invariant_violations_total"]; n > 0 {
			sv.Problems = append(sv.Problems, fmt.Sprintf("%s scheduler invariant violations", num(n)))
		}
	}
	sv.Problems = append(sv.Problems, stuckCounters(s.Role, ok)...)
	return sv
}

// routerPathCheck is the router's readiness check of its own request path
// (router-svc's routerhealth.go); each of its reasons reads
// "stuck at STAGE: why".
const routerPathCheck = "request-path: "

// routerPathStage is the stage the router's request-path check names in
// its readiness reasons (readyReasons' "name: reason; ..."), "" when that
// check passes. The router then cannot serve whatever its workers do: it is
// wedged in admission, prepare, routing, sending to client, sender or
// transport (the self-probe never reached its handler).
func routerPathStage(notReady string) string {
	_, rest, ok := strings.Cut(notReady, routerPathCheck)
	if !ok {
		return ""
	}
	rest, ok = strings.CutPrefix(rest, "stuck at ")
	if !ok {
		return ""
	}
	stage, _, ok := strings.Cut(rest, ":")
	if !ok {
		return ""
	}
	return stage
}

// counterStates pairs each queue gauge with the listed state it counts.
var counterStates = map[Role][]struct{ gauge, state string }{
	RoleDecode: {
		{"baton:num_decode_prealloc_queue_reqs", "PREALLOC"},
		{"baton:num_decode_transfer_queue_reqs", "TRANSFERRING"},
		{"baton:num_running_reqs", "RUNNING"},
	},
	RolePrefill: {
		{"baton:num_queue_reqs", "PREFILL_QUEUED"},
		{"baton_num_prefilling_reqs", "PREFILLING"},
		{"baton:num_prefill_inflight_queue_reqs", "TRANSFERRING"},
	},
	RoleRouter: {
		{"baton_router_inflight_requests", ""}, // "": every listed request
	},
}

// stuckCounters finds gauges that hold one nonzero value over every sample
// while the service lists fewer live requests in the state they count: the
// counters the incident's operators trusted, out of step with reality. A
// single sample, or a moving gauge, proves nothing (the list and the
// metrics are read a moment apart).
func stuckCounters(role Role, ok []Sample) []string {
	if len(ok) < 2 {
		return nil
	}
	var out []string
	for _, cs := range counterStates[role] {
		first := -1.0
		stuck := true
		maxListed := 0
		for _, smp := range ok {
			g, have := smp.Metrics[cs.gauge]
			if smp.Metrics == nil || !have || !smp.RequestsRead {
				stuck = false
				break
			}
			listed := 0
			for _, r := range smp.Requests {
				if cs.state == "" || r.State == cs.state {
					listed++
				}
			}
			maxListed = max(maxListed, listed)
			if first < 0 {
				first = g
			}
			if g == 0 || g != first || float64(listed) >= g {
				stuck = false
				break
			}
		}
		if stuck {
			out = append(out, fmt.Sprintf("%s stuck at %s while %d such requests are live (counter out of step with the requests)",
				cs.gauge, num(first), maxListed))
		}
	}
	return out
}

// findOrphans marks router requests that hang while no worker holds them —
// the incident's router, still waiting after the workers had let go. It
// needs every worker's list in every sample; a worker that could not be
// read might be holding them.
func findOrphans(obs Observation, vs []ServiceVerdict, opt Options) {
	held := map[string]bool{}
	var down []string
	for _, s := range obs.Services {
		if s.Role == RoleRouter {
			continue
		}
		for _, smp := range s.Samples {
			if smp.Err != "" || !smp.RequestsRead {
				down = append(down, s.Name)
				break
			}
			for _, r := range smp.Requests {
				held[r.ID] = true
			}
		}
	}
	for i := range vs {
		sv := &vs[i]
		if sv.Role != RoleRouter || len(sv.Stuck) == 0 {
			continue
		}
		if len(down) > 0 {
			sv.Problems = append(sv.Problems, fmt.Sprintf("%d requests waiting while %s could not be read", len(sv.Stuck), strings.Join(down, ", ")))
			continue
		}
		orphans := 0
		for j := range sv.Stuck {
			r := &sv.Stuck[j]
			if r.State != "ROUTING" && !held[r.ID] {
				r.Stage = "orphaned"
				orphans++
			}
		}
		if orphans > 0 {
			sv.Stage = dominantStage(sv.Stuck)
			sv.Problems = append(sv.Problems, fmt.Sprintf("%d requests hang with no worker holding them (orphans)", orphans))
		}
	}
}

// queueName names where a request in state waits, in operators' words.
func queueName(role Role, state string) string {
	switch role {
	case RoleRouter:
		switch state {
		case "ROUTING":
			return "routing"
		case "PREALLOC":
			return "awaiting first token"
		case "RUNNING":
			return "streaming"
		}
	case RoleDecode:
		switch state {
		case "PREALLOC":
			return "prealloc queue"
		case "TRANSFERRING":
			return "transfer queue"
		case "RUNNING":
			return "running batch"
		case "PREFILL_QUEUED", "PREFILLING":
			return "colocated prefill"
		}
	case RolePrefill:
		switch state {
		case "PREFILL_QUEUED":
			return "prefill queue"
		case "PREFILLING":
			return "prefill batch"
		case "TRANSFERRING":
			return "inflight queue (KV send)"
		}
	}
	if state == "FINISHING" {
		return "release"
	}
	return strings.ToLower(state)
}

// spanName names the trace span a request in state is in
// (docs/observability.md).
func spanName(role Role, state string) string {
	switch role {
	case RoleRouter:
		if state == "ROUTING" {
			return "route"
		}
		return "stream"
	case RoleDecode:
		switch state {
		case "PREALLOC":
			return "prealloc_wait"
		case "TRANSFERRING":
			return "kv_receive"
		case "RUNNING", "PREFILL_QUEUED", "PREFILLING":
			return "decode"
		}
	case RolePrefill:
		switch state {
		case "PREFILL_QUEUED":
			return "queue_wait"
		case "PREFILLING":
			return "forward"
		case "TRANSFERRING":
			return "kv_send"
		}
	}
	return strings.ToLower(state)
}

// dominantStage is the stage most stuck requests share; ties go to the
// stage of the oldest (stuck is sorted oldest first).
func dominantStage(stuck []StuckRequest) string {
	count := map[string]int{}
	best := ""
	for _, r := range stuck {
		count[r.Stage]++
	}
	for _, r := range stuck {
		if best == "" || count[r.Stage] > count[best] {
			best = r.Stage
		}
	}
	return best
}

// probeVerdict reads the probe's outcome and where it was last seen.
func probeVerdict(p ProbeResult) *ProbeVerdict {
	pv := &ProbeVerdict{RequestID: p.RequestID, TraceID: p.TraceID, OK: p.OK, Seconds: p.Took.Seconds(),
		TimedOut: p.TimedOut, Code: p.Code, Error: p.Error, Text: p.Text}
	if p.OK || len(p.Sightings) == 0 {
		if !p.OK && pv.Code == "" && !p.TimedOut {
			pv.Stage = "router" // refused before any service listed it
		}
		return pv
	}
	// The last poll round that saw it; within it the deepest service:
	// prefill's stage explains a decode waiting on the transfer, unless
	// decode already runs the request.
	lastAt := p.Sightings[len(p.Sightings)-1].At
	var round []Sighting
	for _, s := range p.Sightings {
		if s.At.Equal(lastAt) {
			round = append(round, s)
		}
	}
	rank := func(s Sighting) int {
		switch {
		case s.Role == RoleDecode && s.State == "RUNNING":
			return 3
		case s.Role == RolePrefill:
			return 2
		case s.Role == RoleDecode:
			return 1
		}
		return 0
	}
	best := round[0]
	for _, s := range round[1:] {
		if rank(s) > rank(best) {
			best = s
		}
	}
	pv.Service, pv.Stage = best.Service, spanName(best.Role, best.State)
	return pv
}

// overall combines the services' and the probe's verdicts.
func overall(v Verdict) Status {
	byRole := map[Role][2]int{} // [workers, unusable workers]
	unhealthy := false
	for _, s := range v.Services {
		if !s.Healthy {
			unhealthy = true
		}
		if s.Role == RoleRouter {
			if s.Down || !s.Ready {
				return Wedged
			}
			for _, r := range s.Stuck {
				if r.Stage == "orphaned" {
					return Wedged
				}
			}
			continue
		}
		c := byRole[s.Role]
		c[0]++
		if s.Down || s.Stalled || !s.Ready {
			c[1]++
		}
		byRole[s.Role] = c
	}
	if p := v.Probe; p != nil {
		switch {
		case p.OK:
		case p.Code == "RESOURCE_EXHAUSTED":
			return Degraded // refused for load, which is not a wedge
		default:
			return Wedged
		}
	} else {
		for _, c := range byRole {
			if c[0] > 0 && c[0] == c[1] {
				return Wedged
			}
		}
	}
	if unhealthy {
		return Degraded
	}
	return Healthy
}

// summary is the one-line verdict: each service's state, then the probe's.
func summary(v Verdict) string {
	var parts, healthy []string
	flush := func() {
		if len(healthy) > 0 {
			parts = append(parts, strings.Join(healthy, ", ")+" healthy")
			healthy = nil
		}
	}
	for _, s := range v.Services {
		if s.Healthy {
			healthy = append(healthy, s.Name)
			continue
		}
		flush()
		parts = append(parts, s.Name+": "+serviceClause(s))
	}
	flush()
	if p := v.Probe; p != nil {
		parts = append(parts, probeClause(p))
	}
	return strings.Join(parts, "; ")
}

func serviceClause(s ServiceVerdict) string {
	var bits []string
	if len(s.Stuck) > 0 {
		oldest := s.Stuck[0]
		id := oldest.TraceID
		if id == "" {
			id = oldest.ID
		}
		bits = append(bits, fmt.Sprintf("%d %s in %s, no progress for %s, oldest %s",
			len(s.Stuck), plural(len(s.Stuck), "request", "requests"), s.Stage, secs(s.NoProgressSeconds), abbrev(id)))
	}
	bits = append(bits, s.Problems...)
	if len(bits) == 0 {
		bits = append(bits, "not healthy")
	}
	return strings.Join(bits, ", ")
}

func probeClause(p *ProbeVerdict) string {
	switch {
	case p.OK:
		return fmt.Sprintf("probe ok in %s", secs(p.Seconds))
	case p.TimedOut && p.Stage != "":
		return fmt.Sprintf("probe stalled at %s on %s (%s, trace %s)", p.Stage, p.Service, secs(p.Seconds), abbrev(p.TraceID))
	case p.TimedOut:
		return fmt.Sprintf("probe got no answer in %s and was never listed by a service (trace %s)", secs(p.Seconds), abbrev(p.TraceID))
	}
	where := ""
	if p.Stage != "" && p.Service != "" {
		where = fmt.Sprintf(" at %s on %s", p.Stage, p.Service)
	}
	code := p.Code
	if code == "" {
		code = "error"
	}
	return fmt.Sprintf("probe failed%s: %s %s", where, code, shorten(p.Error, 160))
}

// abbrev shortens a trace or request id for the summary line; the details
// and --json carry it whole.
func abbrev(id string) string {
	if len(id) > 12 {
		return id[:8] + "…"
	}
	return id
}

// secs prints a duration in seconds with the precision that matters at its
// size: a 4 ms probe is "4 ms", not "0.0 s".
func secs(s float64) string {
	// The bounds are where the rounding would carry into the next form.
	switch {
	case s < 0.00995:
		return fmt.Sprintf("%.2g ms", s*1000)
	case s < 0.9995:
		return fmt.Sprintf("%.0f ms", s*1000)
	case s < 9.95:
		return fmt.Sprintf("%.1f s", s)
	}
	return fmt.Sprintf("%.0f s", s)
}

func num(f float64) string {
	if f == math.Trunc(f) {
		return fmt.Sprintf("%.0f", f)
	}
	return fmt.Sprintf("%g", f)
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

func shorten(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}

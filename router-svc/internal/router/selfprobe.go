package router

// The self-probe: the router watching its own request path. The canary
// proves each worker pair by calling DecodeService directly, which skips
// everything the router itself does for a request — the limiter, prepare,
// the in-flight table, the relay, the stream sender, the gRPC server — so a
// router wedged in any of them stayed ready. Every --self-probe-interval
// the self-probe sends one tiny request to the router's own gRPC port
// (through the connection the REST gateway uses: the path a client takes)
// and follows it through run; a probe that gets no answer within
// --self-probe-timeout while the router held it makes the router NOT_SERVING
// with the stage it was stuck in (routerhealth.go).
//
// The probe is labelled as a canary (svckit/canarylabel): its id starts
// with "canary-self-", so workers count it as canary traffic, and the router
// leaves it out of its own request metrics. Clients cannot send such ids
// (prepare refuses the canary prefix); run accepts one only from a probe this
// router has in flight, carrying the process's secret token.

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/baton-serving/baton/engine/tokenizer"
	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"github.com/baton-serving/baton/svckit"
	"github.com/baton-serving/baton/svckit/apiconv"
	"github.com/baton-serving/baton/svckit/canarylabel"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// selfProbeIDPrefix starts every self-probe's request id: a canary id.
const selfProbeIDPrefix = canarylabel.IDPrefix + "self-"

// selfProbeTokenKey is the gRPC metadata key carrying the process's secret
// self-probe token.
const selfProbeTokenKey = "baton-self-probe"

// selfProbeTokens is how many tokens a self-probe asks for: two, as the
// canary does, so that the decode worker's own forward step is in the path;
// fewer when --max-new-tokens-limit allows fewer (selfProbeRequest).
const selfProbeTokens = 2

// Stages of a request at the router, as the self-probe reports where it got
// stuck. The first group is the router's own; in the second the request
// waits on its workers (the canary's business, not the router's).
const (
	stageTransport = "transport" // sent, never reached run (gRPC server, interceptors, handler)
	stageAdmission = "admission" // run: draining check, limiter
	stagePrepare   = "prepare"
	stageRouting   = "routing"           // in the in-flight table, picking a pair
	stageSending   = "sending to client" // handing an event to the stream sender
	stageSender    = "sender"            // run has returned; the end has not reached the client
	stageFirst     = "awaiting first token"
	stageStreaming = "streaming"
)

// workerStage reports whether a request in stage waits on its workers, so
// that a probe stuck there says nothing about the router itself.
func workerStage(stage string) bool { return stage == stageFirst || stage == stageStreaming }

// selfProbeFlags configure the self-probe.
type selfProbeFlags struct {
	interval time.Duration
	timeout  time.Duration
}

func (f *selfProbeFlags) addFlags(fs *flag.FlagSet) {
	fs.DurationVar(&f.interval, "self-probe-interval", 5*time.Second, "how often the router sends a tiny canary-labelled request to its own gRPC port (limiter, prepare, in-flight table, relay, sender: a client's path); one stuck in the router for --self-probe-timeout turns readiness NOT_SERVING naming the stage (0: no self-probe)")
	fs.DurationVar(&f.timeout, "self-probe-timeout", 5*time.Second, "deadline of one self-probe request")
}

func (f *selfProbeFlags) validate() error {
	switch {
	case f.interval < 0:
		return fmt.Errorf("--self-probe-interval: %v, want ≥ 0 (0 turns the self-probe off)", f.interval)
	case f.interval > 0 && f.interval < 100*time.Millisecond:
		return fmt.Errorf("--self-probe-interval: %v, want 0 or ≥ 100ms", f.interval)
	case f.timeout <= 0:
		return fmt.Errorf("--self-probe-timeout: %v, want > 0", f.timeout)
	}
	return nil
}

// probeRun is one self-probe in flight, as run sees it.
type probeRun struct {
	id      string
	start   time.Time
	stage   atomic.Pointer[string]  // before the in-flight entry exists
	req     atomic.Pointer[request] // the in-flight entry, once added
	endedAt atomic.Pointer[string]  // the stage run failed in, once it has
	ended   atomic.Bool             // run has returned
}

// setStage records the stage the probe entered; safe on nil (not a probe).
func (p *probeRun) setStage(stage string) {
	if p != nil {
		p.stage.Store(&stage)
	}
}

// attach links the probe to its in-flight entry, whose state says the
// stage from then on; safe on nil.
func (p *probeRun) attach(r *request) {
	if p != nil {
		p.req.Store(r)
	}
}

// end marks run's return with err, remembering the stage a failed run
// returned from (where the probe failed); safe on nil.
func (p *probeRun) end(err error) {
	if p != nil {
		if err != nil {
			st := p.where()
			p.endedAt.Store(&st)
		}
		p.ended.Store(true)
	}
}

// failedAt is the stage run failed in, or where the probe is now when run
// did not fail (its answer failed on the way back: the sender, or a stage
// run has not left).
func (p *probeRun) failedAt() string {
	if st := p.endedAt.Load(); st != nil {
		return *st
	}
	return p.where()
}

// where is the stage the probe is in now.
func (p *probeRun) where() string {
	if p.ended.Load() {
		return stageSender
	}
	if r := p.req.Load(); r != nil {
		if st, ok := r.knownStage(); ok {
			return st
		}
	}
	if s := p.stage.Load(); s != nil {
		return *s
	}
	return stageTransport
}

// probeResult is the outcome of the last finished self-probe.
type probeResult struct {
	at     time.Time
	id     string
	stage  string // where it failed ("" when it passed)
	err    error  // nil: passed
	router bool   // the failure is the router's own (stuck or broken in a router stage)
}

// selfProber sends the self-probes and keeps their outcome.
type selfProber struct {
	conn     grpc.ClientConnInterface
	req      probeRequest
	token    string // the secret in every probe's metadata
	apiKey   string // sent as a bearer key when the router requires one
	flags    selfProbeFlags
	draining func() bool
	logger   *slog.Logger
	results  *prometheus.CounterVec

	mu        sync.Mutex
	inflight  map[string]*probeRun
	last      probeResult
	failing   bool // the last result failed in a router stage (for logging changes once)
	misconfig bool // a probe was refused as invalid (logged once)
}

// probeRequest is what a self-probe asks for: a prompt and a number of new
// tokens within the router's own limits, so that a valid configuration
// never refuses its own probe.
type probeRequest struct {
	prompt    string   // the prompt as text, when it fits --max-prompt-tokens
	promptIDs []uint32 // else the first tokens of its encoding
	maxNew    uint32
}

// selfProbeRequest is the self-probe's request under s's limits: the
// canary's prompt and two new tokens, or as many as --max-new-tokens-limit
// allows and as much of the prompt as --max-prompt-tokens and the context
// window leave (at least one token). A configuration in which even that
// does not fit has prepare refuse the probe, which the probe reports as a
// configuration error (probe).
func (s *Service) selfProbeRequest() probeRequest {
	maxNew := selfProbeTokens
	if lim := s.limits.maxNewTokens; lim > 0 {
		maxNew = min(maxNew, lim)
	}
	ids := s.tok.Encode(canaryPrompt, tokenizer.EncodeOptions{AddSpecial: true, ParseSpecial: true})
	fit := len(ids)
	if lim := s.limits.maxPromptTokens; lim > 0 {
		fit = min(fit, lim)
	}
	fit = max(min(fit, s.cfg.ContextLength-maxNew), 1)
	if fit >= len(ids) {
		return probeRequest{prompt: canaryPrompt, maxNew: uint32(maxNew)}
	}
	return probeRequest{promptIDs: apiconv.WireIDs(ids[:fit]), maxNew: uint32(maxNew)}
}

// newSelfProbeToken makes the process's secret self-probe token.
func newSelfProbeToken() string {
	var b [24]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func newSelfProber(conn grpc.ClientConnInterface, req probeRequest, token, apiKey string, f selfProbeFlags, draining func() bool, logger *slog.Logger, reg prometheus.Registerer) *selfProber {
	p := &selfProber{conn: conn, req: req, token: token, apiKey: apiKey, flags: f, draining: draining, logger: logger,
		inflight: map[string]*probeRun{},
		results: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "baton_router_self_probes_total",
			Help: "The router's self-probes through its own request path, by result: pass, fail (stuck or broken in the router), worker (failed waiting on workers), busy (refused for load), config (refused as invalid by the router's own limits: a configuration error)."},
			[]string{"result"})}
	reg.MustRegister(p.results)
	return p
}

// run probes every interval until ctx ends; the first probe goes out at
// once, so a router that starts wedged never turns ready.
func (p *selfProber) run(ctx context.Context) {
	t := time.NewTicker(p.flags.interval)
	defer t.Stop()
	for {
		p.probe(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// probe sends one self-probe and records its outcome.
func (p *selfProber) probe(ctx context.Context) {
	id := selfProbeIDPrefix + newRequestID()
	pr := &probeRun{id: id, start: time.Now()}
	p.mu.Lock()
	p.inflight[id] = pr
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.inflight, id)
		p.mu.Unlock()
	}()

	// The deadline is the probe's own, not sent with the call: the
	// router must not see it, or its own handler would end the request at
	// the same moment and the probe could not tell where it was stuck.
	// When it passes, the stage is read before the call is cancelled.
	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var stuckAt atomic.Pointer[string]
	timer := time.AfterFunc(p.flags.timeout, func() {
		st := pr.where()
		stuckAt.Store(&st)
		cancel()
	})
	defer timer.Stop()
	md := []string{selfProbeTokenKey, p.token, canarylabel.MetadataKey, "1"}
	if p.apiKey != "" {
		md = append(md, "authorization", "Bearer "+p.apiKey)
	}
	pctx = metadata.AppendToOutgoingContext(pctx, md...)
	err := p.send(pctx, id)
	if ctx.Err() != nil || p.draining() {
		return // the router is stopping
	}
	res := probeResult{at: time.Now(), id: id, err: err}
	result := "pass"
	if err != nil {
		timedOut := false
		res.stage = pr.failedAt()
		if st := stuckAt.Load(); st != nil {
			timedOut, res.stage = true, *st
			res.err = status.Errorf(codes.DeadlineExceeded, "no answer within %v", p.flags.timeout)
		}
		switch code := status.Code(err); {
		case !timedOut && (code == codes.ResourceExhausted || code == codes.Unavailable && res.stage != stageTransport):
			// Refused for load, or no pair to run on: the router answered;
			// the limiter and the workers' checks speak for those.
			result = "busy"
		case !timedOut && code == codes.InvalidArgument && res.stage == stagePrepare:
			// The router's own limits refuse even the smallest probe
			// (selfProbeRequest): a configuration error, which no
			// restart or rotation fixes; it is logged, not a wedge.
			result = "config"
		case workerStage(res.stage):
			result = "worker"
		default:
			result, res.router = "fail", true
		}
	}
	p.results.WithLabelValues(result).Inc()
	p.record(res, result)
}

// send runs the probe request through the router's RouterService.Generate
// and checks that it came back whole.
func (p *selfProber) send(ctx context.Context, id string) error {
	greedy, seed := float32(0), uint64(0)
	// WaitForReady: the first probe may go out before the port serves.
	stream, err := batonv1.NewRouterServiceClient(p.conn).Generate(ctx, &batonv1.GenerateRequest{
		RequestId: id, Prompt: p.req.prompt, PromptTokenIds: p.req.promptIDs,
		Sampling: &batonv1.SamplingParams{Temperature: &greedy, Seed: &seed, MaxNewTokens: p.req.maxNew, IgnoreEos: true},
	}, grpc.WaitForReady(true))
	if err != nil {
		return err
	}
	tokens, finished := 0, false
	for {
		resp, err := stream.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
		ev := resp.GetEvent()
		tokens += len(ev.GetTokenIds())
		if ev.GetFinishReason() != batonv1.FinishReason_FINISH_REASON_UNSPECIFIED {
			finished = true
		}
	}
	if !finished || tokens == 0 {
		return status.Errorf(codes.Internal, "came back unfinished or without a token (%d tokens, finished=%v)", tokens, finished)
	}
	return nil
}

// record keeps res as the last outcome, logging changes of state once and
// probes that failed on their workers (a refusal for load or for want of a
// pair is the limiter's and the fleet's to report).
func (p *selfProber) record(res probeResult, result string) {
	p.mu.Lock()
	p.last = res
	was := p.failing
	p.failing = res.router
	firstMisconfig := result == "config" && !p.misconfig
	p.misconfig = p.misconfig || result == "config"
	p.mu.Unlock()
	switch {
	case firstMisconfig:
		p.logger.Error("self-probe: the router's configuration refuses its own probe request; the request path goes unwatched (check --max-prompt-tokens, --max-new-tokens-limit, --context-length)",
			"request_id", res.id, "err", res.err)
	case res.router && !was:
		p.logger.Error("self-probe: the router's request path is stuck", "request_id", res.id, "stage", res.stage, "err", res.err)
	case !res.router && was:
		p.logger.Info("self-probe: the router's request path serves again", "request_id", res.id)
	case result == "worker":
		p.logger.Warn("self-probe failed outside the router", "request_id", res.id, "stage", res.stage, "err", res.err)
	}
}

// problem is why the self-probe says the router cannot serve ("" when it
// can): the last probe failed in a router stage, or the probe in flight
// has been stuck in one past its deadline (its own timeout did not end it).
func (p *selfProber) problem(now time.Time) string {
	if p == nil {
		return ""
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, pr := range p.inflight {
		if age := now.Sub(pr.start); age > p.flags.timeout+time.Second {
			if st := pr.where(); !workerStage(st) {
				return fmt.Sprintf("stuck at %s: self-probe %s still in the router after %v (--self-probe-timeout %v)",
					st, pr.id, age.Round(100*time.Millisecond), p.flags.timeout)
			}
		}
	}
	if !p.last.router {
		return ""
	}
	what := "failed: " + status.Convert(p.last.err).Message()
	if status.Code(p.last.err) == codes.DeadlineExceeded {
		what = fmt.Sprintf("got no answer within %v (--self-probe-timeout)", p.flags.timeout)
	}
	return fmt.Sprintf("stuck at %s: self-probe %s %s (%v ago)", p.last.stage, p.last.id, what,
		now.Sub(p.last.at).Round(100*time.Millisecond))
}

// lookup returns the probe in flight that in is, or nil for any other
// request: its id is one this router sent and its metadata carries the
// process's token. Safe on a nil prober (self-probe off).
func (p *selfProber) lookup(ctx context.Context, in *batonv1.GenerateRequest) *probeRun {
	if p == nil || in == nil || len(in.GetRequestId()) <= len(selfProbeIDPrefix) || in.GetRequestId()[:len(selfProbeIDPrefix)] != selfProbeIDPrefix {
		return nil
	}
	md, _ := metadata.FromIncomingContext(ctx)
	ok := false
	for _, v := range md.Get(selfProbeTokenKey) {
		if subtle.ConstantTimeCompare([]byte(v), []byte(p.token)) == 1 {
			ok = true
		}
	}
	if !ok {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.inflight[in.GetRequestId()]
}

// prepareRun is prepare for a request that may be a self-probe: a probe's
// canary id, which prepare refuses from clients, is kept as it is.
func (s *Service) prepareRun(in *batonv1.GenerateRequest, probe *probeRun) (*batonv1.GenerateRequest, error) {
	if probe == nil {
		return s.prepare(in)
	}
	in = proto.Clone(in).(*batonv1.GenerateRequest)
	in.RequestId = ""
	req, err := s.prepare(in)
	if err != nil {
		return nil, err
	}
	req.RequestId = probe.id
	return req, nil
}

// watchSelf installs the request-path readiness check and, with
// --debug-hooks, the wedge hook, and starts the self-probe unless
// --self-probe-interval is 0. Register calls it once the gateway's
// connection to the router's own gRPC port exists: the probe shares it.
func (s *Service) watchSelf(srv *svckit.Server) {
	if s.debugHooks {
		s.wedge = newWedge()
		s.registerWedgeHook(srv.Admin) // the loopback admin listener, never the public port
		if !srv.Config.AdminEnabled() {
			s.logger.Warn("--debug-hooks without an admin listener (--admin-addr off): the wedge hook cannot be reached")
		}
	}
	srv.AddReadinessCheck("request-path", s.checkRequestPath)
	if s.probeFlags.interval <= 0 {
		return
	}
	apiKey := ""
	if s.keys != nil {
		apiKey = s.selfProbeToken
	}
	s.selfProbe = newSelfProber(s.gwConn, s.selfProbeRequest(), s.selfProbeToken, apiKey, s.probeFlags, s.Draining, s.logger, srv.Registry)
	ctx, stop := context.WithCancel(context.Background())
	s.stopProbe = stop
	s.probing.Go(func() { s.selfProbe.run(ctx) })
}

// stopSelf stops the self-probe and waits for it.
func (s *Service) stopSelf() {
	if s.stopProbe != nil {
		s.stopProbe()
		s.probing.Wait()
	}
}

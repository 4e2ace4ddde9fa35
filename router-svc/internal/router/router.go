// Package router is Baton's router: RouterService over gRPC, its REST form
// through grpc-gateway, the OpenAI-compatible API (package openai), and
// routing of each request to a (prefill, decode) worker pair.
//
// Every API runs a request through Service.run (generate.go): admission
// (limiter, limit.go), validation (prepare, prepare.go), the in-flight entry
// (inflight.go), then pair picking and one retry on another pair; relay
// (relay.go) streams one attempt's events, and a gRPC stream's events reach
// the client through a streamSender (sender.go). The fleet — worker sets,
// canary, reconciliation and readiness — starts in fleet.go; its view is
// /debug/workers (debugworkers.go). Flags are in flags.go; the REST gateway
// in gateway.go; the OpenAI wiring in openai.go.
package router

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/baton-serving/baton/engine/gguf"
	"github.com/baton-serving/baton/engine/model"
	"github.com/baton-serving/baton/engine/tokenizer"
	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"github.com/baton-serving/baton/router-svc/internal/canary"
	"github.com/baton-serving/baton/router-svc/internal/openai"
	"github.com/baton-serving/baton/router-svc/internal/reconcile"
	"github.com/baton-serving/baton/router-svc/internal/workers"
	"github.com/baton-serving/baton/svckit"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Service is the router.
type Service struct {
	batonv1.UnimplementedRouterServiceServer
	svckit.ModelBase

	// Flags.
	prefill, decode              string
	prefillPolicyName, decPolicy string
	maxNewTokens                 int
	contextLength                int
	loadInterval                 time.Duration
	limits                       limitFlags
	fleet                        fleetFlags
	probeFlags                   selfProbeFlags
	debugHooks                   bool

	// Set by Validate and Open.
	prefillSrc, decodeSrc       workers.Source // prefillSrc nil in colocated mode
	prefillPolicy, decodePolicy *workers.Policy
	tok                         *tokenizer.Tokenizer
	cfg                         model.Config
	fingerprint                 string
	modelID                     string
	limit                       *limiter
	clientCap                   *clientCap   // --max-inflight-per-client (clientcap.go)
	keys                        *openai.Keys // nil: authentication off
	chatTemplate                *openai.ChatTemplate
	maxTokenBytes               int // openai.MaxTokenBytes of tok: the byte bound on prompts

	// Set by Register.
	logger     *slog.Logger
	Draining   func() bool
	prefills   *workers.Set // nil in colocated mode
	decodes    *workers.Set
	pairer     *workers.Pairer
	canary     *canary.Tracker // nil: canary off
	prober     *canary.Prober  // nil: canary off
	reconciler *reconcile.Reconciler
	inflight   *inflight
	metrics    *metrics
	gwConn     *grpc.ClientConn
	stopWatch  context.CancelFunc
	watching   sync.WaitGroup

	// The router watching itself (selfprobe.go, routerhealth.go, wedge.go).
	selfProbeToken string      // the self-probe's secret, made by New
	path           *pathHealth // completions, for the request-path check
	selfProbe      *selfProber // nil: self-probe off
	wedge          *wedge      // nil unless --debug-hooks
	stopProbe      context.CancelFunc
	probing        sync.WaitGroup
}

// New returns an unconfigured router; svckit.Main configures and runs it.
func New() *Service {
	return &Service{inflight: newInflight(), Draining: func() bool { return false },
		selfProbeToken: newSelfProbeToken(), path: newPathHealth()}
}

// AddFlags registers the router's flags.
func (s *Service) AddFlags(fs *flag.FlagSet) {
	s.ModelBase.AddFlags(fs)
	fs.StringVar(&s.prefill, "prefill", "127.0.0.1:8082", `prefill workers: a comma-separated host:port list, dns:///NAME:PORT for every A/AAAA record of NAME (a headless Service; re-resolved every --resolve-interval), or "local" to have decode workers compute prompts themselves (colocated mode)`)
	fs.StringVar(&s.decode, "decode", "127.0.0.1:8084", "decode workers: a comma-separated host:port list, or dns:///NAME:PORT for every A/AAAA record of NAME (re-resolved every --resolve-interval)")
	policies := strings.Join(workers.PolicyNames, ", ")
	fs.StringVar(&s.prefillPolicyName, "prefill-policy", "least-load", "how to choose a prefill worker: "+policies)
	fs.StringVar(&s.decPolicy, "decode-policy", "least-load", "how to choose a decode worker: "+policies)
	fs.IntVar(&s.maxNewTokens, "max-new-tokens", 256, "tokens generated when a request does not say (capped by the context window)")
	fs.IntVar(&s.contextLength, "context-length", 0, "context window in tokens (0: the model's own); must match the workers'")
	fs.DurationVar(&s.loadInterval, "load-interval", time.Second, "how often workers report their load")
	s.limits.addFlags(fs)
	s.fleet.addFlags(fs)
	s.probeFlags.addFlags(fs)
	fs.BoolVar(&s.debugHooks, "debug-hooks", false, "serve test hooks on the admin listener (--admin-addr; POST /debug/wedge holds requests in the router's request path): for chaos tests only, never in production")
}

// Validate checks the router's flags.
func (s *Service) Validate() error {
	var err error
	if err := s.fleet.validate(); err != nil {
		return err
	}
	if err := s.probeFlags.validate(); err != nil {
		return err
	}
	if strings.TrimSpace(s.prefill) != localPrefill {
		if s.prefillSrc, err = workers.ParseTarget(s.prefill, s.fleet.dnsServer); err != nil {
			return fmt.Errorf("--prefill: %w", err)
		}
	}
	if s.decodeSrc, err = workers.ParseTarget(s.decode, s.fleet.dnsServer); err != nil {
		return fmt.Errorf("--decode: %w", err)
	}
	if s.prefillPolicy, err = workers.NewPolicy(s.prefillPolicyName); err != nil {
		return fmt.Errorf("--prefill-policy: %w", err)
	}
	if s.decodePolicy, err = workers.NewPolicy(s.decPolicy); err != nil {
		return fmt.Errorf("--decode-policy: %w", err)
	}
	switch {
	case s.maxNewTokens < 1:
		return fmt.Errorf("--max-new-tokens: %d, want ≥ 1", s.maxNewTokens)
	case s.contextLength < 0:
		return fmt.Errorf("--context-length: %d, want ≥ 0", s.contextLength)
	case s.loadInterval < 50*time.Millisecond:
		return fmt.Errorf("--load-interval: %v, want ≥ 50ms", s.loadInterval)
	}
	if err := s.limits.validate(s.maxNewTokens); err != nil {
		return err
	}
	s.limit, s.clientCap = newLimiter(s.limits.maxConcurrent), newClientCap(s.limits.maxPerClient)
	return nil
}

// Open resolves the model and reads its tokenizer and hyper-parameters; the
// router never loads the weights.
func (s *Service) Open(ctx context.Context, d *svckit.Deps) error {
	if err := s.ModelBase.Open(ctx, d); err != nil {
		return err
	}
	f, err := gguf.Open(s.Model.Path)
	if err != nil {
		return fmt.Errorf("--model %s: %w", s.Model.Path, err)
	}
	defer f.Close()
	if s.tok, err = tokenizer.FromGGUF(f); err != nil {
		return fmt.Errorf("--model %s: %w", s.Model.Path, err)
	}
	if s.cfg, s.fingerprint, err = model.Inspect(f, s.contextLength); err != nil {
		return fmt.Errorf("--model %s: %w", s.Model.Path, err)
	}
	s.modelID = svckit.ModelID(s.Model.Path)
	s.maxTokenBytes = openai.MaxTokenBytes(s.tok)
	return s.openAPI(d.Logger)
}

// Register installs RouterService, its REST gateway, the OpenAPI document and
// the OpenAI-compatible API, and starts discovering and watching the workers
// and, unless --canary-interval is 0, probing their pairs.
func (s *Service) Register(srv *svckit.Server) error {
	s.logger = srv.Logger
	s.Draining = srv.Draining
	srv.OnDrain(s.drain) // drain.go: no stream ends silently at shutdown
	s.metrics = newMetrics(srv.Registry, s.inflight)
	if err := s.startFleet(srv); err != nil {
		return err
	}
	srv.Logger.Info("workers", "prefill", s.prefill, "decode", s.decode, "model", s.modelID, "fingerprint", s.fingerprint,
		"prefill_policy", s.prefillPolicyName, "decode_policy", s.decPolicy, "canary_interval", s.fleet.canaryInterval.String())

	// With --api-keys-file, RouterService (and so the REST gateway, which
	// forwards the Authorization header) requires a key; health and
	// reflection stay open.
	srv.GRPC.RegisterService(s.keys.Guard(&batonv1.RouterService_ServiceDesc), s)
	srv.HandleDebugRequests(s.inflight.list)
	srv.Admin.HandleFunc("GET /debug/workers", s.serveDebugWorkers)
	srv.WrapMux = s.limits.cors.Middleware // --cors-allowed-origins (openai/cors.go); public listener only
	if err := s.registerGateway(srv); err != nil {
		return err
	}
	s.watchSelf(srv) // through the gateway's connection to the router's own port
	return s.registerOpenAI(srv)
}

// Close stops the canary and the workers' watches and closes every
// connection.
func (s *Service) Close() error {
	s.stopSelf()
	if s.stopWatch != nil {
		s.stopWatch()
		s.watching.Wait() // the sets' Run close their connections
	}
	if s.gwConn != nil {
		return s.gwConn.Close()
	}
	return nil
}

// ListModels lists the served model.
func (s *Service) ListModels(context.Context, *batonv1.ListModelsRequest) (*batonv1.ListModelsResponse, error) {
	mi := s.ModelInfo()
	mi.Fingerprint, mi.Architecture = s.fingerprint, s.cfg.Architecture
	mi.ContextLength, mi.VocabSize = uint32(s.cfg.ContextLength), uint32(s.cfg.Vocab)
	return &batonv1.ListModelsResponse{Object: "list", Data: []*batonv1.ModelInfo{mi}}, nil
}

// ListRequests lists the router's in-flight requests, oldest first. With
// API keys on, a caller sees only the requests its own key made.
func (s *Service) ListRequests(ctx context.Context, _ *batonv1.ListRequestsRequest) (*batonv1.ListRequestsResponse, error) {
	return &batonv1.ListRequestsResponse{Requests: s.inflight.listFor(ctx)}, nil
}

// Abort cancels an in-flight request; cancelling its decode call aborts it on
// every worker. With API keys on, only the key that made the request may
// abort it: to any other the request does not exist (NOT_FOUND), so other
// clients' ids can be neither aborted nor probed.
func (s *Service) Abort(ctx context.Context, req *batonv1.AbortRequest) (*batonv1.AbortResponse, error) {
	r := s.inflight.get(req.GetRequestId())
	if caller, ok := openai.CallerKey(ctx); r != nil && r.keyed && (!ok || caller != r.owner) {
		r = nil
	}
	if r == nil {
		return nil, status.Errorf(codes.NotFound, "request_id %q: no such in-flight request", req.GetRequestId())
	}
	st := batonv1.RequestState(r.state.Load())
	s.logger.InfoContext(ctx, "abort", "request_id", r.id, "reason", req.GetReason(), "state", st.String())
	r.cancel(fmt.Errorf("%w: %s", errAborted, req.GetReason()))
	return &batonv1.AbortResponse{State: st}, nil
}

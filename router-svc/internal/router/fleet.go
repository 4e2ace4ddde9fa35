package router

// The router's fleet: discovery and watching of the workers (package
// workers), the canary through each (prefill, decode) pair (package
// canary) and reconciliation of in-flight requests with the workers
// (package reconcile). Their view at /debug/workers is debugworkers.go's.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/baton-serving/baton/engine/tokenizer"
	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"github.com/baton-serving/baton/router-svc/internal/canary"
	"github.com/baton-serving/baton/router-svc/internal/reconcile"
	"github.com/baton-serving/baton/router-svc/internal/workers"
	"github.com/baton-serving/baton/svckit"
	"github.com/baton-serving/baton/svckit/apiconv"
	"github.com/baton-serving/baton/svckit/tlsconf"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// canaryPrompt is the canary's prompt: a few tokens, so that at least one
// KV page moves from prefill to decode.
const canaryPrompt = "Once upon a time"

// startFleet creates the worker sets, the pairer and the canary, and starts
// their goroutines; Close stops them.
func (s *Service) startFleet(srv *svckit.Server) error {
	expect := workers.Identity{Fingerprint: s.fingerprint, Layers: s.cfg.Layers, KVHeads: s.cfg.KVHeads, HeadDim: s.cfg.HeadDim}
	newSet := func(role batonv1.WorkerRole, src workers.Source) *workers.Set {
		// With --tls-*, each set's workers must present a certificate of
		// the set's role.
		creds := grpc.WithTransportCredentials(insecure.NewCredentials())
		if srv.TLS != nil {
			creds = srv.TLS.DialOption(map[batonv1.WorkerRole]tlsconf.Role{
				batonv1.WorkerRole_WORKER_ROLE_PREFILL: tlsconf.Prefill, batonv1.WorkerRole_WORKER_ROLE_DECODE: tlsconf.Decode}[role])
		}
		// Keepalive: a worker gone half-open fails its streams (and the
		// router's retry or error path runs) instead of hanging them.
		dial := []grpc.DialOption{creds, srv.Tracing.DialOption(), srv.Config.KeepaliveDialOption()}
		return workers.NewSet(workers.Config{Role: role, Source: src, Expect: expect, LoadInterval: s.loadInterval,
			CacheEvents: true, ResolveInterval: s.fleet.resolveInterval, Logger: s.logger, DialOptions: dial})
	}
	if s.prefillSrc != nil {
		s.prefills = newSet(batonv1.WorkerRole_WORKER_ROLE_PREFILL, s.prefillSrc)
	}
	s.decodes = newSet(batonv1.WorkerRole_WORKER_ROLE_DECODE, s.decodeSrc)
	srv.Registry.MustRegister(newCacheIndexCollector(func() []*workers.Set { return []*workers.Set{s.prefills, s.decodes} }))
	s.pairer = &workers.Pairer{Prefill: s.prefills, Decode: s.decodes,
		PrefillPolicy: s.prefillPolicy, DecodePolicy: s.decodePolicy, MaxInflight: s.fleet.maxInflight}

	if s.fleet.canaryInterval > 0 {
		var err error
		if s.prober, err = canary.NewProber(canary.ProberOptions{
			Conn:   s.decodeConn,
			Prompt: apiconv.WireIDs(s.tok.Encode(canaryPrompt, tokenizer.EncodeOptions{AddSpecial: true})),
			Tracer: srv.Tracing.TracerProvider(),
		}); err != nil {
			return err
		}
		if s.canary, err = canary.New(canary.Options{Probe: s.prober.Probe, Interval: s.fleet.canaryInterval,
			Timeout: s.fleet.canaryTimeout, Progress: s.workerProgress, Logger: s.logger, Registry: srv.Registry}); err != nil {
			return err
		}
		s.pairer.Gate = canaryGate{s.canary}
	}
	rec, err := reconcile.New(reconcile.Options{Router: s.reconcileEntries, Workers: s.reconcileWorkers,
		Logger: s.logger, Registry: srv.Registry})
	if err != nil {
		return err
	}
	s.reconciler = rec

	ctx, stop := context.WithCancel(context.Background())
	s.stopWatch = stop
	for _, set := range []*workers.Set{s.prefills, s.decodes} {
		if set != nil {
			s.watching.Go(func() { set.Run(ctx) })
		}
	}
	if s.canary != nil {
		s.watching.Go(func() { s.canary.Run(ctx, s.canaryPairs) })
	}
	s.watching.Go(func() { s.reconciler.Run(ctx) })

	srv.AddReadinessCheck("workers", func(context.Context) error {
		if s.prefills != nil && len(s.prefills.Ready()) == 0 {
			return fmt.Errorf("no ready prefill worker (%s)", workers.Describe(s.prefills))
		}
		if len(s.decodes.Ready()) == 0 {
			return fmt.Errorf("no ready decode worker (%s)", workers.Describe(s.decodes))
		}
		return nil
	})
	if s.canary != nil {
		srv.AddReadinessCheck("canary", s.canary.Check)
	}
	return nil
}

// decodeConn is the connection to the decode worker at addr, for canaries.
func (s *Service) decodeConn(addr string) (grpc.ClientConnInterface, error) {
	for _, w := range s.decodes.Workers() {
		if w.Addr == addr {
			return w.Conn(), nil
		}
	}
	return nil, errors.New("no longer a decode worker of this router")
}

// canaryPairs is every pair the router could route to now: ready workers
// whose KV layouts agree. A pair whose probe fails stays in the list (and so
// quarantined) while its workers report ready.
func (s *Service) canaryPairs() []canary.Pair {
	decodes := s.decodes.Ready()
	if s.prefills == nil {
		out := make([]canary.Pair, len(decodes))
		for i, d := range decodes {
			out[i] = canary.Pair{Decode: d.Addr}
		}
		return out
	}
	prefills := s.prefills.Ready()
	out := make([]canary.Pair, 0, len(prefills)*len(decodes))
	for _, d := range decodes {
		for _, p := range prefills {
			if workers.LayoutCompatible(p.Info(), d.Info()) {
				out = append(out, canary.Pair{Prefill: p.Addr, Decode: d.Addr})
			}
		}
	}
	return out
}

// reconcileEntries lists the router's in-flight requests, canaries
// included, for reconciliation with the workers' lists.
func (s *Service) reconcileEntries() []reconcile.Entry {
	out := s.inflight.entries()
	if s.prober != nil {
		for _, c := range s.prober.InFlight() {
			out = append(out, reconcile.Entry{ID: c.ID, Prefill: c.Pair.Prefill, Decode: c.Pair.Decode})
		}
	}
	return out
}

// reconcileWorkers lists every worker, those draining included.
func (s *Service) reconcileWorkers() []reconcile.Worker {
	var out []reconcile.Worker
	for _, set := range []*workers.Set{s.prefills, s.decodes} {
		if set == nil {
			continue
		}
		for _, w := range append(slices.Clone(set.Workers()), set.Draining()...) {
			out = append(out, reconcile.Worker{Addr: w.Addr, Role: w.Role, Conn: w.Conn()})
		}
	}
	return out
}

// canaryGate lets the pairer ask the tracker about a pair.
type canaryGate struct{ t *canary.Tracker }

func (g canaryGate) Allowed(prefill, decode string) bool {
	return g.t.Allowed(canary.Pair{Prefill: prefill, Decode: decode})
}

// workerProgress is the forward-step progress the worker at addr last
// reported, for the canary to tell an overloaded pair from a stuck one. A
// step in progress has run on since the report by the report's age.
func (s *Service) workerProgress(addr string) (canary.Progress, bool) {
	for _, set := range []*workers.Set{s.prefills, s.decodes} {
		if set == nil {
			continue
		}
		for _, w := range set.Workers() {
			if w.Addr != addr {
				continue
			}
			l := w.Load()
			if l == nil {
				return canary.Progress{}, false
			}
			p := canary.Progress{Steps: l.GetSteps(), StepExpected: seconds(l.GetStepExpectedSeconds())}
			if run := l.GetStepRunningSeconds(); run > 0 {
				p.StepRunning = seconds(run) + w.LoadAge(time.Now())
			}
			return p, true
		}
	}
	return canary.Progress{}, false
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

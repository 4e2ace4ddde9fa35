// Package canary proves, continuously, that each (prefill, decode) pair the
// router routes to can serve: every interval it sends one tiny real request
// through the pair — decode reserves pages, pulls the prompt's KV cache from
// prefill over a real TransferKV stream and returns two tokens (the second
// from decode's own forward step) — and routes around (quarantines) a pair
// whose probe fails or does not finish within its deadline, until a probe
// passes again. A worker can be up, report ready and
// still make no progress; only a request through the real path shows it.
//
// # Labels
//
// Canary requests are labelled so that nobody mistakes them for user
// traffic: their ids start with IDPrefix ("canary-"), every call carries the
// gRPC metadata MetadataKey: "1" ("baton-canary"), and their spans have
// AttrCanary (baton.canary=true). Workers count them in
// baton_canary_requests_total and leave them out of user statistics
// (svckit/canarylabel). The router must refuse client request ids that start
// with IDPrefix (ReservedID), or a client could hide its requests from the
// workers' statistics.
//
// # Wiring (router)
//
//	prober, err := canary.NewProber(canary.ProberOptions{
//		Conn:   func(addr string) (grpc.ClientConnInterface, error) { ... the decode worker's conn ... },
//		Prompt: apiconv.WireIDs(tok.Encode("Once upon a time", tokenizer.EncodeOptions{AddSpecial: true})),
//		Tracer: srv.Tracing.TracerProvider(),
//	})
//	tracker, err := canary.New(canary.Options{
//		Interval: flagCanaryInterval, // --canary-interval, default 15s
//		Timeout:  flagCanaryTimeout,  // default 5s
//		Probe:    prober.Probe,
//		Progress: func(addr string) (canary.Progress, bool) { ... the worker's last reported steps and step in progress ... },
//		Logger:   srv.Logger,
//		Registry: srv.Registry,
//	})
//	go tracker.Run(ctx, func() []canary.Pair { ... every (ready prefill, ready decode) pair ... })
//	srv.AddReadinessCheck("canary", tracker.Check) // ready once ≥ 1 pair passes
//	// when picking: only pairs with tracker.Allowed(pair)
//	// /debug/workers: tracker.Snapshot()
//
// In colocated mode a pair's Prefill is "" and the probe asks decode to
// compute the prompt itself.
//
// # States
//
// A pair returned by the pairs function is pending until its first probe
// ends, then passing or quarantined after each probe: a probe that returns
// an error or outlives Options.Timeout quarantines the pair at once, a
// passing probe lifts the quarantine. A late probe while the worker it
// waits on keeps computing (Options.Progress) is busy — overloaded, not
// stuck — and leaves the pair's state as it was. Which worker that is
// depends on the probe's Stage (SetStage): decode at admission and for the
// last token (decode's own step), prefill or decode for the first token
// (prefill's compute, the KV transfer, decode's page reservation). A worker
// computes when its step count moves, or when its step in progress is long
// but within 4× its expected time at its measured speed (one step of a big
// prompt moves no count for seconds). A worker the stage waits on whose
// step in progress is far past that (a frozen loop) makes the probe a
// timeout whatever its peer does. Allowed is true only for passing
// pairs: a pair nobody has seen serve is not routed to. Run probes a new
// pair as soon as it sees it, so this costs a new pair one probe's latency
// (and the router's readiness at start-up waits for the first probes, not a
// whole interval). Passing pairs are probed every Interval, quarantined ones
// every QuarantineInterval. A pair that the pairs function stops returning
// is forgotten after Interval (a worker that leaves and returns within it
// keeps its state). Each change of state is logged once, with its reason.
//
// # Metrics
//
// baton_canary_probes_total{result} (pass, fail, timeout, busy),
// baton_canary_probe_seconds{result}, baton_canary_quarantined_pairs and
// baton_canary_passing_pairs.
package canary

package enginehost

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/baton-serving/baton/engine/gguf"
	"github.com/baton-serving/baton/engine/kvcache"
	"github.com/baton-serving/baton/engine/model"
	"github.com/baton-serving/baton/engine/sched"
	"github.com/baton-serving/baton/engine/tokenizer"
	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"github.com/baton-serving/baton/kernels"
	"github.com/baton-serving/baton/kvtransfer"
	"github.com/baton-serving/baton/svckit"
	"github.com/baton-serving/baton/tracing"
	"github.com/prometheus/client_golang/prometheus"
)

// Host is a loaded model with its page pool and scheduler.
type Host struct {
	Role        batonv1.WorkerRole
	File        *gguf.File
	Model       model.Model
	Tokenizer   *tokenizer.Tokenizer
	Pool        *kvcache.Pool
	Sched       *sched.Scheduler
	Config      model.Config
	Layout      kernels.KVLayout // the pool's pages, as they cross a KV transfer
	Fingerprint string
	ModelInfo   *batonv1.ModelInfo
	Metrics     *Metrics

	flags  Flags
	trace  traceState
	logger *slog.Logger
	ready  func(context.Context) map[string]string
	freeze *freezer // the freeze hook; nil unless --debug-hooks
}

// Open loads the model at path and starts the scheduler. Metrics are
// registered on reg.
func Open(path string, f Flags, role batonv1.WorkerRole, logger *slog.Logger, reg *prometheus.Registry) (_ *Host, err error) {
	h := &Host{Role: role, flags: f, logger: logger}
	defer func() {
		if err != nil {
			h.Close()
		}
	}()
	start := time.Now()
	if h.File, err = gguf.Open(path); err != nil {
		return nil, fmt.Errorf("--model %s: %w", path, err)
	}
	if h.Tokenizer, err = tokenizer.FromGGUF(h.File); err != nil {
		return nil, fmt.Errorf("--model %s: %w", path, err)
	}
	if h.Model, err = model.Load(h.File, model.Options{Threads: f.Threads, ContextLength: f.ContextLength}); err != nil {
		return nil, fmt.Errorf("--model %s: %w", path, err)
	}
	h.Config, h.Fingerprint = h.Model.Config(), h.Model.Fingerprint()
	dtype, err := f.dtype()
	if err != nil {
		return nil, err
	}
	layout := h.Config.KVLayout(f.PageSize, dtype)
	if h.Pool, err = kvcache.NewForBudget(layout, int64(f.KVCacheBytes), h.Config.ContextLength); err != nil {
		return nil, fmt.Errorf("--kv-cache-bytes: %w", err)
	}
	h.Layout = layout
	h.Metrics = newMetrics(reg, role)
	h.registerProgressMetrics(reg)
	stepModel := h.Model
	if f.DebugHooks {
		h.freeze = newFreezer(logger)
		stepModel = freezableModel{h.Model, h.freeze}
	}
	if h.Sched, err = sched.New(sched.Config{
		Model: stepModel, Pool: h.Pool, Tokenizer: h.Tokenizer,
		MaxBatchTokens: f.MaxBatchTokens, MaxSeqs: f.MaxSeqs, MaxRequests: f.MaxRequests,
		Observer: stepObserver{h.Metrics, &h.trace.steps},
	}); err != nil {
		return nil, err
	}
	h.ModelInfo = &batonv1.ModelInfo{
		Id: svckit.ModelID(path), Object: "model", Created: time.Now().Unix(), OwnedBy: "baton",
		Fingerprint: h.Fingerprint, Architecture: h.Config.Architecture,
		ContextLength: uint32(h.Config.ContextLength), VocabSize: uint32(h.Config.Vocab),
	}
	logger.Info("engine ready", "model", h.ModelInfo.Id, "fingerprint", h.Fingerprint,
		"kv_pages", h.Pool.Stats().Total, "kv_layout", layout.String(), "load_time", time.Since(start).Round(time.Millisecond).String())
	return h, nil
}

// Close stops the scheduler (aborting what is left) and unloads the model.
func (h *Host) Close() error {
	var errs []error
	h.freeze.close() // a frozen step would hold Close forever
	if h.Sched != nil {
		errs = append(errs, h.Sched.Close())
	}
	if h.Model != nil {
		errs = append(errs, h.Model.Close())
	}
	if h.File != nil {
		errs = append(errs, h.File.Close())
	}
	return errors.Join(errs...)
}

// Attach wires the host into its server: load reports use the server's
// readiness, readiness includes the progress watchdog, /debug/requests lists
// the scheduler's requests, and shutdown stops the scheduler after drain.
func (h *Host) Attach(srv *svckit.Server) {
	h.ready = srv.Ready
	srv.AddReadinessCheck("scheduler", h.Progress)
	srv.HandleDebugRequests(h.Requests)
	if h.freeze != nil {
		h.registerDebugHooks(srv)
	}
}

// Info describes the worker (WorkerService).
func (h *Host) Info() *batonv1.InfoResponse {
	v, _ := tracing.BuildVersion()
	return &batonv1.InfoResponse{
		Role: h.Role, Model: h.ModelInfo, KvLayout: kvtransfer.LayoutProto(h.Layout), Version: v,
		Capacity: &batonv1.Capacity{
			TotalPages: uint32(h.Pool.Stats().Total), MaxBatchTokens: uint32(h.flags.MaxBatchTokens),
			MaxRunningRequests: uint32(h.flags.MaxSeqs), MaxSequenceTokens: uint32(h.Config.ContextLength),
		},
	}
}

// Load reports the worker's load (WorkerService).
func (h *Host) Load(ctx context.Context) *batonv1.LoadReport {
	snap := h.Sched.Snapshot()
	g := snap.Gauges
	lr := &batonv1.LoadReport{
		Ready:                h.ready == nil || len(h.ready(ctx)) == 0,
		QueuedRequests:       uint32(g.Waiting + g.Prealloc),
		RunningRequests:      uint32(g.Running + g.Prefilling),
		TransferringRequests: uint32(g.Transferring + g.HandingOver),
		PagesUsed:            uint32(g.PagesUsed),
		PagesTotal:           uint32(g.PagesTotal),
		TokensPerSecond:      g.GenThroughput,
		Steps:                snap.Steps,
	}
	for _, r := range snap.Requests {
		lr.OldestRequestAgeSeconds = max(lr.OldestRequestAgeSeconds, r.Age.Seconds())
	}
	return lr
}

// Requests lists the scheduler's requests, oldest first (WorkerService).
func (h *Host) Requests() []*batonv1.RequestInfo {
	snap := h.Sched.Snapshot()
	out := make([]*batonv1.RequestInfo, 0, len(snap.Requests))
	for _, r := range snap.Requests {
		out = append(out, &batonv1.RequestInfo{
			RequestId: r.ID, State: wireState(r.Mode, r.State), AgeSeconds: r.Age.Seconds(),
			SinceProgressSeconds: r.SinceProgress.Seconds(), PagesHeld: uint32(r.Pages),
			PromptTokens: uint32(r.PromptTokens), GeneratedTokens: uint32(r.Generated), TraceId: h.traceID(r.ID),
		})
	}
	return out
}

// wireState maps the scheduler's states to the API's.
func wireState(m sched.Mode, s sched.State) batonv1.RequestState {
	switch s {
	case sched.StateWaiting:
		if m == sched.ModeDecodeImported {
			return batonv1.RequestState_REQUEST_STATE_PREALLOC
		}
		return batonv1.RequestState_REQUEST_STATE_PREFILL_QUEUED
	case sched.StatePrefilling:
		return batonv1.RequestState_REQUEST_STATE_PREFILLING
	case sched.StateRunning:
		return batonv1.RequestState_REQUEST_STATE_RUNNING
	case sched.StateTransferring, sched.StateHandingOver:
		return batonv1.RequestState_REQUEST_STATE_TRANSFERRING
	case sched.StateFinished:
		return batonv1.RequestState_REQUEST_STATE_FINISHING
	}
	return batonv1.RequestState_REQUEST_STATE_UNSPECIFIED
}

// Drain waits until the scheduler holds no request, for the in-flight work
// of a stopping worker (new RPCs are already refused). When ctx ends first,
// it closes the scheduler, which ends every remaining request with a clear
// status (UNAVAILABLE at the caller) and releases its pages.
func (h *Host) Drain(ctx context.Context) {
	h.freeze.close() // a stopping worker finishes its work
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for n := len(h.Sched.Snapshot().Requests); n > 0; n = len(h.Sched.Snapshot().Requests) {
		select {
		case <-ctx.Done():
			h.logger.Warn("drain timed out; aborting the remaining requests", "requests", n)
			_ = h.Sched.Close()
			return
		case <-t.C:
		}
	}
}

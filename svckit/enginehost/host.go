package enginehost

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync/atomic"
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
	"github.com/baton-serving/baton/svckit/device"
	"github.com/baton-serving/baton/svckit/workerapi"
	"github.com/baton-serving/baton/tracing"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// Host is a loaded model with its page pool and scheduler.
type Host struct {
	Role      batonv1.WorkerRole
	File      *gguf.File
	Model     model.Model
	Tokenizer *tokenizer.Tokenizer
	Pool      *kvcache.Pool
	Sched     *sched.Scheduler
	Config    model.Config
	Layout    kernels.KVLayout // the pool's pages, as they cross a KV transfer
	// Device is what the model, and the pool's pages, live on (--device).
	// The host owns its backend and closes it last.
	Device      device.Choice
	Fingerprint string
	ModelInfo   *batonv1.ModelInfo
	Metrics     *Metrics

	flags  Flags
	trace  traceState
	logger *slog.Logger
	ready  func(context.Context) map[string]string
	freeze *freezer // the freeze hook; nil unless --debug-hooks
	// watchdog is the progress watchdog's state (watchdog.go).
	watchdog watchdog

	// closeTimeout bounds how long Close waits for the forward step in
	// progress (--shutdown-timeout; defaultCloseTimeout when unset).
	closeTimeout time.Duration
	// abandoned: shutdown gave up on a hung forward step, which still
	// holds the scheduler, the model and the pool.
	abandoned atomic.Bool
}

// defaultCloseTimeout is Close's bound for a host opened without a
// --shutdown-timeout (tests, tools).
const defaultCloseTimeout = 10 * time.Second

// abortGrace is the part of the drain deadline kept for aborting what is
// left: the scheduler releases it at its next step boundary and the RPCs
// answer UNAVAILABLE before the servers stop.
const abortGrace = time.Second

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
	if h.Device, err = device.Open(f.Device, f.Threads); err != nil {
		return nil, svckit.Usage(fmt.Errorf("--device %s: %w", f.Device, err))
	}
	logger.Info("device chosen", "flag", f.Device.String(), "device", h.Device.String(), "reason", h.Device.Reason)
	if h.Model, err = model.Load(h.File, model.Options{Backend: h.Device.Backend, ContextLength: f.ContextLength}); err != nil {
		return nil, fmt.Errorf("--model %s on %s: %w", path, h.Device.Label(), err)
	}
	h.Config, h.Fingerprint = h.Model.Config(), h.Model.Fingerprint()
	dtype, err := f.dtype()
	if err != nil {
		return nil, err
	}
	layout := h.Config.KVLayout(f.PageSize, dtype)
	if err := fitsDevice(h.Device.Backend, int64(f.KVCacheBytes)); err != nil {
		return nil, svckit.Usage(fmt.Errorf("--kv-cache-bytes %d: %w", int64(f.KVCacheBytes), err))
	}
	if h.Pool, err = kvcache.NewForBudgetOn(h.Device.Backend, layout, int64(f.KVCacheBytes), h.Config.ContextLength); err != nil {
		return nil, fmt.Errorf("--kv-cache-bytes: %w", err)
	}
	h.Layout = layout
	h.Metrics = newMetrics(reg, role)
	registerDeviceMetrics(reg, h.Device.Backend)
	h.registerProgressMetrics(reg)
	stepModel := h.Model
	if f.DebugHooks {
		h.freeze = newFreezer(logger)
		stepModel = freezableModel{h.Model, h.freeze}
	}
	// Bounded: a forward pass that hangs fails Open (the pass is abandoned)
	// rather than blocking it, and SIGTERM, for ever.
	if err := h.watchdog.speed.calibrate(context.Background(), h.Model, h.Pool, calibrateTimeout(f.StallTimeout)); err != nil {
		return nil, err
	}
	if f.PrefixCache {
		// After calibration, which must not leave its pages cached.
		if err := h.Pool.EnableCache(h.Fingerprint, int(f.PrefixCacheMaxFraction*float64(h.Pool.Stats().Total))); err != nil {
			return nil, fmt.Errorf("--prefix-cache-max-fraction: %w", err)
		}
	}
	if h.Sched, err = sched.New(sched.Config{
		Model: stepModel, Pool: h.Pool, Tokenizer: h.Tokenizer,
		MaxBatchTokens: f.MaxBatchTokens, MaxSeqs: f.MaxSeqs, MaxRequests: f.MaxRequests,
		Observer: stepObserver{h.Metrics, &h.trace.steps, &h.watchdog.speed},
	}); err != nil {
		return nil, err
	}
	h.ModelInfo = &batonv1.ModelInfo{
		Id: svckit.ModelID(path), Object: "model", Created: time.Now().Unix(), OwnedBy: "baton",
		Fingerprint: h.Fingerprint, Architecture: h.Config.Architecture,
		ContextLength: uint32(h.Config.ContextLength), VocabSize: uint32(h.Config.Vocab),
	}
	logger.Info("engine ready", "model", h.ModelInfo.Id, "fingerprint", h.Fingerprint, "device", h.Device.Label(),
		"kv_pages", h.Pool.Stats().Total, "kv_layout", layout.String(), "load_time", time.Since(start).Round(time.Millisecond).String())
	return h, nil
}

// fitsDevice checks, on a backend with memory of its own (a GPU), that a
// KV budget fits in the device memory the weights left free: the
// allocation would fail anyway, but this error says by how much. The
// check keeps 5% of the device (at least 256 MiB) for activations.
func fitsDevice(b kernels.Backend, budget int64) error {
	r, ok := b.(kernels.MemoryReporter)
	if !ok {
		return nil
	}
	m, err := r.Memory()
	if err != nil {
		return err
	}
	spare := max(m.Total/20, 256<<20)
	if budget > m.Free-spare {
		return fmt.Errorf("does not fit in device memory: %d bytes free after %d of weights (of %d), less %d kept for activations: give at most %d",
			m.Free, m.Weights, m.Total, spare, max(m.Free-spare, 0))
	}
	return nil
}

// Close stops the scheduler (aborting what is left) and unloads the model.
// It waits for the forward step in progress for the close timeout at most
// (not at all when Drain already gave up on it): a hung step is left
// running, with the model and the pool it reads, for the process's exit to
// reclaim, and Close returns an error wrapping sched.ErrStepHung.
func (h *Host) Close() error {
	var errs []error
	h.freeze.close() // a frozen step would hold Close forever
	if h.Sched != nil {
		d := h.closeTimeout
		if d <= 0 {
			d = defaultCloseTimeout
		}
		if h.abandoned.Load() {
			d = 0 // Drain has waited the shutdown timeout already
		}
		ctx, cancel := context.WithTimeout(context.Background(), d)
		err := h.stop(ctx)
		cancel()
		if errors.Is(err, sched.ErrStepHung) {
			return fmt.Errorf("model left loaded: %w", err)
		}
		errs = append(errs, err)
	}
	if h.Model != nil {
		errs = append(errs, h.Model.Close())
	}
	if h.Pool != nil {
		errs = append(errs, h.Pool.Close())
	}
	if h.Device.Backend != nil {
		errs = append(errs, h.Device.Backend.Close())
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
	srv.SetGPUInUse(h.Device.UUID)
	srv.AddReadinessCheck("scheduler", h.Progress)
	srv.HandleDebugRequests(h.Requests)
	srv.Admin.HandleFunc("POST /debug/cache/flush", h.flushCache)
	if h.freeze != nil {
		h.registerDebugHooks(srv)
	}
}

// flushCache serves POST /debug/cache/flush on the admin listener: it
// evicts every prefix cache page that no request holds (for tests and
// operators) and answers {"evicted": N, "cached": M}, M being the cached
// pages live requests still hold.
func (h *Host) flushCache(w http.ResponseWriter, _ *http.Request) {
	n := h.Sched.FlushCache()
	cached := h.Pool.CacheStats().Pages
	h.logger.Info("prefix cache flushed", "evicted_pages", n, "cached_pages_held", cached)
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]int{"evicted": n, "cached": cached})
}

// Info describes the worker (WorkerService).
func (h *Host) Info() *batonv1.InfoResponse {
	v, _ := tracing.BuildVersion()
	return &batonv1.InfoResponse{
		Role: h.Role, Model: h.ModelInfo, KvLayout: kvtransfer.LayoutProto(h.Layout), Version: v, Device: h.Device.String(),
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
	if snap.StepRunning > 0 {
		lr.StepRunningSince = timestamppb.New(snap.At.Add(-snap.StepRunning))
		lr.StepTokens = uint32(snap.StepTokens)
		lr.StepRunningSeconds = snap.StepRunning.Seconds()
		lr.StepExpectedSeconds = h.stepExpected(snap).Seconds()
	}
	for _, r := range snap.Requests {
		lr.OldestRequestAgeSeconds = max(lr.OldestRequestAgeSeconds, r.Age.Seconds())
	}
	return lr
}

// CacheLog is the pool's prefix cache, which the router's WatchLoad may
// follow (WorkerService).
func (h *Host) CacheLog() workerapi.CacheLog { return h.Pool }

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
// of a stopping worker (new RPCs are already refused). Shortly before ctx
// ends (abortGrace, or a quarter of the time left), it closes the
// scheduler, which ends every remaining request with a clear status
// (UNAVAILABLE at the caller) and releases its pages at its next step
// boundary. A step that does not return by ctx's end is abandoned (logged,
// with the requests it holds), so that the worker still stops in time.
func (h *Host) Drain(ctx context.Context) {
	h.freeze.close() // a stopping worker finishes its work
	wait := ctx
	if dl, ok := ctx.Deadline(); ok {
		var cancel context.CancelFunc
		wait, cancel = context.WithDeadline(ctx, dl.Add(-min(abortGrace, time.Until(dl)/4)))
		defer cancel()
	}
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for n := len(h.Sched.Snapshot().Requests); n > 0; n = len(h.Sched.Snapshot().Requests) {
		select {
		case <-wait.Done():
			h.logger.Warn("drain timed out; aborting the remaining requests", "requests", n)
			_ = h.stop(ctx)
			return
		case <-t.C:
		}
	}
}

// stop shuts the scheduler down within ctx. When a forward step outlasts
// ctx it says so once, naming what the step still holds: those requests'
// RPCs have ended on their own deadlines or with the servers, and their
// pages go with the process.
func (h *Host) stop(ctx context.Context) error {
	err := h.Sched.Shutdown(ctx)
	if errors.Is(err, sched.ErrStepHung) && h.abandoned.CompareAndSwap(false, true) {
		snap := h.Sched.Snapshot()
		ids := make([]string, 0, len(snap.Requests))
		for _, r := range snap.Requests {
			ids = append(ids, r.ID)
		}
		h.logger.Error("shutdown: a forward step did not return in time; stopping without it",
			"step_running", snap.StepRunning.Round(time.Millisecond).String(), "requests", ids,
			"pages_used", snap.Pages.Used, "err", err)
	}
	return err
}

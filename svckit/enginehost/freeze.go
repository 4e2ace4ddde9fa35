package enginehost

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/baton-serving/baton/engine/kvcache"
	"github.com/baton-serving/baton/engine/model"
	"github.com/baton-serving/baton/svckit"
)

// The freeze hook lets the chaos suite stall a worker's scheduler the way a
// hung kernel or a deadlocked step would: the forward pass in progress
// blocks, so no step completes while work waits, and the progress watchdog
// has to notice. A hang (hang=true) is a freeze that stopping the worker
// does not lift, the way a kernel that never returns holds its step through
// SIGTERM, so that the chaos suite can check that shutdown still completes.
// It exists only with --debug-hooks, which production deployments never set.

// Bounds of a freeze's duration: a forgotten freeze ends by itself.
const (
	DefaultFreeze = 30 * time.Second
	MaxFreeze     = 10 * time.Minute
)

// freezer holds forward passes while a freeze is on.
type freezer struct {
	logger *slog.Logger

	mu     sync.Mutex
	until  time.Time     // end of the freeze in progress; zero when none
	change chan struct{} // closed (and replaced) whenever until changes
	hang   bool          // the freeze in progress outlives close
	closed bool          // the host is stopping: no more freezes
}

func newFreezer(logger *slog.Logger) *freezer {
	return &freezer{logger: logger, change: make(chan struct{})}
}

// set replaces the freeze's end and wakes the waiters so they re-read it.
// The caller holds f.mu.
func (f *freezer) set(until time.Time, hang bool) {
	f.until, f.hang = until, hang
	close(f.change)
	f.change = make(chan struct{})
}

// freeze holds forward passes for d from now, replacing any freeze in
// progress.
func (f *freezer) freeze(d time.Duration) (time.Time, error) { return f.start(d, false) }

// start begins a freeze of d; a hang (hang) is one that close does not
// lift: only thaw or d ends it.
func (f *freezer) start(d time.Duration, hang bool) (time.Time, error) {
	if d <= 0 || d > MaxFreeze {
		return time.Time{}, fmt.Errorf("for=%v: want a duration in (0, %v]", d, MaxFreeze)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return time.Time{}, svckit.ErrDraining
	}
	until := time.Now().Add(d)
	f.set(until, hang)
	return until, nil
}

// thaw ends the freeze in progress; it reports whether there was one.
func (f *freezer) thaw() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	was := time.Now().Before(f.until)
	f.set(time.Time{}, false)
	return was
}

// close thaws for good, so that stopping the scheduler never waits for a
// freeze to run out — except a hang, which stands for a step that no
// shutdown can end. It is safe on a nil freezer (hooks off).
func (f *freezer) close() {
	if f == nil {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed = true
	if !f.hang {
		f.set(time.Time{}, false)
	}
}

// remaining is how long the freeze in progress has left (0 when none).
func (f *freezer) remaining() time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	return max(time.Until(f.until), 0)
}

// wait blocks while a freeze is on.
func (f *freezer) wait() {
	for {
		f.mu.Lock()
		until, change := f.until, f.change
		f.mu.Unlock()
		d := time.Until(until)
		if d <= 0 {
			return
		}
		t := time.NewTimer(d)
		select {
		case <-change:
		case <-t.C:
		}
		t.Stop()
	}
}

// freezableModel is the model the scheduler runs when debug hooks are on:
// every forward pass first waits out a freeze.
type freezableModel struct {
	model.Model
	f *freezer
}

func (m freezableModel) Forward(tokens []int32, pos int, cache model.KVCache, logits []float32) error {
	m.f.wait()
	return m.Model.Forward(tokens, pos, cache, logits)
}

func (m freezableModel) ForwardBatch(kv *kvcache.Pool, batch []model.Chunk) error {
	m.f.wait()
	return m.Model.ForwardBatch(kv, batch)
}

// freezeState is the JSON the hook's endpoints answer with.
type freezeState struct {
	Frozen           bool    `json:"frozen"`
	RemainingSeconds float64 `json:"remaining_seconds"`
	WasFrozen        *bool   `json:"was_frozen,omitempty"`
}

// registerDebugHooks serves the freeze hook on the worker's admin listener
// (loopback by default, with /debug/requests), never its public HTTP port:
//
//	POST /debug/freeze?for=30s   hold every forward pass for the duration
//	                             (default 30s, at most 10m; a new call replaces it)
//	POST /debug/freeze?for=30s&hang=true
//	                             the same, and stopping the worker does not
//	                             lift it (a hung kernel)
//	POST /debug/unfreeze         end the freeze now
//	GET  /debug/freeze           whether a freeze is on
func (h *Host) registerDebugHooks(srv *svckit.Server) {
	f := h.freeze
	reply := func(w http.ResponseWriter, code int, v any) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		_ = json.NewEncoder(w).Encode(v)
	}
	srv.Admin.HandleFunc("POST /debug/freeze", func(w http.ResponseWriter, r *http.Request) {
		d := DefaultFreeze
		if v := r.URL.Query().Get("for"); v != "" {
			var err error
			if d, err = time.ParseDuration(v); err != nil {
				reply(w, http.StatusBadRequest, map[string]string{"error": fmt.Sprintf("for=%q: %v", v, err)})
				return
			}
		}
		hang := false
		if v := r.URL.Query().Get("hang"); v != "" {
			var err error
			if hang, err = strconv.ParseBool(v); err != nil {
				reply(w, http.StatusBadRequest, map[string]string{"error": fmt.Sprintf("hang=%q: %v", v, err)})
				return
			}
		}
		until, err := f.start(d, hang)
		if err != nil {
			code := http.StatusBadRequest
			if errors.Is(err, svckit.ErrDraining) {
				code = http.StatusServiceUnavailable
			}
			reply(w, code, map[string]string{"error": err.Error()})
			return
		}
		h.logger.Warn("debug hook: scheduler frozen; no forward step will complete",
			"for", d.String(), "until", until.Format(time.RFC3339Nano), "hang", hang)
		reply(w, http.StatusOK, freezeState{Frozen: true, RemainingSeconds: d.Seconds()})
	})
	srv.Admin.HandleFunc("POST /debug/unfreeze", func(w http.ResponseWriter, _ *http.Request) {
		was := f.thaw()
		h.logger.Warn("debug hook: scheduler thawed", "was_frozen", was)
		reply(w, http.StatusOK, freezeState{WasFrozen: &was})
	})
	srv.Admin.HandleFunc("GET /debug/freeze", func(w http.ResponseWriter, _ *http.Request) {
		rem := f.remaining()
		reply(w, http.StatusOK, freezeState{Frozen: rem > 0, RemainingSeconds: rem.Seconds()})
	})
	if !srv.Config.AdminEnabled() {
		h.logger.Warn("--debug-hooks without an admin listener (--admin-addr off): the freeze hook cannot be reached")
	}
	h.logger.Warn("debug hooks enabled (--debug-hooks): POST /debug/freeze can stall this worker; never use in production")
}

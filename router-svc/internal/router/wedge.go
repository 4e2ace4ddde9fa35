package router

// The wedge hook lets the chaos suite wedge the router's own request path
// the way a deadlock in the router would: every request that reaches the
// wedged stage stops there, holding what it holds (its limiter slot; in
// stage routing also its in-flight entry), until the wedge ends or the
// request's context does. It exists only with --debug-hooks, which
// production deployments never set (deploy's manifest check refuses it).

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"time"

	"google.golang.org/grpc/status"
)

// Bounds of a wedge's duration: a forgotten wedge ends by itself.
const (
	defaultWedge = 30 * time.Second
	maxWedge     = 10 * time.Minute
)

// wedgeStages are the stages a wedge can hold requests in.
var wedgeStages = []string{stageAdmission, stageRouting}

// wedge holds requests at one stage while it is on. A nil wedge (hooks off)
// holds nothing.
type wedge struct {
	mu     sync.Mutex
	stage  string
	until  time.Time
	change chan struct{} // closed (and replaced) whenever the wedge changes
}

func newWedge() *wedge { return &wedge{change: make(chan struct{})} }

// set replaces the wedge; the caller holds w.mu.
func (w *wedge) set(stage string, until time.Time) {
	w.stage, w.until = stage, until
	close(w.change)
	w.change = make(chan struct{})
}

// hold blocks a request at stage while a wedge on that stage is on, and
// returns the request's context error if that ends first.
func (w *wedge) hold(ctx context.Context, stage string) error {
	if w == nil {
		return nil
	}
	for {
		w.mu.Lock()
		on, until, change := w.stage == stage, w.until, w.change
		w.mu.Unlock()
		d := time.Until(until)
		if !on || d <= 0 {
			return nil
		}
		t := time.NewTimer(d)
		select {
		case <-change:
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return status.FromContextError(ctx.Err()).Err()
		}
		t.Stop()
	}
}

// wedgeState is the JSON the hook's endpoints answer with.
type wedgeState struct {
	Wedged           bool    `json:"wedged"`
	Stage            string  `json:"stage,omitempty"`
	RemainingSeconds float64 `json:"remaining_seconds"`
}

func (w *wedge) state() wedgeState {
	w.mu.Lock()
	defer w.mu.Unlock()
	rem := max(time.Until(w.until), 0)
	if rem == 0 {
		return wedgeState{}
	}
	return wedgeState{Wedged: true, Stage: w.stage, RemainingSeconds: rem.Seconds()}
}

// registerWedgeHook serves the wedge hook on mux, the router's admin
// listener (loopback by default, like /debug/workers), never its public
// HTTP port:
//
//	POST /debug/wedge?stage=admission&for=30s   hold every request reaching the
//	                                            stage (admission or routing) for
//	                                            the duration (default 30s, at most
//	                                            10m; a new call replaces it)
//	POST /debug/unwedge                         end the wedge now
//	GET  /debug/wedge                           whether a wedge is on
func (s *Service) registerWedgeHook(mux *http.ServeMux) {
	w := s.wedge
	reply := func(rw http.ResponseWriter, code int, v any) {
		rw.Header().Set("Content-Type", "application/json")
		rw.WriteHeader(code)
		_ = json.NewEncoder(rw).Encode(v)
	}
	mux.HandleFunc("POST /debug/wedge", func(rw http.ResponseWriter, r *http.Request) {
		d := defaultWedge
		if v := r.URL.Query().Get("for"); v != "" {
			var err error
			if d, err = time.ParseDuration(v); err != nil {
				reply(rw, http.StatusBadRequest, map[string]string{"error": fmt.Sprintf("for=%q: %v", v, err)})
				return
			}
		}
		if d <= 0 || d > maxWedge {
			reply(rw, http.StatusBadRequest, map[string]string{"error": fmt.Sprintf("for=%v: want a duration in (0, %v]", d, maxWedge)})
			return
		}
		stage := r.URL.Query().Get("stage")
		if stage == "" {
			stage = stageAdmission
		}
		known := false
		for _, st := range wedgeStages {
			known = known || st == stage
		}
		if !known {
			reply(rw, http.StatusBadRequest, map[string]string{"error": fmt.Sprintf("stage=%q: want one of %v", stage, wedgeStages)})
			return
		}
		w.mu.Lock()
		w.set(stage, time.Now().Add(d))
		w.mu.Unlock()
		s.logger.Warn("debug hook: request path wedged; requests reaching the stage will wait", "stage", stage, "for", d.String())
		reply(rw, http.StatusOK, w.state())
	})
	mux.HandleFunc("POST /debug/unwedge", func(rw http.ResponseWriter, _ *http.Request) {
		was := w.state().Wedged
		w.mu.Lock()
		w.set("", time.Time{})
		w.mu.Unlock()
		s.logger.Warn("debug hook: request path unwedged", "was_wedged", was)
		reply(rw, http.StatusOK, map[string]bool{"was_wedged": was})
	})
	mux.HandleFunc("GET /debug/wedge", func(rw http.ResponseWriter, _ *http.Request) {
		reply(rw, http.StatusOK, w.state())
	})
	s.logger.Warn("debug hooks enabled (--debug-hooks): POST /debug/wedge can wedge this router; never use in production")
}

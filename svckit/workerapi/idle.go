package workerapi

import (
	"context"

	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"github.com/baton-serving/baton/tracing"
)

// Idle is the Source of a worker that admits no requests yet: its load and
// request list are truthfully empty and its readiness is the server's.
type Idle struct {
	Role  batonv1.WorkerRole
	Model *batonv1.ModelInfo
	// Ready reports the server's readiness (svckit.Server.Ready).
	Ready func(ctx context.Context) map[string]string
}

// Info describes the worker.
func (w *Idle) Info() *batonv1.InfoResponse {
	v, _ := tracing.BuildVersion()
	return &batonv1.InfoResponse{Role: w.Role, Model: w.Model, Version: v}
}

// Load reports readiness and no work.
func (w *Idle) Load(ctx context.Context) *batonv1.LoadReport {
	return &batonv1.LoadReport{Ready: len(w.Ready(ctx)) == 0}
}

// Requests lists none.
func (w *Idle) Requests() []*batonv1.RequestInfo { return nil }

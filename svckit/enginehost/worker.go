package enginehost

import (
	"context"
	"flag"
	"log/slog"
	"time"

	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"github.com/baton-serving/baton/kvtransfer"
	"github.com/baton-serving/baton/svckit"
	"github.com/baton-serving/baton/svckit/workerapi"
)

// Worker is what the prefill and decode workers share: the --model flag,
// the engine flags and the two transfer timeouts both take, the Host they
// open, the KV codec of their TransferKV streams, and their start and stop.
// Each worker embeds one and adds its own RPC service, flags and checks.
type Worker struct {
	svckit.ModelBase
	Engine Flags
	// HandshakeTimeout and IdleTimeout are --handshake-timeout and
	// --transfer-idle-timeout. The names are shared, the waits are not:
	// each worker's help text says which of its waits it bounds.
	HandshakeTimeout time.Duration
	IdleTimeout      time.Duration

	Role   batonv1.WorkerRole
	Codec  *kvtransfer.Codec
	Host   *Host // set by Open
	Logger *slog.Logger
}

// NewWorker returns the unconfigured base of a worker of role.
func NewWorker(role batonv1.WorkerRole) Worker {
	return Worker{Role: role, Codec: kvtransfer.NewCodec()}
}

// TransferHelp is each worker's help for the shared transfer flags.
type TransferHelp struct {
	Handshake, Idle string
}

// AddFlags registers --model, the engine flags, --handshake-timeout and
// --transfer-idle-timeout (5s and 10s by default) with the worker's help.
func (w *Worker) AddFlags(fs *flag.FlagSet, help TransferHelp) {
	w.ModelBase.AddFlags(fs)
	w.Engine.AddFlags(fs)
	fs.DurationVar(&w.HandshakeTimeout, "handshake-timeout", 5*time.Second, help.Handshake)
	fs.DurationVar(&w.IdleTimeout, "transfer-idle-timeout", 10*time.Second, help.Idle)
}

// Open resolves and loads the model and starts the scheduler.
func (w *Worker) Open(ctx context.Context, d *svckit.Deps) error {
	if err := w.ModelBase.Open(ctx, d); err != nil {
		return err
	}
	w.Logger = d.Logger
	var err error
	if w.Host, err = Open(w.Model.Path, w.Engine, w.Role, d.Logger, d.Registry); err != nil {
		return err
	}
	// A hung step holds Close for --shutdown-timeout at most.
	w.Host.closeTimeout = d.Config.ShutdownTimeout
	return nil
}

// Register wires the host into srv and installs WorkerService; the worker
// registers its own service beside them.
func (w *Worker) Register(srv *svckit.Server) {
	w.Host.Attach(srv)
	batonv1.RegisterWorkerServiceServer(srv.GRPC, workerapi.New(w.Host).WithListeners(srv.HTTPAddr(), srv.AdminAddr()))
	srv.OnDrain(w.Host.Drain)
}

// Close stops the scheduler and unloads the model.
func (w *Worker) Close() error {
	if w.Host != nil {
		return w.Host.Close()
	}
	return nil
}

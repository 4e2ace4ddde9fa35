package enginehost

import (
	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"github.com/baton-serving/baton/svckit/tlsconf"
)

// TLSRole is the role the worker's certificate must name: with
// --tls-cert, --tls-key and --tls-ca, svckit.Main serves the worker's gRPC
// port with mutual TLS and authorizes each call by the caller's role
// (tlsconf.PolicyFor).
func (w *Worker) TLSRole() tlsconf.Role {
	if w.Role == batonv1.WorkerRole_WORKER_ROLE_PREFILL {
		return tlsconf.Prefill
	}
	return tlsconf.Decode
}

package svckit

import (
	"net/http"

	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
	"google.golang.org/protobuf/encoding/protojson"
)

// HandleDebugRequests serves GET /debug/requests: the service's in-flight
// requests (id, state, age, time since progress, pages, peer, trace id) as
// JSON, oldest first — the same list as ListRequests, for curl and scripts.
// It is on the admin listener: it names clients and their traces.
func (s *Server) HandleDebugRequests(list func() []*batonv1.RequestInfo) {
	s.Admin.HandleFunc("GET /debug/requests", func(w http.ResponseWriter, _ *http.Request) {
		b, err := protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true}.Marshal(
			&batonv1.WorkerServiceListRequestsResponse{Requests: list()})
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(b)
	})
}

package diagnose

import "time"

// Role is what a service does.
type Role string

// The roles.
const (
	RoleRouter  Role = "router"
	RolePrefill Role = "prefill"
	RoleDecode  Role = "decode"
)

// Service is one service to examine. HTTP is its HTTP base URL (metrics,
// /debug/requests, /health/ready); without it a worker is read over gRPC
// (WorkerService and gRPC health) at GRPC.
type Service struct {
	Name string `json:"name"` // "router", "prefill-0", "decode-1"
	Role Role   `json:"role"`
	HTTP string `json:"http,omitempty"`
	GRPC string `json:"grpc,omitempty"`
	// Admin is its admin listener's base URL (/debug/requests); "" reads
	// them at HTTP.
	Admin string `json:"admin,omitempty"`
	// Quarantine is why the router's canary routes around the worker, as
	// its /debug/workers said ("" when it does not, or when unknown).
	Quarantine string `json:"quarantine,omitempty"`
}

// Request is one in-flight request as a service listed it.
type Request struct {
	ID            string  `json:"request_id"`
	State         string  `json:"state"` // the RequestState name without its prefix: PREALLOC, RUNNING, ...
	AgeSeconds    float64 `json:"age_seconds"`
	SinceProgress float64 `json:"since_progress_seconds"`
	Pages         int     `json:"pages_held,omitempty"`
	Peer          string  `json:"peer,omitempty"`
	TraceID       string  `json:"trace_id,omitempty"`
	Workers       string  `json:"workers,omitempty"`
}

// Sample is one reading of a service.
type Sample struct {
	At time.Time
	// Err says why the service could not be read at all; the other fields
	// are then empty.
	Err string
	// Metrics are /metrics' values summed per name; nil when the service
	// was read over gRPC or /metrics failed.
	Metrics map[string]float64
	// Ready is the readiness result and NotReady its reasons.
	Ready    bool
	NotReady string
	// Requests are the in-flight requests; RequestsRead says whether they
	// were read (an empty list is then truthful).
	Requests     []Request
	RequestsRead bool
}

// ServiceObs is what was seen of one service.
type ServiceObs struct {
	Service
	Samples []Sample
}

// Sighting is where the probe was seen at one moment.
type Sighting struct {
	At            time.Time
	Service       string
	Role          Role
	State         string
	SinceProgress float64
}

// ProbeResult is the outcome of the probe request.
type ProbeResult struct {
	RequestID string
	TraceID   string
	Started   time.Time
	Took      time.Duration
	OK        bool
	// TimedOut: the probe's deadline passed; Code and Error describe any
	// other failure (Code is the gRPC code name when the router gave one).
	TimedOut bool
	Code     string
	Error    string
	Text     string
	Tokens   int
	// Sightings are the probe's entries in the services' request lists,
	// in time order.
	Sightings []Sighting
}

// Observation is everything diagnose collected.
type Observation struct {
	Services []ServiceObs
	Probe    *ProbeResult // nil when no probe was sent
	// Discovery notes problems finding the workers ("" if none).
	Discovery string
}

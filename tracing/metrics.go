package tracing

import (
	"runtime"
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// NewRegistry returns a Prometheus registry for one service with the process
// and Go runtime collectors and a baton_build_info gauge. Each service owns its
// registry; nothing registers with Prometheus's global default.
func NewRegistry(service string) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		collectors.NewGoCollector(),
	)
	info := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "baton_build_info",
		Help: "Always 1; labels describe the running build.",
	}, []string{"service", "version", "revision", "goversion"})
	version, revision := BuildVersion()
	info.WithLabelValues(service, version, revision, runtime.Version()).Set(1)
	reg.MustRegister(info)
	return reg
}

// BuildVersion returns the main module's version and VCS revision from the
// binary's build information ("(devel)" and "unknown" when not recorded).
func BuildVersion() (version, revision string) {
	version, revision = "(devel)", "unknown"
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return
	}
	if bi.Main.Version != "" {
		version = bi.Main.Version
	}
	for _, s := range bi.Settings {
		if s.Key == "vcs.revision" {
			revision = s.Value
		}
	}
	return
}

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
		Help: "Always 1; labels describe the running build: the main module's version, the VCS revision (-dirty: uncommitted changes) and commit time go build stamped.",
	}, []string{"service", "version", "revision", "vcs_time", "goversion"})
	l := ReadBuildLabels()
	info.WithLabelValues(service, l.Version, l.Revision, l.VCSTime, runtime.Version()).Set(1)
	reg.MustRegister(info)
	return reg
}

// BuildLabels describe a binary's build for baton_build_info.
type BuildLabels struct {
	Version  string // the main module's version; "devel" for a build from a checkout
	Revision string // vcs.revision, "-dirty" appended when vcs.modified; "unknown" when not stamped
	VCSTime  string // vcs.time (RFC 3339); "" when not stamped
}

// ReadBuildLabels returns the running binary's BuildLabels.
func ReadBuildLabels() BuildLabels {
	bi, _ := debug.ReadBuildInfo()
	return buildLabels(bi)
}

// buildLabels turns build information (nil: none) into BuildLabels. go
// build stamps the vcs.* settings only when it builds inside a checkout with
// -buildvcs on (its default, auto, when git is present); `go test` and `go
// run` do not stamp them.
func buildLabels(bi *debug.BuildInfo) BuildLabels {
	l := BuildLabels{Version: "devel", Revision: "unknown"}
	if bi == nil {
		return l
	}
	if v := bi.Main.Version; v != "" && v != "(devel)" {
		l.Version = v
	}
	dirty := false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			l.Revision = s.Value
		case "vcs.time":
			l.VCSTime = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if dirty && l.Revision != "unknown" {
		l.Revision += "-dirty"
	}
	return l
}

// BuildVersion returns the main module's version and VCS revision from the
// binary's build information (see BuildLabels).
func BuildVersion() (version, revision string) {
	l := ReadBuildLabels()
	return l.Version, l.Revision
}

package tracing

import (
	"runtime/debug"
	"testing"
)

// TestBuildLabels: baton_build_info's version and revision come from the
// module's version and the VCS stamp `go build` records (-buildvcs).
func TestBuildLabels(t *testing.T) {
	for _, c := range []struct {
		name string
		bi   *debug.BuildInfo
		want BuildLabels
	}{
		{"nil", nil, BuildLabels{Version: "devel", Revision: "unknown"}},
		{"devel, no VCS", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}},
			BuildLabels{Version: "devel", Revision: "unknown"}},
		{"tagged module", &debug.BuildInfo{Main: debug.Module{Version: "v1.4.2"}, Settings: []debug.BuildSetting{
			{Key: "vcs", Value: "git"}, {Key: "vcs.revision", Value: "77694cf0123"},
			{Key: "vcs.time", Value: "2025-05-01T10:00:00Z"}, {Key: "vcs.modified", Value: "false"}}},
			BuildLabels{Version: "v1.4.2", Revision: "77694cf0123", VCSTime: "2025-05-01T10:00:00Z"}},
		{"dirty checkout", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{
			{Key: "vcs.revision", Value: "abc123"}, {Key: "vcs.modified", Value: "true"}, {Key: "vcs.time", Value: "t"}}},
			BuildLabels{Version: "devel", Revision: "abc123-dirty", VCSTime: "t"}},
	} {
		if got := buildLabels(c.bi); got != c.want {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
	}
}

package deploy

import (
	"net"
	"strconv"
	"testing"
)

// TestAdminListenerPodLocal (issue 18, defect 9): every service's admin
// listener (BATON_ADMIN_ADDR: /debug/requests with request ids, client
// addresses and trace ids; pprof) is set explicitly to loopback, and its
// port is neither a container port nor a port of any Service, so nothing
// in the cluster reaches it (docs/deploy.md, "The admin listener").
func TestAdminListenerPodLocal(t *testing.T) {
	for _, o := range overlays {
		b := render(t, o.dir)
		ws, errs := b.Workloads()
		if len(errs) > 0 {
			t.Fatal(errs)
		}
		for _, w := range ws {
			if w.Binary == "" {
				continue // not a Baton service (Jaeger)
			}
			addr, ok := w.Env["BATON_ADMIN_ADDR"]
			if !ok {
				t.Errorf("%s/%s: BATON_ADMIN_ADDR not set: the admin listener's address should be explicit", o.dir, w.Binary)
				continue
			}
			host, port, err := net.SplitHostPort(addr)
			if ip := net.ParseIP(host); err != nil || ip == nil || !ip.IsLoopback() {
				t.Errorf("%s/%s: BATON_ADMIN_ADDR=%q, want a loopback address (%v)", o.dir, w.Binary, addr, err)
				continue
			}
			for _, p := range w.Container.Ports {
				if strconv.Itoa(int(p.ContainerPort)) == port {
					t.Errorf("%s/%s: the admin port %s is container port %q", o.dir, w.Binary, port, p.Name)
				}
			}
			for _, s := range b.Services() {
				for _, p := range s.Spec.Ports {
					if strconv.Itoa(int(p.Port)) == port || p.TargetPort.String() == port {
						t.Errorf("%s/%s: the admin port %s is in Service %s", o.dir, w.Binary, port, s.Name)
					}
				}
			}
		}
	}
}

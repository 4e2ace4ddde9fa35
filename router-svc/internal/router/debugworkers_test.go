package router

import (
	"encoding/json"
	"net"
	"net/http/httptest"
	"testing"
	"time"
)

// TestDebugWorkersListeners: /debug/workers reports each worker's HTTP and
// admin addresses from its Info, an unspecified host (a worker bound to
// all interfaces) replaced by the host the router reaches it at, so that
// batonctl diagnose can read the worker's /debug/requests.
func TestDebugWorkersListeners(t *testing.T) {
	d := startFakeDecode(t, serve)
	d.listeners.Store(&[2]string{"[::]:9001", "127.0.0.2:9002"})
	s := fleetRouter(t, 4, d)
	deadline := time.Now().Add(5 * time.Second)
	for s.decodes.Workers()[0].Info() == nil {
		if time.Now().After(deadline) {
			t.Fatal("the worker's Info never arrived")
		}
		time.Sleep(10 * time.Millisecond)
	}
	rec := httptest.NewRecorder()
	s.serveDebugWorkers(rec, httptest.NewRequest("GET", "/debug/workers", nil))
	var dw struct {
		Decode struct {
			Workers []map[string]any `json:"workers"`
		} `json:"decode"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &dw); err != nil || len(dw.Decode.Workers) != 1 {
		t.Fatalf("/debug/workers: %v\n%s", err, rec.Body)
	}
	host, _, _ := net.SplitHostPort(d.addr)
	w := dw.Decode.Workers[0]
	if w["http_addr"] != net.JoinHostPort(host, "9001") || w["admin_addr"] != "127.0.0.2:9002" {
		t.Errorf("worker http_addr %v admin_addr %v, want %s and 127.0.0.2:9002\n%s", w["http_addr"], w["admin_addr"],
			net.JoinHostPort(host, "9001"), rec.Body)
	}
}

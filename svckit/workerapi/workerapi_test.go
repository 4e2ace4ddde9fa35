package workerapi

import (
	"context"
	"testing"

	batonv1 "github.com/baton-serving/baton/gen/baton/v1"
)

// TestInfoListeners: Info reports the listeners WithListeners names, so
// the router can tell diagnose where a worker's admin listener is, and
// leaves the Source's own message untouched.
func TestInfoListeners(t *testing.T) {
	src := &Idle{Role: batonv1.WorkerRole_WORKER_ROLE_DECODE}
	info, err := New(src).WithListeners("0.0.0.0:8085", "127.0.0.1:8088").Info(context.Background(), &batonv1.InfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if info.GetHttpAddr() != "0.0.0.0:8085" || info.GetAdminAddr() != "127.0.0.1:8088" || info.GetRole() != src.Role {
		t.Errorf("Info %v, want the role with http_addr 0.0.0.0:8085 and admin_addr 127.0.0.1:8088", info)
	}
	plain, _ := New(src).Info(context.Background(), &batonv1.InfoRequest{})
	if plain.GetHttpAddr() != "" || plain.GetAdminAddr() != "" {
		t.Errorf("Info without listeners %v, want no addresses", plain)
	}
}

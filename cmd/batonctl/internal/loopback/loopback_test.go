package loopback

import (
	"net"
	"strconv"
	"testing"
)

func TestRouterAddressesFollowTheDefaults(t *testing.T) {
	for addr, port := range map[string]int{RouterHTTP: PortBase, RouterGRPC: PortBase + 1} {
		if want := net.JoinHostPort(Host, strconv.Itoa(port)); addr != want {
			t.Errorf("%s, want %s", addr, want)
		}
	}
}

// Package loopback holds the addresses of the deployment `batonctl up`
// starts by default, which every client command (generate, bench,
// diagnose) takes as its default router, so that each works against a
// local `batonctl up` without flags.
package loopback

// Host and PortBase are `batonctl up`'s defaults for --host and --port-base.
const (
	Host     = "127.0.0.1"
	PortBase = 8080
)

// The router's addresses under those defaults: HTTP on the base port, gRPC
// on the next (see up.Layout).
const (
	RouterHTTP = "127.0.0.1:8080"
	RouterGRPC = "127.0.0.1:8081"
)

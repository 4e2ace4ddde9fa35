// Package svckit is what every Baton service shares: command-line flags with
// environment overrides, structured logging, the gRPC and HTTP servers with
// health, readiness, metrics and reflection, graceful shutdown, and the one
// table that maps engine errors to gRPC status codes.
//
// A service's main is a single call:
//
//	func main() { os.Exit(svckit.Main(os.Args[1:], os.Stderr, spec)) }
//
// where spec names the service, adds its flags and registers its gRPC
// services on the Server.
package svckit

// Package svckit is what every Baton service shares: command-line flags with
// environment overrides, structured logging, the gRPC and HTTP servers with
// health, readiness, metrics and reflection, graceful shutdown, and the one
// table that maps engine errors to gRPC status codes.
//
// A service implements Service (its flags, Open, Register and Close), and
// its main is a single call to Main, as router-svc's is:
//
//	func main() {
//		os.Exit(svckit.Main(os.Args[1:], os.Stderr, svckit.Spec{
//			Name:     "router-svc",
//			Summary:  "Baton router",
//			Defaults: svckit.Config{GRPCAddr: "127.0.0.1:8081", HTTPAddr: "127.0.0.1:8080", AdminAddr: "127.0.0.1:8086"},
//		}, router.New()))
//	}
//
// where the Spec names the service and its default addresses, and the
// Service registers its gRPC services, HTTP handlers and readiness checks on
// the Server that Main passes to Register.
package svckit

// Command router-svc is Baton's router: the public gRPC, REST and
// OpenAI-compatible API in front of prefill and decode workers.
package main

import (
	"os"

	"github.com/baton-serving/baton/router-svc/internal/router"
	"github.com/baton-serving/baton/svckit"
)

func main() { os.Exit(run()) }

func run() int {
	return svckit.Main(os.Args[1:], os.Stderr, svckit.Spec{
		Name:     "router-svc",
		Summary:  "Baton router",
		Defaults: svckit.Config{GRPCAddr: "127.0.0.1:8081", HTTPAddr: "127.0.0.1:8080", AdminAddr: "127.0.0.1:8086"},
	}, router.New())
}

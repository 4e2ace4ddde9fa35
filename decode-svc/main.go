// Command decode-svc is Baton's decode worker: it reserves KV cache pages,
// pulls prompts' KV caches from prefill workers and generates tokens.
package main

import (
	"os"

	"github.com/baton-serving/baton/decode-svc/internal/decode"
	"github.com/baton-serving/baton/svckit"
)

func main() { os.Exit(run()) }

func run() int {
	return svckit.Main(os.Args[1:], os.Stderr, svckit.Spec{
		Name:     "decode-svc",
		Summary:  "Baton decode worker",
		Defaults: svckit.Config{GRPCAddr: "127.0.0.1:8084", HTTPAddr: "127.0.0.1:8085", AdminAddr: "127.0.0.1:8088"},
	}, decode.New())
}

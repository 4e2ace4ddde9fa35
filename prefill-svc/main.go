// Command prefill-svc is Baton's prefill worker: it computes prompts' KV
// caches and streams them to decode workers over PrefillService.TransferKV.
package main

import (
	"os"

	"github.com/baton-serving/baton/prefill-svc/prefill"
	"github.com/baton-serving/baton/svckit"
)

func main() { os.Exit(run()) }

func run() int {
	return svckit.Main(os.Args[1:], os.Stderr, svckit.Spec{
		Name:     "prefill-svc",
		Summary:  "Baton prefill worker",
		Defaults: svckit.Config{GRPCAddr: "127.0.0.1:8082", HTTPAddr: "127.0.0.1:8083", AdminAddr: "127.0.0.1:8087"},
	}, prefill.New())
}

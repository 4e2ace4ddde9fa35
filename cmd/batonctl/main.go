// Command batonctl is Baton's operator tool: it runs a model locally, launches
// the three services, and (as later commands land) generates through a router,
// benchmarks and diagnoses a deployment.
package main

import (
	"os"

	"github.com/baton-serving/baton/cmd/batonctl/internal/cli"
)

func main() { os.Exit(cli.Main(os.Args[1:], os.Stdout, os.Stderr)) }

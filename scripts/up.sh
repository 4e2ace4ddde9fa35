#!/usr/bin/env bash
# Builds Baton and starts the router, a prefill worker and a decode worker on
# loopback (ports 8080-8085 by default) on the default model, sends a demo
# request through them and keeps them running until Ctrl-C.
# Extra arguments go to `batonctl up` (e.g. --port-base 18080 --model PATH).
set -euo pipefail
cd "$(dirname "$0")/.."
go build -o bin/ ./cmd/batonctl ./router-svc ./prefill-svc ./decode-svc
exec bin/batonctl up --demo "Once upon a time" "$@"

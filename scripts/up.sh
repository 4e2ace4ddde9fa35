#!/usr/bin/env bash
# Builds Baton and starts the router, a prefill worker and a decode worker on
# loopback (ports 8080-8085 by default) on the default model, sends a demo
# request through them and keeps them running until Ctrl-C.
# Extra arguments go to `batonctl up` (e.g. --port-base 18080 --model PATH).
set -euo pipefail
cd "$(dirname "$0")/.."
# NVIDIA's nvml.h marks functions deprecated that go-nvml (GPU metrics)
# still binds, so gcc prints ~100 harmless warnings on a cold build; keep
# Go's default flags and silence only those.
export CGO_CFLAGS="${CGO_CFLAGS:--O2 -g} -Wno-deprecated-declarations"
go build -o bin/ ./cmd/batonctl ./router-svc ./prefill-svc ./decode-svc
exec bin/batonctl up --demo "Once upon a time" "$@"

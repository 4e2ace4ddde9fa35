#!/usr/bin/env bash
# Runs every check Baton's CI runs, in order. Needs Go and gcc; everything
# else (buf, protoc plugins) is built from the pinned tools module.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.bin:$PATH"
# NVML's header marks functions go-nvml wraps as deprecated; the warnings
# from compiling its cgo preamble are noise (scripts/up.sh does the same).
export CGO_CFLAGS="${CGO_CFLAGS:--O2 -g} -Wno-deprecated-declarations"

step() { printf '\n== %s\n' "$*"; }
# Every module of the workspace, as package patterns.
mapfile -t pkgs < <(go list -m -f '{{.Dir}}/...')

step "codegen tools"
scripts/tools.sh

step "buf lint"
buf lint

step "buf generate is reproducible and gen/ is fresh"
scripts/generate.sh --check

step "avo is reproducible and kernels/vec's generated assembly is fresh"
scripts/gen-asm.sh --check

step "gofmt"
unformatted=$(gofmt -l $(git ls-files '*.go'))
if [[ -n "$unformatted" ]]; then
  echo "not gofmt-clean:" >&2
  echo "$unformatted" >&2
  exit 1
fi

step "go vet"
go vet "${pkgs[@]}"
go vet -tags e2e ./tests/...
go vet -tags e2e,chaos ./tests/...

step "go test -race"
go test -race -count=1 "${pkgs[@]}"

step "llama.cpp goldens under every vec implementation this CPU has (the -race run checks only the preferred one)"
go test -count=1 -run '^TestGoldenArch$' ./engine/model

step "kernels, pure-Go build (the fallback every fast path is checked against)"
go test -count=1 -tags purego ./kernels/...

step "CUDA build and backend on the CPU emulation: no GPU here (scripts/cuda-check.sh)"
# Installs the CUDA toolkit (Debian non-free), checks the PTX is fresh,
# builds the services with -tags cuda, runs kernels.cu's tests and the CUDA
# backend's Go tests on an emulated driver, and serves a PD request with
# --device cuda on it (golden). A real GPU runs scripts/device-check.sh.
if [[ ${BATON_SKIP_CUDA:-} == 1 ]]; then
  echo "BATON_SKIP_CUDA=1: only kernels.cu's own tests"
  kernels/cuda/emu/run.sh --kernels-only
else
  scripts/cuda-check.sh
fi

step "fuzz (bounded)"
# Bounded by executions, not seconds: with -fuzztime=Ns the fuzzer can stop
# mid-minimization and report "context deadline exceeded" although nothing
# failed. A few tens of thousands of executions take 5-30 s here.
fuzz() { # package target executions
  local listed
  listed=$(go test -list "^$2\$" "$1")
  if ! grep -qx "$2" <<<"$listed"; then
    echo "fuzz target $2 not found in $1" >&2
    exit 1
  fi
  go test -run='^$' -fuzz="^$2\$" -fuzztime="$3x" -fuzzminimizetime=10s "$1"
}
fuzz ./engine/gguf FuzzOpen 400000
fuzz ./engine/model FuzzLoad 30000
fuzz ./engine/tokenizer FuzzEncode 15000
fuzz ./engine/sample FuzzStopper 200000
fuzz ./engine/grammar FuzzParse 300000
fuzz ./engine/grammar FuzzMatch 150000
fuzz ./engine/jsonschema FuzzToGrammar 150000
fuzz ./router-svc/internal/openai FuzzParseToolCalls 50000

step "jaeger (pinned in tools/jaeger, built once into .bin/)"
# A cold build takes ~6.5 min on 2 cores; the binary is reused while
# tools/jaeger/go.mod and go.sum are unchanged.
jaeger_stamp=$(cat tools/jaeger/go.mod tools/jaeger/go.sum | sha256sum | cut -d' ' -f1)
if [[ ! -x .bin/jaeger || "$(cat .bin/jaeger.stamp 2>/dev/null)" != "$jaeger_stamp" ]]; then
  GOWORK=off go -C tools/jaeger build -o ../../.bin/ tool
  echo "$jaeger_stamp" >.bin/jaeger.stamp
fi

step "end-to-end (real binaries, traces checked in a real Jaeger)"
# listening PORT: whether something accepts connections on 127.0.0.1:PORT.
listening() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
# Ports nothing listens on now (the machine may be shared), unless set.
for var in JAEGER_OTLP_GRPC_PORT JAEGER_OTLP_HTTP_PORT JAEGER_QUERY_PORT JAEGER_QUERY_GRPC_PORT JAEGER_HEALTH_PORT; do
  if [[ -z "${!var:-}" ]]; then
    for port in $(shuf -i 20000-60000 -n 50); do
      listening "$port" || { export "$var=$port"; break; }
    done
  fi
done
jaeger_log=$(mktemp)
.bin/jaeger --config tools/jaeger/config.yaml >"$jaeger_log" 2>&1 &
jaeger_pid=$!
stop_jaeger() {
  local rc=$?
  kill "$jaeger_pid" 2>/dev/null || true
  wait "$jaeger_pid" 2>/dev/null || true
  if [[ $rc -ne 0 ]]; then
    echo "jaeger's log:" >&2
    tail -n 50 "$jaeger_log" >&2
  fi
  rm -f "$jaeger_log"
}
# Jaeger is stopped however this script ends: tests failing, ^C, SIGTERM
# (bash runs the trap once the command in the foreground has returned; a
# CI cancel signals the whole process group, go test included).
trap stop_jaeger EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
for _ in $(seq 100); do
  listening "$JAEGER_QUERY_PORT" && listening "$JAEGER_OTLP_GRPC_PORT" && break
  kill -0 "$jaeger_pid" 2>/dev/null || { echo "jaeger exited at start" >&2; exit 1; }
  sleep 0.1
done
listening "$JAEGER_QUERY_PORT" || { echo "jaeger not listening after 10 s" >&2; exit 1; }
export BATON_JAEGER_QUERY="http://127.0.0.1:$JAEGER_QUERY_PORT"
export BATON_JAEGER_OTLP="http://127.0.0.1:$JAEGER_OTLP_GRPC_PORT"
# The official openai npm package for TestOpenAISDK (tests/sdk), exactly
# as tests/sdk/package-lock.json pins it.
npm ci --prefix tests/sdk --no-audit --no-fund
go test -tags e2e -count=1 -v ./tests/...

# The whole suite again with mutual TLS between the services
# (BATON_E2E_TLS=1: every service gets its role's certificate from
# batonctl certs, batonctl up gets --tls). About a minute on 2 cores.
step "e2e suite with mutual TLS between the services (BATON_E2E_TLS=1)"
BATON_E2E_TLS=1 go test -tags e2e -count=1 -v ./tests/...

step "chaos suite (kill -9, black holes, stalls, cancel storms, slow clients, restarts)"
go test -tags e2e,chaos -count=1 -timeout 15m -run '^TestChaos' -v ./tests/...

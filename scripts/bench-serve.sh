#!/usr/bin/env bash
# The serving comparison of issue 22 (docs/benchmarks.md, "Serving against
# llama-server"): a closed loop of --concurrency clients, 128-token
# prompts, 64 tokens out, ignore_eos, temperature 0.8, on the 110M F32
# shape, through one client program for every server (batonctl bench
# --backend openai, streamed completions):
#
#   colocated-B   Baton, router --prefill local over one decode-svc whose
#                 forward steps hold at most B tokens (--max-batch-tokens),
#                 one run per B of --budgets: the chunked-prefill budget's
#                 TTFT/TPOT trade-off
#   pd            Baton, prefill-svc and decode-svc on the same cores
#   llama-server  llama.cpp's server, -np C slots, flash attention off
#   llama-server-fa  the same with -fa
#
# The llama-server configurations run when --llama-server or $LLAMA_SERVER
# names the binary (docs/toolchain.md: building llama.cpp). Run it on a
# quiet machine, all configurations in one sitting.
#
# Usage: scripts/bench-serve.sh [--out DIR] [--llama-server PATH]
#          [--budgets "128 256 512 1024"] [--concurrency 16]
#          [--num-prompts 48] [--configs "colocated pd llama-server llama-server-fa"]
#          [--port-base P] [--quick]
set -euo pipefail
cd "$(dirname "$0")/.."

OUT="" LLAMA_SERVER=${LLAMA_SERVER:-} BUDGETS="128 256 512 1024" CONC=16 N=48 PORT_BASE=18900 QUICK=0
CONFIGS="colocated pd llama-server llama-server-fa"
while [[ $# -gt 0 ]]; do
  case $1 in
    --out) OUT=$2; shift 2 ;;
    --llama-server) LLAMA_SERVER=$2; shift 2 ;;
    --budgets) BUDGETS=$2; shift 2 ;;
    --concurrency) CONC=$2; shift 2 ;;
    --num-prompts) N=$2; shift 2 ;;
    --configs) CONFIGS=$2; shift 2 ;;
    --port-base) PORT_BASE=$2; shift 2 ;;
    --quick) QUICK=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench-serve: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
if [[ -z $LLAMA_SERVER ]]; then
  CONFIGS=${CONFIGS//llama-server-fa/}
  CONFIGS=${CONFIGS//llama-server/}
fi
IN=128 OUTLEN=64 WARM=2
[[ $QUICK == 1 ]] && IN=16 OUTLEN=8 N=4 WARM=1 BUDGETS=${BUDGETS%% *}
OUT=${OUT:-results/bench-serve-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
command -v curl >/dev/null || { echo "bench-serve: curl is needed to wait for readiness" >&2; exit 1; }

BIN=$OUT/bin
echo "== building into $BIN"
go build -o "$BIN/" ./cmd/batonctl ./router-svc ./prefill-svc ./decode-svc
BATONCTL=$BIN/batonctl
MODEL=${BATON_BENCH_110M_2K:-$OUT/models/llama-110m-f32-2k.gguf}
if [[ ! -f $MODEL ]]; then
  mkdir -p "$(dirname "$MODEL")"
  "$BATONCTL" gen-model --preset llama-110m --type f32 --context 2048 --out "$MODEL"
fi

{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (with local changes)')"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2- | sed 's/^ //') × $(nproc)"
  echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null)"
  echo "llama-server: ${LLAMA_SERVER:-none}"
  echo "quick: $QUICK; configs: $CONFIGS; budgets: $BUDGETS; concurrency: $CONC; requests: $N"
} > "$OUT/machine.txt"

PIDS=()
stop_config() {
  local pid
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  PIDS=()
}
trap stop_config EXIT

RH=127.0.0.1:$PORT_BASE RG=127.0.0.1:$((PORT_BASE + 1))
PG=127.0.0.1:$((PORT_BASE + 2)) PH=127.0.0.1:$((PORT_BASE + 3))
DG=127.0.0.1:$((PORT_BASE + 4)) DH=127.0.0.1:$((PORT_BASE + 5))
RA=127.0.0.1:$((PORT_BASE + 6)) PA=127.0.0.1:$((PORT_BASE + 7)) DA=127.0.0.1:$((PORT_BASE + 8))
# llama-server's own port: it cannot bind one that Baton's router left in
# TIME-WAIT.
LS=127.0.0.1:$((PORT_BASE + 9))

wait_ready() { # URL LOG
  local i pid
  for i in $(seq 1 600); do
    curl -sf -o /dev/null "$1" && return 0
    for pid in "${PIDS[@]}"; do
      kill -0 "$pid" 2>/dev/null || { echo "bench-serve: a service exited; see $2" >&2; tail -5 "$2" >&2; exit 1; }
    done
    sleep 0.2
  done
  echo "bench-serve: $1 not ready after 120 s; see $2" >&2
  exit 1
}

start_config() { # CONFIG LOG
  local cfg=$1 log=$2
  local common=(--model "$MODEL" --log-level warn --context-length 2048)
  local worker=("${common[@]}" --kv-cache-bytes 1GiB)
  case $cfg in
    pd)
      "$BIN/prefill-svc" --grpc-addr "$PG" --http-addr "$PH" --admin-addr "$PA" "${worker[@]}" >>"$log" 2>&1 &
      PIDS+=($!)
      "$BIN/decode-svc" --grpc-addr "$DG" --http-addr "$DH" --admin-addr "$DA" "${worker[@]}" >>"$log" 2>&1 &
      PIDS+=($!)
      "$BIN/router-svc" --grpc-addr "$RG" --http-addr "$RH" --admin-addr "$RA" --prefill "$PG" --decode "$DG" "${common[@]}" >>"$log" 2>&1 &
      PIDS+=($!)
      wait_ready "http://$RH/health/ready" "$log" ;;
    colocated-*)
      "$BIN/decode-svc" --grpc-addr "$DG" --http-addr "$DH" --admin-addr "$DA" "${worker[@]}" --max-batch-tokens "${cfg#colocated-}" >>"$log" 2>&1 &
      PIDS+=($!)
      "$BIN/router-svc" --grpc-addr "$RG" --http-addr "$RH" --admin-addr "$RA" --prefill local --decode "$DG" "${common[@]}" >>"$log" 2>&1 &
      PIDS+=($!)
      wait_ready "http://$RH/health/ready" "$log" ;;
    llama-server|llama-server-fa)
      local fa=()
      [[ $cfg == llama-server-fa ]] && fa=(-fa)
      # One slot per client, each with a whole request's context.
      "$LLAMA_SERVER" -m "$MODEL" -t "$(nproc)" -np "$CONC" -c $((CONC * 256)) "${fa[@]}" --host 127.0.0.1 --port "${LS#*:}" >>"$log" 2>&1 &
      PIDS+=($!)
      wait_ready "http://$LS/health" "$log" ;;
    *) echo "bench-serve: unknown configuration $cfg" >&2; exit 2 ;;
  esac
}

runs=()
for cfg in $CONFIGS; do
  if [[ $cfg == colocated ]]; then
    for b in $BUDGETS; do runs+=("colocated-$b"); done
  else
    runs+=("$cfg")
  fi
done
for cfg in "${runs[@]}"; do
  echo "== $cfg"
  start_config "$cfg" "$OUT/$cfg.log"
  router=$RH
  [[ $cfg == llama-server* ]] && router=$LS
  "$BATONCTL" bench --backend openai --router "$router" --model "$MODEL" --label "$cfg" --seed 1 \
    --request-rate inf --max-concurrency "$CONC" --num-prompts "$N" --warmup "$WARM" \
    --random-input-len "$IN" --random-output-len "$OUTLEN" --ignore-eos --temperature 0.8 \
    --output "$OUT/$cfg.json" | tee "$OUT/$cfg.txt"
  stop_config
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null)" >> "$OUT/machine.txt"

if command -v jq >/dev/null; then
  {
    echo "| config | output tok/s | req/s | TTFT p50 ms | TTFT p99 ms | TPOT p50 ms | ITL p99 ms | failed |"
    echo "| --- | --- | --- | --- | --- | --- | --- | --- |"
    for cfg in "${runs[@]}"; do
      f=$OUT/$cfg.json
      [[ -f $f ]] || continue
      jq -r --arg cfg "$cfg" '.runs[0] | "| \($cfg) | \(.output_throughput*10|floor/10) | \(.request_throughput*100|floor/100) | \(.ttft.median_ms|floor) | \(.ttft.p99_ms|floor) | \(.tpot.median_ms*10|floor/10) | \(.itl.p99_ms|floor) | \(.failed) |"' "$f"
    done
  } > "$OUT/summary.md"
  cat "$OUT/summary.md"
fi

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
# shellcheck source=lib/bench.sh
. scripts/lib/bench.sh
bench_init bench-serve "quick: $QUICK; configs: $CONFIGS; budgets: $BUDGETS; concurrency: $CONC; requests: $N"
bench_ports "$PORT_BASE"

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
bench_done

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

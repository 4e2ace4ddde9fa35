#!/usr/bin/env bash
# The prefix-cache benchmarks of docs/benchmarks.md ("Prefix reuse"): Baton
# with its prefix cache on and off, colocated and PD, beside llama-server
# with its prompt cache (cache_prompt, on by default), on the 110M F32 shape
# with a 2048-token context, side by side in one sitting:
#
#   shared-prefix  prompts sharing a 1,024-token prefix and differing in a
#                  32-token suffix, one at a time (TTFT is the prompt's
#                  compute, not queueing)
#   multi-turn     8 conversations of 6 turns (512-token system prompts,
#                  32-token messages and answers, 200 ms think time): cache
#                  hit rate, KV bytes transferred per turn, TTFT
#
# Every run writes its JSON (bench --output) and table under the results
# directory, and summary.md gathers TTFT p50, hit rates and KV bytes (needs
# jq). Run it on a quiet machine.
#
# Usage: scripts/bench-prefix.sh [--out DIR] [--configs "..."] [--workloads "..."]
#          [--llama-server PATH] [--port-base P] [--quick]
#
#   --out DIR          results (default results/bench-prefix-DATE)
#   --configs          colocated-cache colocated-nocache pd-cache pd-nocache
#                      colocated-cache-openai llama-server (default: all;
#                      llama-server only when --llama-server or
#                      $LLAMA_SERVER names the binary). Baton's configs are
#                      measured over gRPC (which reports KV bytes per
#                      request); colocated-cache-openai is colocated-cache
#                      through the OpenAI API, the client llama-server gets
#   --workloads        shared-prefix multi-turn (default both)
#   --llama-server P   llama.cpp's llama-server binary
#   --port-base P      ports P to P+9 (default 18800)
#   --quick            a few requests each: checks the script only
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

OUT="" CONFIGS="colocated-cache colocated-nocache pd-cache pd-nocache colocated-cache-openai llama-server" WORKLOADS="shared-prefix multi-turn"
LLAMA_SERVER=${LLAMA_SERVER:-} PORT_BASE=18800 QUICK=0
while [[ $# -gt 0 ]]; do
  case $1 in
    --out) OUT=$2; shift 2 ;;
    --configs) CONFIGS=$2; shift 2 ;;
    --workloads) WORKLOADS=$2; shift 2 ;;
    --llama-server) LLAMA_SERVER=$2; shift 2 ;;
    --port-base) PORT_BASE=$2; shift 2 ;;
    --quick) QUICK=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench-prefix: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
if [[ -z $LLAMA_SERVER ]]; then
  CONFIGS=${CONFIGS//llama-server/}
fi
# shellcheck source=lib/bench.sh
. scripts/lib/bench.sh
bench_init bench-prefix "quick: $QUICK; configs: $CONFIGS; workloads: $WORKLOADS"
bench_ports "$PORT_BASE"

start_config() { # CONFIG LOG
  local cfg=${1%-openai} log=$2 cache
  case $cfg in *-nocache) cache=false ;; *) cache=true ;; esac
  local common=(--model "$MODEL" --log-level warn --context-length 2048)
  local worker=("${common[@]}" --kv-cache-bytes 1GiB --prefix-cache="$cache")
  case $cfg in
    pd-*)
      "$BIN/prefill-svc" --grpc-addr "$PG" --http-addr "$PH" --admin-addr "$PA" "${worker[@]}" >>"$log" 2>&1 &
      PIDS+=($!)
      "$BIN/decode-svc" --grpc-addr "$DG" --http-addr "$DH" --admin-addr "$DA" "${worker[@]}" >>"$log" 2>&1 &
      PIDS+=($!)
      "$BIN/router-svc" --grpc-addr "$RG" --http-addr "$RH" --admin-addr "$RA" --prefill "$PG" --decode "$DG" "${common[@]}" >>"$log" 2>&1 &
      PIDS+=($!)
      wait_ready "http://$RH/health/ready" "$log" ;;
    colocated-*)
      "$BIN/decode-svc" --grpc-addr "$DG" --http-addr "$DH" --admin-addr "$DA" "${worker[@]}" >>"$log" 2>&1 &
      PIDS+=($!)
      "$BIN/router-svc" --grpc-addr "$RG" --http-addr "$RH" --admin-addr "$RA" --prefill local --decode "$DG" "${common[@]}" >>"$log" 2>&1 &
      PIDS+=($!)
      wait_ready "http://$RH/health/ready" "$log" ;;
    llama-server)
      # One slot per conversation, each with the whole context.
      "$LLAMA_SERVER" -m "$MODEL" -t "$(nproc)" -np 8 -c $((8 * 2048)) --host 127.0.0.1 --port "${LS#*:}" >>"$log" 2>&1 &
      PIDS+=($!)
      wait_ready "http://$LS/health" "$log" ;;
    *) echo "bench-prefix: unknown configuration $cfg" >&2; exit 2 ;;
  esac
}

# NAME|bench flags
workload_flags() {
  local n=12 turns=6
  [[ $QUICK == 1 ]] && n=2 turns=2
  case $1 in
    shared-prefix) echo "--dataset shared-prefix --num-groups 1 --prefix-len 1024 --random-input-len 32 --random-output-len 8 --num-prompts $n --max-concurrency 1 --warmup 1" ;;
    multi-turn) echo "--dataset multi-turn --num-conversations 8 --num-turns $turns --prefix-len 512 --random-input-len 32 --random-output-len 32 --think-time 200ms --warmup 1" ;;
    *) echo "bench-prefix: unknown workload $1" >&2; exit 2 ;;
  esac
}

for cfg in $CONFIGS; do
  echo "== $cfg"
  start_config "$cfg" "$OUT/$cfg.log"
  for wl in $WORKLOADS; do
    backend=(--backend grpc --router "$RG")
    [[ $cfg == *-openai ]] && backend=(--backend openai --router "$RH")
    [[ $cfg == llama-server ]] && backend=(--backend openai --router "$LS")
    # shellcheck disable=SC2046
    "$BATONCTL" bench "${backend[@]}" --model "$MODEL" --ignore-eos --seed 7 --label "$cfg" \
      $(workload_flags "$wl") --output "$OUT/$wl-$cfg.json" | tee "$OUT/$wl-$cfg.txt"
  done
  stop_config
done
bench_done

if command -v jq >/dev/null; then
  {
    echo "| workload | config | TTFT p50 ms | TTFT p99 ms | output tok/s | cache hit rate | KV bytes / request |"
    echo "| --- | --- | --- | --- | --- | --- | --- |"
    for wl in $WORKLOADS; do
      for cfg in $CONFIGS; do
        f=$OUT/$wl-$cfg.json
        [[ -f $f ]] || continue
        jq -r --arg wl "$wl" --arg cfg "$cfg" '.runs[0] | "| \($wl) | \($cfg) | \(.ttft.median_ms|floor) | \(.ttft.p99_ms|floor) | \(.output_throughput*10|floor/10) | \(.cache_hit_rate*1000|floor/10)% | \(if .kv_transfer_bytes_per_request == null then "—" else (.kv_transfer_bytes_per_request|floor) end) |"' "$f"
      done
    done
  } > "$OUT/summary.md"
  cat "$OUT/summary.md"
fi
echo "results in $OUT"
